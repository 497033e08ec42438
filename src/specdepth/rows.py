"""The running batch's per-row state: one table that owns row order and retirement.

Row i is one running sequence, the same sequence in every column. The engine, the executor and the
acceptance model each declare their columns on the run's one `RowTable` (`add`) and read them back by name
(`rows.generated`, `rows.sim_ctx`, ...): live views of the first `rows.n` rows, valid until the table next
grows or retires rows (read them again after that; never keep a view across steps). Admission appends rows
at the end (`grow`); retirement (`keep`) calls the hooks registered with `on_retire` (state that is not a
column: KV caches, finished outputs) and then moves the kept rows of every column to the front, in order,
in one compiled pass per storage block. Nobody mirrors anybody else's retirement.

Storage: the 1D int64 and float64 columns live as the rows of one preallocated matrix per dtype (each
column contiguous, built once at first use after the columns are declared), wide columns ([rows, width],
e.g. the history rings) in their own arrays; capacity doubles when the batch outgrows it.
"""
from __future__ import annotations

import operator

import numpy as np

from . import _kernels as _k


class RowTable:
    def __init__(self, capacity: int = 8):
        self.n = 0
        self._cap = max(int(capacity), 1)
        self._flat: dict[str, tuple[type, int]] = {}      # name -> (dtype, index in its dtype's matrix)
        self._fill = {np.int64: np.zeros(0, np.int64), np.float64: np.zeros(0)}   # per flat column
        self._mat = {np.int64: np.zeros((0, self._cap), np.int64), np.float64: np.zeros((0, self._cap))}
        self._wide: dict[str, tuple[np.ndarray, object]] = {}   # name -> (storage [cap, width], fill)
        self._names = {np.int64: [], np.float64: []}              # flat column names in matrix order
        self._fills = {np.int64: [], np.float64: []}              # ... and their fill values
        self._hooks: list = []
        self._getters: dict = {}   # gather's per-names itemgetters
        self._stale = False
        self._cached: dict[int, dict] = {}   # n -> the views of the first n rows (valid until the storage moves)
        self._declared = False   # columns added since the matrices were built (built at first use)
        self.version = 0   # changes whenever the views do: a cache of views is valid while it holds

    # ---- declaring columns ------------------------------------------------------------------------
    def add(self, name: str, dtype=np.int64, fill=0, width: int | None = None) -> None:
        """Declare a column (before rows exist). width: a [rows, width] column (dtype int64 or float64)."""
        if name in self._flat or name in self._wide or hasattr(type(self), name):
            raise ValueError(f"RowTable: column {name!r} exists already (or is a reserved name)")
        if self.n:
            raise ValueError(f"RowTable: add column {name!r} before any row is admitted")
        dt = np.dtype(dtype).type
        if dt not in self._mat:
            raise ValueError(f"RowTable: column {name!r}: dtype must be int64 or float64")
        if width is not None:
            self._wide[name] = (np.full((self._cap, int(width)), fill, dt), fill)
        else:
            self._flat[name] = (dt, len(self._names[dt]))
            self._names[dt].append(name)
            self._fills[dt].append(fill)
            self._getters.clear()   # gather's places shift with a new flat column
        self._declared = True   # the matrices and views are built once, at first use (_build)

    def _build(self) -> None:
        """The flat columns' matrices at their fill values (columns are only added while the table is
        empty), then the views."""
        for dt, fills in self._fills.items():
            self._fill[dt] = fill = np.array(fills, dt)
            self._mat[dt] = np.repeat(fill[:, None], self._cap, axis=1)
        self._cached.clear()
        self._declared = False
        self._views()

    def __getattr__(self, name: str):
        """A column read before the table was first used: build it, then read it."""
        if self.__dict__.get("_declared") and (name in self._flat or name in self._wide):
            self._build()
            return self.__dict__[name]
        raise AttributeError(f"RowTable has no column or attribute {name!r}")

    def on_retire(self, hook) -> None:
        """hook(keep): called by `keep` before the rows move (row i is still row i); keep[i] False = leaving."""
        self._hooks.append(hook)

    # ---- rows -------------------------------------------------------------------------------------
    def grow(self, m: int) -> slice:
        """Append m rows at their columns' fill values (rows past n always hold them); returns the slice of
        the new rows."""
        if self._declared:
            self._build()
        n = self.n
        if n + m > self._cap:
            self._resize(max(n + m, 2 * self._cap))
        self.n = n + m
        self._views()
        return slice(n, n + m)

    def keep(self, keep: np.ndarray, refresh: bool = True) -> None:
        """Retire the rows where keep is False: hooks first, then every column compacts in place.
        refresh=False leaves the views stale until the next `grow` or `sync` (the engine's loop admits
        right after retiring: one refresh instead of two)."""
        if self._declared:
            self._build()
        for hook in self._hooks:
            hook(keep)
        m = _k.compact_flat(keep, self._mat[np.int64], self._fill[np.int64], self._mat[np.float64],
                            self._fill[np.float64])
        for arr, fill in self._wide.values():
            _k.compact_rows(keep, arr, fill)
        self.n = int(m)
        if refresh:
            self._views()
        else:
            self._stale = True

    def sync(self) -> None:
        """Refresh the views after keep(..., refresh=False)."""
        if self._stale:
            self._views()

    def _resize(self, cap: int) -> None:
        for dt, mat in self._mat.items():
            new = np.repeat(self._fill[dt][:, None], cap, axis=1)
            new[:, :self.n] = mat[:, :self.n]
            self._mat[dt] = new
        for name, (arr, fill) in self._wide.items():
            new = np.full((cap, arr.shape[1]), fill, arr.dtype)
            new[:self.n] = arr[:self.n]
            self._wide[name] = (new, fill)
        self._cap = cap
        self._cached.clear()

    def _views(self) -> None:
        """Every column's view of the first n rows, as attributes. The views of a given n are built once
        and reused (they look at the same storage until it moves: _build, _resize)."""
        views = self._cached.get(self.n)
        if views is None:
            n = self.n
            views = self._cached[n] = {}
            for dt, mat in self._mat.items():
                views.update(zip(self._names[dt], mat[:, :n]))   # row j of the matrix: column j's values
            for name, (arr, _) in self._wide.items():
                views[name] = arr[:n]
        self.__dict__.update(views)
        self._stale = False
        self.version += 1

    def gather(self, idx: np.ndarray, names: tuple[str, ...]) -> list[tuple]:
        """Rows idx's values of the flat columns `names`, one tuple per row in that order (Python ints and
        floats; one conversion per storage block, whatever the number of rows)."""
        if self._declared:
            self._build()
        get = self._getters.get(names)
        if get is None:   # a name's place in a row's int64 values followed by its float64 values
            place = {c: i for i, c in enumerate(self._names[np.int64] + self._names[np.float64])}
            get = self._getters[names] = operator.itemgetter(*(place[c] for c in names))
        ints = self._mat[np.int64].take(idx, axis=1).T.tolist()   # take: ~4x cheaper than [:, idx] here
        floats = self._mat[np.float64].take(idx, axis=1).T.tolist()
        return [get(a + b) for a, b in zip(ints, floats)]

    @property
    def columns(self) -> list[str]:
        return [*self._flat, *self._wide]
