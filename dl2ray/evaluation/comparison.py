"""Running schedulers over traces: the engine behind ``simulate`` and ``compare``.

Every (scheduler, trace seed) pair is one independent run; runs go to a
process pool (one process per core) when there is more than one. Trace
``i`` of a comparison is generated with seed ``seed + i`` (or is the fixed
``--trace`` file, with ``seed + i`` driving only the simulator's noise), so
every scheduler sees the same traces.

References (``references=True``) add the per-trace lower bound
(:mod:`dl2ray.evaluation.references`) as a row named :data:`LOWER_BOUND`; rows of
references (the lower bound, and schedulers with ``reference = True`` such as
``oracle``) carry ``"reference": true``: they read the simulator's truth and
cannot be deployed.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from dl2ray.config import ExperimentConfig
from dl2ray.evaluation.metrics import aggregate, mean_ci95, summarize_run
from dl2ray.schedulers.base import is_reference, make_scheduler
from dl2ray.sim import RunResult, run_episode
from dl2ray.workload import Trace
from dl2ray.world import build_simulator, speed_model

LOWER_BOUND = "lower-bound"
"""Row name of the per-trace lower bound (every job alone at its best configuration)."""
LOWER_BOUND_PLACEMENT = "best"
"""The lower bound's ``placement``: each job's best layout on the cluster's nodes."""

@dataclass(frozen=True)
class RunSpec:
    scheduler: str
    seed: int


@dataclass
class RunOutcome:
    scheduler: str
    seed: int
    metrics: dict[str, float]
    jct: dict[int, float]
    result: RunResult | None = None
    placement: str = ""
    """The placement policy the scheduler decided under (:mod:`dl2ray.schedulers.placed`)."""


def run_one(
    cfg: ExperimentConfig, spec: RunSpec, trace: Trace | None, keep_result: bool = False
) -> RunOutcome:
    sim = build_simulator(cfg, trace, record_events=keep_result)
    scheduler = make_scheduler(spec.scheduler, cfg)
    result = run_episode(sim, scheduler, spec.seed)
    metrics = summarize_run(result)
    log = getattr(scheduler, "log", None)
    if cfg.tenancy is not None and log is not None:  # a shared cluster: per-queue metrics too
        from dl2ray.evaluation.tenancy import flat, queue_metrics

        queues = {j.job_id: j.queue or cfg.tenancy.queues[0].name for j in sim.trace}
        metrics.update(flat(queue_metrics(result, queues, log, cfg.tenancy, cfg.cluster.capacity)))
    return RunOutcome(
        spec.scheduler, spec.seed, metrics, result.jct,
        result if keep_result else None,
        str(getattr(scheduler, "placement_label", None) or getattr(scheduler, "placement", "")),
    )


@dataclass
class Comparison:
    """Per scheduler: every run and the aggregate (mean ± 95% CI over traces)."""

    config: str
    seeds: list[int]
    slot_seconds: float
    runs: dict[str, list[RunOutcome]] = field(default_factory=dict)
    references: set[str] = field(default_factory=set)
    lower_bound: list[dict[str, float]] | None = None
    """Per seed: :func:`lower_bound_metrics` of that trace (None: not computed)."""
    paired: tuple[str, ...] = ("drf",)
    """Baselines of the paired ratios in :meth:`summary` (those that ran)."""

    def per_trace(self, name: str, key: str = "censored_avg_jct") -> list[float]:
        """``key`` of scheduler (or :data:`LOWER_BOUND`) ``name`` on each seed, in seed order."""
        if name == LOWER_BOUND and self.lower_bound is not None:
            return [m[key] for m in self.lower_bound]
        return [r.metrics[key] for r in self.runs[name]]

    def paired_ratio(self, name: str, baseline: str) -> dict[str, float | list[float]]:
        """Per trace ``censored_avg_jct(name) / censored_avg_jct(baseline)`` on the same trace, and its
        mean ± 95% Student-t half-width over the traces: the paired comparison (every scheduler runs the
        same traces, so the trace-to-trace spread cancels)."""
        a, b = self.per_trace(name), self.per_trace(baseline)
        ratios = [x / y if y else float("nan") for x, y in zip(a, b, strict=True)]
        mean, half = mean_ci95(ratios)
        return {"mean": mean, "ci95": half, "per_trace": ratios}

    def summary(self) -> list[dict[str, float | str | bool]]:
        """One row per scheduler (and the lower bound, last): mean ± 95% CI of every metric.

        ``avg_jct_vs_drf`` is the ratio of *censored* average JCTs, i.e. over
        the same job set (every job of the traces), which equals the ratio of
        ``avg_jct`` when every job finished; ``p95_jct_vs_drf`` and
        ``makespan_vs_drf`` are over finished jobs.
        """
        rows: list[dict] = []
        for name, runs in self.runs.items():
            row: dict = {"scheduler": name, "reference": name in self.references,
                         "placement": runs[0].placement if runs else "",
                         **aggregate([r.metrics for r in runs])}
            rows.append(row)
        if self.lower_bound is not None:
            rows.append({"scheduler": LOWER_BOUND, "reference": True, "placement": LOWER_BOUND_PLACEMENT,
                         **aggregate(self.lower_bound)})
        for row in rows:
            row["paired"] = {b: self.paired_ratio(str(row["scheduler"]), b)
                             for b in self.paired if b in self.runs}
        base = self.runs.get("drf")
        if base:
            drf = aggregate([r.metrics for r in base])
            pairs = (("avg_jct", "censored_avg_jct"), ("p95_jct", "p95_jct"),
                     ("makespan", "makespan"))
            for row in rows:
                for name, key in pairs:
                    row[f"{name}_vs_drf"] = row[key] / drf[key] if drf[key] else float("nan")
        return rows


def compare(
    cfg: ExperimentConfig,
    schedulers: Sequence[str],
    seeds: Sequence[int],
    trace: Trace | None = None,
    processes: int | None = None,
    on_done: Callable[[RunOutcome], None] | None = None,
    references: bool = False,
    paired: Sequence[str] = ("drf",),
) -> Comparison:
    """Run every scheduler on every seed's trace; results keep the scheduler order.

    ``references``: also compute the per-trace lower bound (a row after the schedulers).
    ``paired``: baselines every row gets per-trace paired ratios against (:meth:`Comparison.paired_ratio`).
    """
    specs = [RunSpec(s, seed) for s in schedulers for seed in seeds]
    reference_names = set()
    for s in schedulers:  # fail fast on a bad name, before any process starts
        if is_reference(s) or getattr(make_scheduler(s, cfg), "reference", False):
            reference_names.add(s)
    procs = processes or min(len(specs), os.cpu_count() or 1)
    outcomes: dict[RunSpec, RunOutcome] = {}
    if procs <= 1:
        for spec in specs:
            outcomes[spec] = run_one(cfg, spec, trace)
            if on_done:
                on_done(outcomes[spec])
    else:
        # spawn, not fork: a parent that has run torch (loading a dl2: checkpoint) holds OpenMP
        # threads, and a forked child can deadlock in them.
        with ProcessPoolExecutor(max_workers=procs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {pool.submit(run_one, cfg, spec, trace): spec for spec in specs}
            for fut, spec in futures.items():
                outcomes[spec] = fut.result()
                if on_done:
                    on_done(outcomes[spec])
    comp = Comparison(cfg.name, list(seeds), cfg.sim.slot_seconds, references=reference_names,
                      paired=tuple(paired))
    for s in schedulers:
        comp.runs[s] = [outcomes[RunSpec(s, seed)] for seed in seeds]
    if references:
        comp.lower_bound = [lower_bound_metrics(cfg, seed, trace) for seed in seeds]
    return comp


def lower_bound_metrics(cfg: ExperimentConfig, seed: int, trace: Trace | None = None) -> dict[str, float]:
    """The lower bound of one trace (the fixed one, or the config's trace of ``seed``) as run metrics.

    JCT metrics are of the per-job bounds; ``makespan`` is the latest
    ``arrival + LB_j``; ``queueing_delay`` is 0; the utilisations, which a
    bound does not have, are NaN. ``censored_avg_jct`` bounds the schedulers'
    censored averages: each ``LB_j`` is cut at ``sim.max_slots − arrival_j``
    (where a run stops at the latest), and ``unfinished`` counts the jobs whose
    bound lies beyond it — jobs no scheduler can finish within the horizon.
    """
    from dl2ray.evaluation.references import lower_bound_jcts
    from dl2ray.traces.generate import generate_trace

    if trace is None:
        trace = generate_trace(cfg, seed)
    bound = lower_bound_jcts(trace, speed_model(cfg), cfg.cluster.capacity, cfg.sim.slot_seconds, seed,
                             cfg.speed.job_deviation, cfg.speed.variation)
    jct = np.array([bound[j.job_id] for j in trace])
    horizon = np.array([cfg.sim.max_slots - j.arrival_slot for j in trace], dtype=np.float64)
    late = int(np.sum(jct > horizon))
    hours = cfg.sim.slot_seconds / 3600.0
    nan = float("nan")
    return {
        "avg_jct": float(jct.mean()), "median_jct": float(np.median(jct)),
        "p95_jct": float(np.percentile(jct, 95)), "avg_jct_hours": float(jct.mean() * hours),
        "makespan": float(max(j.arrival_slot + bound[j.job_id] for j in trace)),
        "gpu_util": nan, "cpu_util": nan, "queueing_delay": 0.0,
        "jobs": float(len(trace)), "completed": float(len(trace) - late), "unfinished": float(late),
        "censored_avg_jct": float(np.minimum(jct, np.maximum(horizon, 0.0)).mean()),
    }
