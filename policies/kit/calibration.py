"""Online calibration of the step cost: the cost model corrected by what the steps really cost."""
from __future__ import annotations

import math

import numpy as np

from . import kernels
from .cost import Tables, every_row_deep

COMPILED = True   # PaddingFit's and CostCalibration's updates compiled (kernels.padding_update,
#                   kernels.calibration_observe, both: kernels.padding_calibration_observe); False: their Python
#                   form (equal)


_UPPER3 = ((0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 2))   # a symmetric 3 x 3 matrix's upper triangle


_AT3 = ((0, 1, 2), (1, 3, 4), (2, 4, 5))                      # where entry (a, b) of it lies in that list


_PHASE = {"draft": 0, "verify": 1}   # a phase's place in CostCalibration's state


_NO_PAD = np.empty(0)   # `correct`'s pad array without a policy time (nothing written to it)


class CostCalibration:
    """Online correction of the cost model from what the steps really cost (the view's measured_* and
    predicted_* fields, read in observe). Per phase, measured = scale x predicted + fixed x count, with
    count = draft forwards (draft phase: a fixed cost per draft position) or 1 (verify phase: a fixed cost
    per step), fitted by least squares with exponential forgetting (`memory` steps) and shrunk toward
    (scale 1, fixed 0) with `prior` pseudo-steps, so a run starts from the cost model and short runs do not
    pay a learning transient. Any policy can use it:

        cal = CostCalibration(); cal.observe(view)   # in observe()
        tables = cal.correct(costs)                   # corrected StepCost tables (.verify, .draft)

    `sticky` (default on): a padding term found earlier is kept while the recent steps cannot tell (`PaddingFit`).
    `cautious` (default on): where no term was found and the steps cannot rule one out, the padding is assumed
    (`PaddingFit`).
    `draft_clip` (> 0; default 0, off): a step's measured draft seconds enter the draft fit at most draft_clip x the
    fit's price for the step (scale x predicted + fixed x forwards), so one outlier (a draft that also caught up
    skipped tokens) moves the fit at most that factor, and a cost the model misses is learnt at most that factor a
    step (goodput sets 3).
    `draft_fixed` (default off): where the draft's steps do not identify a scale apart from a fixed part (the cost
    model's seconds per forward vary by less than UNIDENTIFIED, about 10 %: memory-bound forwards whose rows barely
    change their price), the excess over the model is read as a fixed cost per forward (scale 1, the fixed part
    fitted alone; where the model overprices, a scale alone): the scale would multiply the model's price of each
    further row, which such data cannot tell (a small draft's forward at a small batch costs a nearly constant
    time the roofline can miss: launches, an engine's own fixed costs).
    """

    PHASES = ("draft", "verify")
    UNIDENTIFIED = 0.01   # 1 - (the cosine of predicted and forwards)^2: ~ the squared CV of the price per forward

    def __init__(self, memory: float = 200.0, prior: float = 2.0, sticky: bool = True, cautious: bool = True,
                 draft_clip: float = 0.0, draft_fixed: bool = False):
        self.memory, self.prior = float(memory), float(prior)
        self.draft_fixed = bool(draft_fixed)
        self.draft_clip = float(draft_clip)   # > 0: a step's measured draft counts at most this x the fit's price
        self.sticky = bool(sticky)   # keep a padding term the recent steps cannot tell about (PaddingFit)
        self.cautious = bool(cautious)   # assume padding the steps cannot rule out (PaddingFit)
        self.reset()

    def reset(self):
        # per phase i (_PHASE): decayed sums of [x1 x1, x1 x2, x2 x2, x1 y, x2 y, weight], x = (predicted, count), at
        # 6i..6i+5, and its fit (scale, fixed) at 12 + 2i, 13 + 2i: one array, the compiled updates' state
        self._state = np.zeros(16)
        self._state[12] = self._state[14] = 1.0
        self._padding = PaddingFit(self.memory, self.sticky, self.cautious)   # the verify with observe's `pad`
        self._drafted_last = True   # whether the last step observed drafted (a run's first draft resumes nothing)
        self._kept = None   # `correct`'s tables, its pad array and their sizes, where kept
        self._plain = (None, None)   # the (verify, draft) the kept tables were last corrected from without a pad

    def update(self, phase: str, predicted: float, count: float, measured: float) -> None:
        keep = math.exp(-1.0 / self.memory)
        i = _PHASE[phase]
        fixed = self.draft_fixed and i == 0
        if COMPILED:   # the same operations, compiled
            kernels.calibration_update(self._state, i, float(predicted), float(count), float(measured), keep,
                                       self.prior, fixed, self.UNIDENTIFIED)
            return
        s0, s1, s2, s3, s4, s5 = self._state[6 * i:6 * i + 6].tolist()   # each v x keep + its product, written out
        s = [s0 * keep + predicted * predicted, s1 * keep + predicted * count, s2 * keep + count * count,
             s3 * keep + predicted * measured, s4 * keep + count * measured, s5 * keep + 1.0]
        self._state[6 * i:6 * i + 6] = s
        self._state[12 + 2 * i:14 + 2 * i] = self._solve_fixed(s) if fixed else self._solve(s)

    def _solve_fixed(self, s):
        """`draft_fixed`: _solve, unless the data do not identify the scale apart from the fixed part (1 - cos^2 of
        the two features below UNIDENTIFIED); then scale 1 and the fixed part alone (ridge toward 0 as _solve's),
        or, where the model overprices (a negative fixed part), a scale alone."""
        if s[5] <= 0.0 or s[0] <= 0.0 or s[2] <= 0.0 or 1.0 - s[1] * s[1] / (s[0] * s[2]) >= self.UNIDENTIFIED:
            return self._solve(s)
        k = self.prior / s[5]
        fixed = (s[4] - s[1]) / (s[2] * (1 + k))   # y - predicted = fixed x forwards
        if fixed >= 0.0:
            return (1.0, fixed)
        return (max((s[3] + k * s[0]) / (s[0] * (1 + k)), 0.0), 0.0)

    def _solve(self, s):
        w = s[5]
        if w <= 0.0 or s[0] <= 0.0:
            return (1.0, 0.0)
        # ridge toward (1, 0): `prior` pseudo-steps at the data's mean squares of each feature
        k = self.prior / w
        a11, a12, a22 = s[0] * (1 + k), s[1], s[2] * (1 + k) if s[2] > 0 else 1.0
        b1, b2 = s[3] + k * s[0], s[4]
        det = a11 * a22 - a12 * a12
        if det <= 0.0:
            return (1.0, 0.0)
        scale, fixed = (b1 * a22 - b2 * a12) / det, (a11 * b2 - a12 * b1) / det
        if scale < 0.0 or fixed < 0.0:   # keep the physical sign: refit with the other part at zero
            return (max(b1 / a11, 0.0), 0.0) if fixed < 0.0 else (0.0, max(b2 / a22, 0.0))
        return (scale, fixed)

    def observe(self, view, pad: float | None = None, caught_up: bool = False) -> None:
        """Add this step's measured vs predicted costs (call from observe; a no-op where none). `pad`: what
        the verify would cost more than predicted if the engine padded every row to the step's deepest one
        (`pad_extra`); given, the fit also learns how much of that the engine pays (`self.pad`).
        A step that drafts after a step that drafted nothing is left out of the draft fit: there the draft also
        catches up the tokens it skipped (backend=hf; `backend.draft_catch_up`), a cost of the idle steps, not
        of the positions drafted, and one such step could set the fit for good, since a fit that says drafts
        are dear is not corrected while no draft is made.
        `caught_up` (a policy that knows, from view.draft_lag at plan: `CatchUpPadding.caught_up`): whether a row
        whose draft lagged drafted this step; such a step is left out too, though the step before drafted. For
        a policy that drafts every row or none (CostAwareDepth) a row lags only where `catch_up` held it back, for
        many steps, and one step that drafts rows just caught up next to held ones would set the draft's scale as
        above. Not for goodput, whose per-row plans leave rows a few tokens behind on most drafting steps of a
        stream: left out, those steps would starve the fit."""
        mv = view.measured_verify_s
        if mv is None:
            return
        pv = view.predicted_verify_s
        if pad is not None and not COMPILED:
            self._padding.update(pv, pad, mv)
        forwards = view.draft_forwards
        draft = bool(forwards and self._drafted_last and not caught_up)
        self._drafted_last = bool(forwards)
        if COMPILED:   # the updates in one call, the same operations
            self._observe_compiled(view, pv, mv, pad, draft, forwards)
            return
        self.update("verify", pv, 1.0, mv)
        if draft:
            md = view.measured_draft_s
            if self.draft_clip > 0.0:
                sd, cd = self.params("draft")
                md = min(md, self.draft_clip * (sd * view.predicted_draft_s + cd * forwards))
            self.update("draft", view.predicted_draft_s, float(forwards), md)

    def _observe_compiled(self, view, pv, mv, pad, draft, forwards) -> None:
        """observe's updates in one compiled call: both phases' fits (`kernels.calibration_observe`), after
        PaddingFit.update's where `pad` is given (`kernels.padding_calibration_observe`)."""
        pd, md = (view.predicted_draft_s, view.measured_draft_s) if draft else (0.0, 0.0)
        args = (self._state, float(pv), float(mv), draft, float(pd), float(forwards or 0), float(md),
                math.exp(-1.0 / self.memory), self.prior, self.draft_clip, self.draft_fixed, self.UNIDENTIFIED)
        if pad is None:
            kernels.calibration_observe(*args)
            return
        p = self._padding
        p.pad, scale, fixed, taken = kernels.padding_calibration_observe(
            p._s, float(pad), math.exp(-1.0 / p.memory), float(p.pad), bool(p.sticky), bool(p.cautious), *args)
        p.fit = (scale, fixed) if taken else None

    @property
    def pad(self) -> float:
        """Seconds per second of padded verify growth the engine pays (0: it packs ragged forwards; PaddingFit)."""
        return self._padding.pad

    def verify_scale(self) -> float:
        """The verify's scale: how many seconds one predicted second of verify really costs (the padded fit's
        where it is taken)."""
        return self._padding.fit[0] if self._padding.pad else float(self._state[14])   # (params("verify")[0])

    def params(self, phase: str) -> tuple[float, float]:
        """(scale, fixed seconds per step or per draft position) of a phase."""
        i = 12 + 2 * _PHASE[phase]
        return tuple(self._state[i:i + 2].tolist())

    def correct(self, costs, policy_time=None, keep: bool = False) -> "Tables":
        """Corrected StepCost tables: verify[x] (x drafts, one forward) and draft[m] (one forward of m rows).
        `policy_time` (a PolicyTime): its seconds priced in too, as policy_time.apply(correct(costs)). `keep`: the
        tables written into arrays this object keeps (while their sizes hold), each call overwriting the last's."""
        v, d = costs.verify, costs.draft
        quiet = policy_time is None or (policy_time.drafting is None and policy_time.idle is None)
        if keep and quiet and v is self._plain[0] and d is self._plain[1] and COMPILED and not self._padding.pad:
            t = self._kept[0]   # (the tables the last such call checked and kept: straight into its arrays)
            kernels.corrected(v, d, self._state, False, 0.0, 0.0, t.verify, t.draft, _NO_PAD)
            return t
        if COMPILED and not self._padding.pad and ((id(v), id(d)) in _NATIVE or _native(v, d)):
            timed, idle, extra = (False, 0.0, 0.0) if quiet else policy_time.terms()   # (quiet: nothing measured)
            X1, n1 = v.size, d.size
            P = (X1 - 1) // max(n1 - 1, 1) + 1 if timed else 0   # (PolicyTime.apply's pad size)
            kept = self._kept if keep else None
            if kept is None or kept[2] != (X1, n1, P):
                kept = (Tables(np.empty(X1), np.empty(n1)), np.empty(P) if P else _NO_PAD, (X1, n1, P))
                if keep:
                    self._kept = kept
            t, pad, _ = kept
            kernels.corrected(v, d, self._state, timed, float(idle), float(extra), t.verify, t.draft,
                              pad)   # one loop each, the same operations
            t.pad = pad if timed else None
            if keep:
                self._plain = (None, None) if timed else (v, d)
            return t
        tables = self._correct(costs)
        return tables if policy_time is None else policy_time.apply(tables)

    def _correct(self, costs) -> "Tables":
        """`correct` without a policy time, in numpy."""
        (sv, cv), (sd, cd) = self.params("verify"), self.params("draft")
        d = sd * costs.draft + cd
        d[0] = 0.0
        if not self.pad:
            return Tables(sv * costs.verify + cv, d)
        sv, cv = self._padding.fit
        # padded: a plan with x drafts over P positions pays verify'[x] + pad[0] + ... + pad[P-1]
        v, n = costs.verify, costs.draft.size - 1
        pv = self.pad
        vp = getattr(costs, "vpad", None)
        if vp is None:   # the padded verify at the batch's mean context (without StepCost.pad_context)
            vp = every_row_deep(v, n)
        return Tables((sv - pv) * v + cv + pv * vp[0], d, pv * np.diff(vp))


_NATIVE = {}   # `_native`'s tables: (ids of) verify and draft tables found native float64 vectors -> the tables


def _native(v, d) -> bool:
    """kernels.floats(v, d, nonempty=True) of `CostCalibration.correct`'s tables, remembered (`_NATIVE`, 64 pairs at
    most; each entry holds its arrays: their ids are not reused while it lives)."""
    if not kernels.floats(v, d, nonempty=True):
        return False
    if len(_NATIVE) >= 64:
        _NATIVE.clear()
    _NATIVE[id(v), id(d)] = (v, d)
    return True


class PaddingFit:
    """Whether the engine pads the verify to the deepest row: the verify's measured seconds fitted on (predicted,
    1, pad), the padding feature being what a padded verify would cost more than the ragged prediction. `pad` is
    the coefficient where the data identify it (0: the engine packs ragged forwards), `fit` the (scale, fixed) of
    the verify fit with it (None where not taken). `sticky`: a term found earlier is kept while the recent steps
    cannot tell; `cautious`: where none was found and the steps cannot rule one out, it is assumed."""

    def __init__(self, memory: float, sticky: bool = True, cautious: bool = True):
        self.memory, self.sticky, self.cautious = memory, sticky, cautious
        # decayed X'X (its upper triangle, row by row), X'y, y'y and weight for x = (predicted, 1, pad), in one array
        # (the compiled update's state; `xx`, `xy`, `yy`, `w` read and write it)
        self._s = np.zeros(11)
        self.pad = 0.0
        self.fit = None

    xx = property(lambda self: self._s[0:6].tolist(), lambda self, v: self._s.__setitem__(slice(0, 6), v))
    xy = property(lambda self: self._s[6:9].tolist(), lambda self, v: self._s.__setitem__(slice(6, 9), v))
    yy = property(lambda self: float(self._s[9]), lambda self, v: self._s.__setitem__(9, v))
    w = property(lambda self: float(self._s[10]), lambda self, v: self._s.__setitem__(10, v))

    def update(self, predicted: float, pad: float, measured: float) -> None:
        """measured = scale x predicted + fixed + pad x (padded - predicted), least squares with the same
        forgetting. The padding term is taken (`self.pad`, with its own scale and fixed part) only where the
        data identify it: its coefficient at least three standard errors above 0 and 2 % of the scale, and the
        fit better than without it by 1 % of a step's cost (RMS). A ragged engine's constant per-step cost
        cannot pass for padding even when the padding feature barely varies (the prior's pull on the fixed
        part once did, on a cell with no padding). Where the fixed part comes out negative (a cost model that
        charges a fixed part the engine does not pay) the fit is taken again without it: refusing the padding
        there would let a padded verify pass for a fixed cost in the verify-only fit, pricing drafts as nearly
        free."""
        keep = math.exp(-1.0 / self.memory)
        if COMPILED:   # the same operations, compiled
            self.pad, scale, fixed, taken = kernels.padding_update(
                self._s, float(predicted), float(pad), float(measured), keep, float(self.pad), bool(self.sticky),
                bool(self.cautious), 2.0)
            self.fit = (scale, fixed) if taken else None
            return
        x = (predicted, 1.0, pad)
        self.xx = [v * keep + x[a] * x[b] for v, (a, b) in zip(self.xx, _UPPER3)]
        self.xy = [v * keep + x[a] * measured for a, v in enumerate(self.xy)]
        self.yy = self.yy * keep + measured * measured
        self.w = self.w * keep + 1.0
        self._refit()

    def _refit(self) -> None:
        """The padding term from the sums (see `update`), or held (`_hold`) where the data do not identify it."""
        prev, self.pad, self.fit = self.pad, 0.0, None
        xx = self.xx
        if self.w < 4.0 or xx[5] <= 0.0:
            return
        A = list(xx)
        for d in (0, 3, 5):   # a hair of ridge on the diagonal
            A[d] = A[d] + A[d] * 1e-9
        fit = self._solve(A, (0, 1, 2))
        if fit is not None and fit[0][1] < 0.0:   # keep the physical sign: refit with no fixed part
            fit = self._solve(A, (0, 2))
        if fit is None:
            self._hold(A, prev, None)
            return
        coef, se = fit
        plain = self._solve(A, (0, 1))   # without the padding term: what it must improve on, by at least
        if plain is None:                    # 1 % of a step's cost (RMS)
            self._hold(A, prev, None)
            return
        gain = (self._rss(plain[0]) - self._rss(coef)) / self.w >= (0.01 * self.xy[1] / self.w) ** 2
        if gain and coef[0] > 0.0 and coef[2] > 3.0 * se and coef[2] > 0.02 * coef[0]:
            self.pad = float(min(coef[2], coef[0]))
            self.fit = (float(coef[0]), float(coef[1]))
        elif not coef[2] + 3.0 * se < prev:   # the data do not say the padding went away
            self._hold(A, prev, coef[2] + 3.0 * se)
        else:
            self._hold(A, 0.0, coef[2] + 3.0 * se)

    def _hold(self, A: list, prev: float, upper: float | None) -> None:
        """Where the padding is not identified: plan with the term found earlier (`sticky`), else with what the
        data cannot rule out (`cautious`, `_doubt`), the scale and fixed part refitted (`_keep_pad`)."""
        self._keep_pad(A, prev if self.sticky and prev > 0.0 else self._doubt(upper))

    def _doubt(self, upper: float | None) -> float:
        """`cautious`: the padding to plan with where the fit cannot rule it out (1: a padded verify at the cost
        model's price), 0 where it can (upper: the padding coefficient's upper bound, three standard errors
        above the fit; None where the fit is singular). Only steps that drafted rows unevenly show padding at
        all; where the plan drafts the same rows alike every step the padding feature is constant and so is
        confounded with a fixed cost per step. Taking the ragged reading there is a trap: it prices the uneven
        plan as cheap, the plan stays uneven, and the data never tell. Assumed, padding makes the plan even,
        which varies the feature and settles the question."""
        if not self.cautious or (upper is not None and upper < 0.5):
            return 0.0
        return 1.0 if upper is None else min(upper, 1.0)

    def _keep_pad(self, A: list, prev: float) -> None:
        """Hold the padding term at prev (> 0: one found earlier, `sticky`, or one the data cannot rule out,
        `cautious`), the scale and fixed part refitted. Why `sticky`: where the recent steps cannot tell whether the
        engine pads, a plan that drafts every row alike pads nothing, so the padding feature stops varying and,
        with forgetting, its coefficient's error grows until the test above fails. Dropping it then priced
        partial drafting as cheap on a padded engine, where every row pays the padded position. The scale and
        fixed part are refitted with the padding held at prev; the term goes only where the data put it more than
        three standard errors below prev (above), or the refit has no positive scale."""
        if prev <= 0.0:
            return
        y0, y1 = self.xy[0] - prev * A[2], self.xy[1] - prev * A[4]
        det = A[0] * A[3] - A[1] * A[1]
        if det <= 0.0:
            return
        scale, fixed = (A[3] * y0 - A[1] * y1) / det, (A[0] * y1 - A[1] * y0) / det
        if fixed < 0.0:
            scale, fixed = y0 / A[0], 0.0
        if scale > 0.0:
            self.pad, self.fit = float(min(prev, scale)), (float(scale), float(fixed))

    def _solve(self, A: list, idx: tuple) -> tuple[list, float] | None:
        """Least squares of the padding fit on the features idx (the others at 0), A the (ridged) upper triangle
        of X'X: the three coefficients and the last feature's standard error; None where singular."""
        coef = [0.0, 0.0, 0.0]
        y = self.xy
        if len(idx) == 3:
            a00, a01, a02, a11, a12, a22 = A
            m00, m01, m02 = a11 * a22 - a12 * a12, a02 * a12 - a01 * a22, a01 * a12 - a02 * a11
            m11, m12, m22 = a00 * a22 - a02 * a02, a01 * a02 - a00 * a12, a00 * a11 - a01 * a01
            det = a00 * m00 + a01 * m01 + a02 * m02
            if det == 0.0:
                return None
            coef = [(m00 * y[0] + m01 * y[1] + m02 * y[2]) / det, (m01 * y[0] + m11 * y[1] + m12 * y[2]) / det,
                    (m02 * y[0] + m12 * y[1] + m22 * y[2]) / det]
            last = m22 / det
        else:
            i, j = idx
            aii, aij, ajj = A[_AT3[i][i]], A[_AT3[i][j]], A[_AT3[j][j]]
            det = aii * ajj - aij * aij
            if det == 0.0:
                return None
            coef[i], coef[j] = (ajj * y[i] - aij * y[j]) / det, (aii * y[j] - aij * y[i]) / det
            last = aii / det
        dof = self.w - len(idx)
        return coef, math.sqrt(self._rss(coef) / dof * max(last, 0.0))

    def _rss(self, coef: list) -> float:
        """Residual sum of squares of the padding fit at coefficients coef (a feature left out has 0)."""
        xx, xy = self.xx, self.xy
        quad = sum(coef[a] * coef[b] * xx[k] * (1.0 if a == b else 2.0) for k, (a, b) in enumerate(_UPPER3))
        return max(self.yy - 2.0 * (coef[0] * xy[0] + coef[1] * xy[1] + coef[2] * xy[2]) + quad, 0.0)
