"""``dl2ray cluster report``: what the live agent's decision log says (guardrail, shadow, loop timings)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from dl2ray.errors import UserError


def _read(path: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist() if path.is_file() else []


def allocation_difference(a: dict[str, list[int]] | None, b: dict[str, list[int]] | None) -> int:
    """Σ over jobs of |Δps| + |Δworkers| between two ``{job: [ps, workers]}`` allocations."""
    a, b = a or {}, b or {}
    return sum(
        abs(a.get(j, [0, 0])[0] - b.get(j, [0, 0])[0]) + abs(a.get(j, [0, 0])[1] - b.get(j, [0, 0])[1])
        for j in set(a) | set(b)
    )


def _pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 3) if values else None


def live_report(log_dir: Path) -> dict[str, Any]:
    """Summary of ``decisions.parquet`` and ``slots.parquet`` in ``log_dir``.

    ``differing_slots``: slots where the policy's allocation and the fallback's
    (shadow mode, or a guardrail replacement) were both known and differed;
    ``mean_task_difference``: mean of Σ_j |Δps_j| + |Δworkers_j| over those
    slots; ``policy_tasks``/``applied_tasks``: mean tasks per slot each proposed.
    """
    decisions, slots = _read(log_dir / "decisions.parquet"), _read(log_dir / "slots.parquet")
    if not decisions and not slots:
        raise UserError(f"{log_dir}: no decision log (decisions.parquet, slots.parquet)")
    reasons = Counter(d["reason"].split(":", 1)[0] for d in decisions if d["applied"] == "fallback")
    pairs = [
        (json.loads(d["policy_alloc"]), json.loads(d["fallback_alloc"]))
        for d in decisions
        if d["policy_alloc"] != "null" and d["fallback_alloc"] != "null"
    ]
    diffs = [allocation_difference(p, f) for p, f in pairs]
    applied = [
        json.loads(d["fallback_alloc"] if d["applied"] == "fallback" else d["policy_alloc"])
        for d in decisions
    ]
    proposed = [json.loads(d["policy_alloc"]) for d in decisions if d["policy_alloc"] != "null"]
    total = [s["total_ms"] for s in slots if s.get("total_ms") is not None]
    return {
        "slots": len(slots),
        "decisions": len(decisions),
        "policy": decisions[0]["policy"] if decisions else None,
        "fallback": decisions[0]["fallback"] if decisions else None,
        "applied_policy": sum(d["applied"] == "policy" for d in decisions),
        "applied_fallback": sum(d["applied"] == "fallback" for d in decisions),
        "fallback_reasons": dict(reasons),
        "compared_slots": len(diffs),
        "differing_slots": sum(d > 0 for d in diffs),
        "mean_task_difference": round(float(np.mean(diffs)), 3) if diffs else None,
        "policy_tasks": round(float(np.mean([sum(map(sum, p.values())) for p in proposed])), 3)
        if proposed
        else None,
        "applied_tasks": round(float(np.mean([sum(map(sum, (a or {}).values())) for a in applied])), 3)
        if applied
        else None,
        "step_errors": sum(1 for s in slots if s.get("error")),
        "loop_ms_median": _pct(total, 50),
        "loop_ms_p99": _pct(total, 99),
    }
