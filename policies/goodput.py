import numpy as np

from specdepth.errors import as_choice, as_float, as_int
from specdepth.policy import Policy

from ._common import PerRequest, StepCost, best_prefix


class Goodput(Policy):
    """Goodput maximiser (SmartSpec / TurboSpec; vLLM adaptive verification): per step, rank every
    (sequence, position) draft slot by its survival probability and admit slots while the predicted
    goodput = expected emitted tokens / predicted step time still rises; then, while drafting, let a
    sequence draft one more token only while that token is worth its marginal time.

    Acceptance estimate per sequence (`estimator`):
      counts      accepted / (accepted + rejections), shrunk toward the batch-wide rate with
                  `prior_strength` pseudo-trials (empirical Bayes)
      confidence  the mean of the draft's confidences for that sequence, shrunk the same way, times a
                  batch-wide calibration (accepted / sum of confidences over verified tokens)
    Batch-wide sums forget with a memory of `pool_memory` drafted tokens.
    Plan: survival of slot j (1-based) of sequence i is a_i^j; slots past the request's remaining tokens
    are worth nothing. Draft forwards are paid per position (a fixed part: weights, launch; plus a part
    per row), verify per token, both from the view's cost model. Position by position, the best-ranked
    m_p rows (m_p <= m_(p-1)) that maximise value - G x (draft forward + verify growth) draft there; G,
    the step's goodput, is found by Dinkelbach iteration (G <- E/T of the plan made with G, from last
    step's G). Ranking slots globally by survival alone (vLLM's DSpark) mixes deep slots of good rows
    with shallow slots of others and pays a draft forward for a handful of rows: at large batch that
    loses to fixed depth; grouping by position is what makes it win. `ranking=global` keeps that
    global ranking (best prefix of all slots by survival) as the literal baseline.
    Drafting (`use_confidence`): each drafted token's calibrated confidence updates the sequence's
    survival s_i; the next position is drafted by the rows whose next token (worth s_i * a_i) beats G
    times its marginal cost: the best group of m rows maximises sum(value) - G * (draft[m] + verify
    growth). Rows may go `extend` positions past their planned depth when their confidences are high.
    Works on any backend: with uninformative confidences (constant) the drafting rule reproduces the plan.
    """

    name = "goodput"
    depth_param = "max_depth"

    def __init__(self, max_depth: int = 16, estimator: str = "confidence", prior_strength: float = 8.0,
                 pool_memory: float = 20000.0, use_confidence: bool = True, extend: int = 16,
                 ranking: str = "position"):
        self.max_depth = as_int(max_depth, "policy.max_depth", min=0)
        self.estimator = as_choice(estimator, "policy.estimator", {"counts", "confidence"})
        self.prior_strength = as_float(prior_strength, "policy.prior_strength", min=0)
        self.pool_memory = as_float(pool_memory, "policy.pool_memory", min=0, min_open=True)
        self.use_confidence = bool(use_confidence)
        self.extend = as_int(extend, "policy.extend", min=0)
        self.ranking = as_choice(ranking, "policy.ranking", {"position", "global"})
        self._seq = PerRequest(4)   # accepted, rejections, sum of confidences, drafted
        self._costs = StepCost()
        self.reset()

    def reset(self):
        self._seq.reset()
        self._costs = StepCost()
        # batch-wide decayed sums: accepted, rejections, confidence sum, drafted, accepted / conf (verified)
        self._pool = np.array([7.0, 3.0, 7.0, 10.0, 1.0, 1.0])
        self._G = 0.0

    # ---- estimates --------------------------------------------------------------------------------
    def _alpha(self, view) -> np.ndarray:
        st = self._seq.align(view.request_ids)
        pa, pr, pc, pd, cal_a, cal_c = self._pool
        k = self.prior_strength
        if self.estimator == "counts":
            base = pa / (pa + pr)
            a = (st[:, 0] + k * base) / (st[:, 0] + st[:, 1] + k)
        else:
            base = pc / pd
            a = (st[:, 2] + k * base) / (st[:, 3] + k) * min(cal_a / cal_c, 1 / max(base, 1e-6))
        return np.clip(a, 1e-3, 0.999)

    def _calibration(self) -> float:
        return self._pool[4] / self._pool[5]

    # ---- hooks ------------------------------------------------------------------------------------
    def plan(self, view):
        n = view.batch_size
        K = min(self.max_depth, view.max_depth, (view.max_num_batched_tokens - n) // n)
        if K <= 0:
            self._G = 0.0
            return np.zeros(n, np.int64)
        a = self._alpha(view)
        rowcap = np.clip(view.remaining - 1, 0, K)
        costs = self._costs.update(view, K)
        S = a[:, None] ** np.arange(1, K + 1)                 # survival of slot (i, position p)
        S[np.arange(K)[None, :] >= rowcap[:, None]] = 0.0      # past the request's end: worth nothing
        if self.ranking == "global":
            return self._plan_global(S, costs, n, rowcap, a)
        order = np.argsort(-S, axis=0, kind="stable")          # rows ranked per position
        C = np.zeros((n + 1, K))
        np.cumsum(np.take_along_axis(S, order, 0), axis=0, out=C[1:])
        # Dinkelbach (Newton on max E - G T): start from last step's goodput, fall back to no speculation
        g_none = n / costs.verify[0]
        G = max(g_none, self._G)
        best_g, ms = g_none, []
        for _ in range(5):
            cand, e, t = self._by_position(C, G, costs, n)
            if not cand:
                if G <= g_none:
                    break
                G = g_none
                continue
            g = e / t
            if g > best_g:
                best_g, ms = g, cand
            if abs(g - G) <= 1e-3 * G:
                break
            G = g
        G = best_g
        mark = np.zeros((n, K), bool)
        for p, m in enumerate(ms):
            mark[order[:m, p], p] = True
        depths = mark.sum(axis=1).astype(np.int64)
        self._G, self._a = G, a
        if self.use_confidence:
            self._s = np.ones(n)
            depths = np.where(depths > 0, np.minimum(depths + self.extend, rowcap), 0)
        return depths

    def _plan_global(self, S, costs, n, rowcap, a):
        """vLLM DSpark / SmartSpec as described: every slot ranked by survival, best prefix by goodput."""
        rows, cols = np.nonzero(S > 0)
        surv = S[rows, cols]
        order = np.lexsort((cols, -surv))
        m, g = best_prefix(n, rows[order], cols[order], surv[order], costs, float(n))
        depths = np.bincount(rows[order[:m]], minlength=n).astype(np.int64)
        self._G, self._a = g, a
        if self.use_confidence:
            self._s = np.ones(n)
            depths = np.where(depths > 0, np.minimum(depths + self.extend, rowcap), 0)
        return depths

    @staticmethod
    def _by_position(C, G, costs, n):
        """Position by position, the number of rows m_p (the best-ranked ones, m_p <= m_(p-1)) that
        maximises value - G x (draft forward + verify growth); stops at the first position where none
        pays. Returns ([m_p], expected emitted tokens, predicted step seconds)."""
        ms, x, e, tdraft, prev = [], 0, float(n), 0.0, n
        ver, dr = costs.verify, costs.draft
        for p in range(C.shape[1]):
            gain = C[:prev + 1, p] - G * (dr[:prev + 1] + ver[x:x + prev + 1] - ver[x])
            m = int(np.argmax(gain))
            if m == 0 or gain[m] <= 0:
                break
            ms.append(m)
            e += C[m, p]
            tdraft += dr[m]
            x += m
            prev = m
        return ms, e, ver[x] + tdraft

    def keep_drafting(self, view, position, confidence):
        drafting = ~np.isnan(confidence)
        if not self.use_confidence:
            return drafting
        c = np.minimum(np.where(drafting, confidence, 0.0) * self._calibration(), 1.0)
        self._s = self._s * c
        cand = drafting & (view.depths > position + 1)
        idx = np.flatnonzero(cand)
        keep = np.zeros(view.batch_size, bool)
        if idx.size == 0:
            return keep
        v = self._s[idx] * self._a[idx]
        order = np.argsort(-v, kind="stable")
        gain_v = np.cumsum(v[order])
        mm = np.arange(1, idx.size + 1)
        x = int(view.drafted.sum())
        costs = self._costs
        xv = np.minimum(x + mm, costs.verify.size - 1)
        dt = costs.draft[mm] + costs.verify[xv] - costs.verify[min(x, costs.verify.size - 1)]
        gain = gain_v - self._G * dt
        best = int(np.argmax(gain))
        if gain[best] > 0:
            keep[idx[order[:best + 1]]] = True
        return keep

    def observe(self, view, accepted):
        drafted = view.drafted
        st = self._seq.align(view.request_ids)
        rej = (accepted < drafted).astype(float)
        conf = view.confidences
        if conf is not None and conf.shape[1]:
            cols = np.arange(conf.shape[1])[None, :]
            c = np.where(np.isnan(conf), 0.0, conf)
            csum = (c * (cols < drafted[:, None])).sum(axis=1)
            verified = cols < np.minimum(drafted, accepted + 1)[:, None]
            vconf = float((c * verified).sum())
        else:
            csum = np.zeros(view.batch_size)
            vconf = 0.0
        st[:, 0] += accepted
        st[:, 1] += rej
        st[:, 2] += csum
        st[:, 3] += drafted
        if drafted.any():
            self._pool *= np.exp(-float(drafted.sum()) / self.pool_memory)
            self._pool += (accepted.sum(), rej.sum(), csum.sum(), drafted.sum(), accepted.sum(), vconf)
