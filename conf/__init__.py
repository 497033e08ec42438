# Makes conf/ importable as specdepth.conf so installed (non-editable) copies find their configs.
