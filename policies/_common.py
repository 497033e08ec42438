"""Deprecated: the helpers moved to the public policy kit, `specdepth.policies.kit`. This alias re-exports them for
one release and warns on import."""
import warnings

from .kit import *  # noqa: F401,F403
from .kit import __all__  # noqa: F401

warnings.warn("specdepth.policies._common is deprecated: import from specdepth.policies.kit", DeprecationWarning,
              stacklevel=2)
