"""Summary statistics of a trace (what ``dl2ray trace describe`` prints)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from dl2ray.workload import Trace

QUANTILES = {"p10": 0.1, "p50": 0.5, "p90": 0.9}


def _quantiles(values: np.ndarray) -> dict[str, float]:
    out = {k: float(np.quantile(values, q)) for k, q in QUANTILES.items()}
    out["max"] = float(values.max())
    return out


def describe_trace(trace: Trace, slot_seconds: float) -> dict[str, Any]:
    """Plain-JSON summary of a non-empty trace.

    Keys: ``jobs``; ``first_arrival_slot``, ``last_arrival_slot`` and
    ``span_slots`` = last - first + 1 (slots); ``span_hours`` (span × slot
    length, h); ``slot_seconds`` (s); ``arrivals_per_slot`` (jobs /
    span_slots, mean) and ``max_arrivals_per_slot``; ``true_epochs`` and
    ``est_epochs`` quantiles ``p10/p50/p90/max`` (epochs, linear
    interpolation); ``mean_abs_estimate_error`` (mean |est/true - 1|);
    ``types`` (job count per type name, sorted by name).
    """
    if not trace:
        raise ValueError("cannot describe an empty trace")
    arrivals = np.array([j.arrival_slot for j in trace], dtype=np.int64)
    true_epochs = np.array([j.true_epochs for j in trace])
    est_epochs = np.array([j.est_epochs for j in trace])
    first, last = int(arrivals.min()), int(arrivals.max())
    span = last - first + 1
    per_slot = np.bincount(arrivals - first)
    return {
        "jobs": len(trace),
        "first_arrival_slot": first,
        "last_arrival_slot": last,
        "span_slots": span,
        "span_hours": span * slot_seconds / 3600.0,
        "slot_seconds": slot_seconds,
        "arrivals_per_slot": len(trace) / span,
        "max_arrivals_per_slot": int(per_slot.max()),
        "true_epochs": _quantiles(true_epochs),
        "est_epochs": _quantiles(est_epochs),
        "mean_abs_estimate_error": float(np.mean(np.abs(est_epochs / true_epochs - 1.0))),
        "types": dict(sorted(Counter(j.job_type for j in trace).items())),
    }
