"""Summaries of simulator runs: per-run metrics and mean ± 95% CI over runs."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats

from dl2ray.sim import RunResult

RUN_METRICS = (
    "avg_jct", "median_jct", "p95_jct", "avg_jct_hours", "makespan", "gpu_util", "cpu_util",
    "queueing_delay", "jobs", "completed", "unfinished", "censored_avg_jct",
)


def censored_avg_jct(r: RunResult) -> float:
    """Average JCT (slots) over *every* job that arrived, unfinished ones counted until the run stopped.

    ``(1/N) Σ_j (end_j − arrival_j)`` with ``end_j`` = the number of slots run
    for a job still unfinished (a lower bound of its JCT). ``avg_jct`` of
    :func:`summarize_run` averages over finished jobs only, so a policy that
    starves jobs until ``sim.max_slots`` would look good there; model selection
    uses this one. A job whose arrival slot the run never reached (it stopped at
    ``sim.max_slots`` first) counts 0: it was never in the cluster, and a
    negative time would pull the average below every finished job.
    """
    if not r.arrival:
        return float("nan")
    stop = float(len(r.rewards))
    return float(np.mean([max(r.end_time.get(j, stop) - a, 0.0) for j, a in r.arrival.items()]))


def summarize_run(r: RunResult) -> dict[str, float]:
    """Metrics of one run. JCTs and makespan in slots; ``*_hours`` in hours.

    ``makespan`` is the completion time of the last job (slots from 0);
    ``queueing_delay`` the mean number of slots from arrival to first run;
    utilisations are means over the slots of the run. ``avg_jct``,
    ``median_jct`` and ``p95_jct`` are over the completed jobs (NaN if none);
    ``unfinished`` counts the jobs of the trace that did not complete (the run
    stopped at ``sim.max_slots``) and ``censored_avg_jct`` averages over all of
    them, unfinished ones counted until the run stopped
    (:func:`censored_avg_jct`): the one average comparable across schedulers
    that finish different subsets.
    """
    jct = np.array(list(r.jct.values()), dtype=np.float64)
    hours = r.slot_seconds / 3600.0
    delays = [r.first_run[j] - r.arrival[j] for j in r.first_run]
    nan = float("nan")
    return {
        "avg_jct": float(jct.mean()) if len(jct) else nan,
        "median_jct": float(np.median(jct)) if len(jct) else nan,
        "p95_jct": float(np.percentile(jct, 95)) if len(jct) else nan,
        "avg_jct_hours": float(jct.mean() * hours) if len(jct) else nan,
        "makespan": float(max(r.end_time.values())) if r.end_time else nan,
        "gpu_util": float(np.mean(r.gpu_util)) if r.gpu_util else 0.0,
        "cpu_util": float(np.mean(r.cpu_util)) if r.cpu_util else 0.0,
        "queueing_delay": float(np.mean(delays)) if delays else nan,
        "jobs": float(len(r.arrival)),
        "completed": float(len(r.end_time)),
        "unfinished": float(len(r.arrival) - len(r.end_time)),
        "censored_avg_jct": censored_avg_jct(r),
        # gang mode (dl2ray.gang) adds waiting/execution time, effectiveness and fragmentation
        **(r.extra_metrics() if hasattr(r, "extra_metrics") else {}),
    }


def mean_ci95(values: Sequence[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% Student-t confidence interval (0 for n < 2)."""
    x = np.asarray([v for v in values if not math.isnan(v)], dtype=np.float64)
    if len(x) == 0:
        return float("nan"), float("nan")
    if len(x) < 2:
        return float(x.mean()), 0.0
    half = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    return float(x.mean()), float(half)


def aggregate(runs: Sequence[dict[str, float]]) -> dict[str, float]:
    """Mean over runs of every metric, plus ``<metric>_ci95`` half-widths."""
    out: dict[str, float] = {}
    extra = [k for k in (runs[0] if runs else {}) if k not in RUN_METRICS]
    for key in (*RUN_METRICS, *extra):
        mean, half = mean_ci95([r[key] for r in runs])
        out[key] = mean
        out[f"{key}_ci95"] = half
    return out
