import numpy as np

from specdepth.errors import ConfigError, as_int
from specdepth.policy import Policy

from .kit import fit_token_cap


class BatchTable(Policy):
    """vLLM V1 dynamic speculation (`num_speculative_tokens_per_batch_size`): a user table of
    [start_bs, end_bs, k] rows (inclusive batch-size ranges); the running batch size picks k for every
    sequence. Batch sizes no row covers get `default` (0 = speculation off)."""

    name = "batch_table"

    def __init__(self, table=((1, 8, 4), (9, 32, 3), (33, 128, 2), (129, 1 << 30, 0)), default: int = 0):
        rows = []
        try:
            items = [list(r) for r in table]
        except TypeError:
            raise ConfigError(f"policy.table must be a list of [start_bs, end_bs, k], got {table!r}") from None
        if not items:
            raise ConfigError("policy.table is empty: give at least one [start_bs, end_bs, k] row "
                              "(policy=none runs without speculation)")
        for i, r in enumerate(items):
            if len(r) != 3:
                raise ConfigError(f"policy.table[{i}] must be [start_bs, end_bs, k], got {r!r}")
            lo = as_int(r[0], f"policy.table[{i}][0]", min=1)
            hi = as_int(r[1], f"policy.table[{i}][1]", min=lo)
            k = as_int(r[2], f"policy.table[{i}][2]", min=0)
            rows.append((lo, hi, k))
        rows.sort()
        for (lo1, hi1, _), (lo2, _, _) in zip(rows, rows[1:]):
            if lo2 <= hi1:
                raise ConfigError(f"policy.table: batch-size ranges overlap ([{lo1}, {hi1}] and one starting at {lo2})")
        self.table = [list(r) for r in rows]
        self.default = as_int(default, "policy.default", min=0)

    def depth_bound(self):
        return "table", max([k for _, _, k in self.table] + [self.default])

    def depth_for(self, batch_size: int) -> int:
        for lo, hi, k in self.table:
            if lo <= batch_size <= hi:
                return k
        return self.default

    def plan(self, view):
        k = min(self.depth_for(view.batch_size), view.max_depth)
        return fit_token_cap(np.full(view.batch_size, k, dtype=np.int64), view)

    @property
    def label(self):
        return self.name   # the table is too long for a label; it is in config.yaml
