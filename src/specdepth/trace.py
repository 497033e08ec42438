"""Recording acceptance traces while a run goes: acceptance_trace.jsonl's records, which `acceptance.Trace`
replays."""
from __future__ import annotations

import numpy as np


class TraceRecorder:
    """Records acceptance traces while a run goes, directly as acceptance_trace.jsonl's records (the one
    trace format; `Trace` replays it): per request its verified draft tokens' confidences and outcomes, and
    the confidences of tokens drafted after a rejection ("unverified")."""

    def __init__(self):
        self._by_request: dict[int, dict] = {}

    def record(self, request_ids, drafted, accepted, confidences) -> None:
        for i in np.flatnonzero(drafted).tolist():
            d, a = int(drafted[i]), int(accepted[i])
            k = min(d, a + 1)
            rid = int(request_ids[i])
            rec = self._by_request.get(rid)
            if rec is None:
                rec = self._by_request[rid] = {"request_id": rid, "confidence": [], "accepted": [], "unverified": []}
            conf = rec["confidence"]
            if k < d:   # drafted after the rejected token: never verified, but policies saw them
                rec["unverified"].append([len(conf) + k - 1, confidences[i, k:d].tolist()])
            conf.extend(confidences[i, :k].tolist())
            rec["accepted"].extend([1] * a + [0] * (k - a))

    def records(self) -> list[dict]:
        return [self._by_request[r] for r in sorted(self._by_request)]
