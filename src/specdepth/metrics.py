"""Turn an engine run's raw rows into summary.json's metrics (names follow vLLM where one exists)."""
from __future__ import annotations

import math

import numpy as np

from .engine import REQUEST_COLUMNS, STEP_COLUMNS, RunResult


def _pct(values: np.ndarray, q: float):
    return float(np.percentile(values, q)) if values.size else None


def _ratio(a: float, b: float):
    return float(a / b) if b else None


def summarize(res: RunResult, **meta) -> dict:
    """`meta` (policy, backend, batch_size, ...) goes first; then the measured metrics."""
    steps = np.array(res.steps, dtype=float).reshape(-1, len(STEP_COLUMNS))
    reqs = np.array(res.requests, dtype=float).reshape(-1, len(REQUEST_COLUMNS))
    S = {c: steps[:, i] for i, c in enumerate(STEP_COLUMNS)}
    Q = {c: reqs[:, i] for i, c in enumerate(REQUEST_COLUMNS)}
    decode_steps = int(np.count_nonzero(S["batch_size"]))   # rows with batch 0 only prefilled (output_len 1)
    mean_running = _ratio(float(S["batch_size"].sum()), decode_steps)
    output_tokens = int(Q["output_len"].sum())
    time_s = float(Q["finish_s"].max()) if reqs.size else 0.0
    drafted = int(S["drafted"].sum())
    accepted = int(S["accepted"].sum())
    target_flops = float(S["target_flops"].sum())
    draft_flops = float(S["draft_flops"].sum())
    prop = res.position_proposed
    last = int(np.flatnonzero(prop)[-1]) + 1 if prop is not None and prop.any() else 0
    # P(draft j accepted | drafts 0..j-1 accepted), 0-based j: the per-token rate a depth policy needs
    reach = res.position_reached
    per_pos = [float(res.position_accepted[j] / reach[j]) if reach[j] else None for j in range(last)]
    out = dict(meta)
    out.update(
        requests=int(reqs.shape[0]),
        output_tokens=output_tokens,
        steps=decode_steps,
        time_s=time_s,
        throughput_tok_s=_ratio(output_tokens, time_s),
        tokens_per_step=_ratio(res.emitted_unclipped, res.seq_steps),
        acceptance_rate=_ratio(accepted, drafted),
        draft_tokens=drafted,
        accepted_tokens=accepted,
        verify_tokens=int(S["verify_tokens"].sum()),
        per_position_acceptance=per_pos,
        mean_batch_size=mean_running,
        # the batch that actually ran (engine.max_batch_size / max_num_batched_tokens may cap the requested one):
        # the most and the mean number of sequences running per decode step
        max_running=int(S["batch_size"].max()) if steps.shape[0] else 0,
        mean_running=mean_running,
        depth_changes_per_request=_ratio(float(sum(res.depth_changes)), len(res.depth_changes)),
        token_budget=res.token_budget,
        tpot_p50_s=_pct(Q["tpot_s"], 50),
        tpot_p99_s=_pct(Q["tpot_s"], 99),
        ttft_p50_s=_pct(Q["ttft_s"], 50),
        ttft_p99_s=_pct(Q["ttft_s"], 99),
        e2e_p50_s=_pct(Q["e2e_s"], 50),
        e2e_p99_s=_pct(Q["e2e_s"], 99),
        draft_time_s=float(S["draft_s"].sum()),
        verify_time_s=float(S["verify_s"].sum()),
        prefill_time_s=float(S["prefill_s"].sum()),
        overhead_time_s=float(S["overhead_s"].sum()),
        target_flops=target_flops,
        draft_flops=draft_flops,
        flops_per_token=_ratio(target_flops + draft_flops, output_tokens),
    )
    # JSON has no NaN/inf: make sure none slipped in
    for k, v in out.items():
        if isinstance(v, float) and not math.isfinite(v):
            out[k] = None
    return out
