"""Per-request state: named float fields that follow rows through admission and retirement."""
from __future__ import annotations

import numpy as np

from . import kernels
from .kernels import _F64, _I64

COMPILED = True   # align's row matching compiled (kernels.align_rows); False: its numpy form (equal)


class Rows:
    """One step's per-request state, row-aligned with the batch: each field a column (`rows.accepted`, a writable
    view of `rows.array`, [batch, fields])."""

    __slots__ = ("array",)
    fields: tuple[str, ...] = ()

    def __init__(self, array: np.ndarray):
        self.array = array

    def __len__(self) -> int:
        return self.array.shape[0]


def _column(i: int) -> property:
    def get(rows):
        return rows.array[:, i]

    def put(rows, value):
        rows.array[:, i] = value

    return property(get, put)


class PerRequest:
    """Per-request float fields that follow `view.request_ids` (rows come and go between steps):

        st = PerRequest(accepted=0.0, rejected=0.0)   # the fields and the value a new request starts at
        rows = st.align(view.request_ids)             # rows.accepted: [batch], writable in place
    Rows of requests never seen before start at the fields' initial values; requests that left the batch are
    dropped. `align` returns the same object until the ids change; `top`: the largest of the ids aligned (-1 for
    none; None where the numpy form aligned them). `reuse` (default off): a change of ids writes into the rows the
    change before it left (and their table), kept while the batch's size holds, instead of new ones: for a caller
    that holds only the latest rows."""

    reuse = False

    def __init__(self, **fields: float):
        if not fields:
            raise ValueError("PerRequest needs at least one field")
        self.fields = tuple(fields)
        self.init = np.array([float(v) for v in fields.values()])
        names = {f: _column(i) for i, f in enumerate(self.fields)}
        self._rows = type("Rows", (Rows,), {"__slots__": (), "fields": self.fields, **names})
        self.reset()

    def reset(self) -> None:
        self.ids = np.empty(0, np.int64)
        self.rows = self._rows(np.empty((0, self.init.size)))
        self._spare = None   # `reuse`: the rows and ids the last change of ids left
        self.top = -1

    def align(self, ids: np.ndarray) -> Rows:
        """The fields, row-aligned with `ids`."""
        native = (ids.dtype is _I64 or ids.dtype == np.int64) and ids.ndim == 1
        if ids.shape == self.ids.shape:
            if native:   # the same values, compared as bytes (np.array_equal's per-call cost is most of an
                if ids.tobytes() == self.ids.tobytes():   # unchanged step's align)
                    return self.rows
            elif np.array_equal(ids, self.ids):
                return self.rows
        old = self.rows.array
        if COMPILED and native and (old.dtype is _F64 or old.dtype == np.float64) and old.ndim == 2:
            spare = self._spare
            if spare is None or spare[1].size != ids.size:
                spare = (self._rows(np.empty((ids.size, self.init.size))), np.empty(ids.size, np.int64))
            self.top = kernels.align_rows(self.ids, old, ids, self.init, spare[0].array, spare[1])
            self._spare = (self.rows, self.ids) if self.reuse else None
            self.rows, self.ids = spare
            return self.rows
        new = np.empty((ids.size, self.init.size))
        new[:] = self.init   # np.tile's rows, without its overhead
        if self.ids.size:
            order = np.argsort(self.ids, kind="stable")
            sorted_ids = self.ids[order]
            at = np.minimum(np.searchsorted(sorted_ids, ids), sorted_ids.size - 1)
            found = sorted_ids[at] == ids
            new[found] = old[order[at[found]]]
        self.ids, self.rows, self._spare, self.top = np.array(ids, np.int64), self._rows(new), None, None
        return self.rows
