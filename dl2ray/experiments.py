"""Running schedulers over traces: the engine behind ``simulate`` and ``compare``.

Every (scheduler, trace seed) pair is one independent run; runs go to a
process pool (one process per core) when there is more than one. Trace
``i`` of a comparison is generated with seed ``seed + i`` (or is the fixed
``--trace`` file, with ``seed + i`` driving only the simulator's noise), so
every scheduler sees the same traces.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

from dl2ray.config import ExperimentConfig
from dl2ray.metrics import aggregate, summarize_run
from dl2ray.schedulers.base import make_scheduler
from dl2ray.sim import RunResult, Simulator, run_episode
from dl2ray.speed import SpeedModel, load_surfaces
from dl2ray.workload import Trace

_SPEED_MODELS: dict[tuple[str, str, str, bool], SpeedModel] = {}


def _speed_model(cfg: ExperimentConfig) -> SpeedModel:
    """The config's speed model, built once per process for the same catalogue and surfaces.

    (Keyed on paths and flags, not on the config object: configs hold numpy arrays,
    which make pydantic equality ambiguous.)
    """
    key = (str(cfg.resolve(cfg.jobtypes).resolve()), str(cfg.surfaces_dir.resolve()),
           cfg.speed.model, cfg.speed.placement_aware)
    if key not in _SPEED_MODELS:
        surfaces = load_surfaces(cfg.surfaces_dir) if cfg.speed.model == "measured" else None
        _SPEED_MODELS[key] = SpeedModel(cfg.catalogue, surfaces, cfg.speed.model,
                                        cfg.speed.placement_aware)
    return _SPEED_MODELS[key]


def build_simulator(
    cfg: ExperimentConfig, trace: Trace | None = None, record_events: bool = False
) -> Simulator:
    """The composition of config, measured speed model and (optional) fixed trace."""
    return Simulator(cfg, _speed_model(cfg), trace, record_events)


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


def run_one(
    cfg: ExperimentConfig, spec: RunSpec, trace: Trace | None, keep_result: bool = False
) -> RunOutcome:
    sim = build_simulator(cfg, trace, record_events=keep_result)
    scheduler = make_scheduler(spec.scheduler, cfg)
    result = run_episode(sim, scheduler, spec.seed)
    return RunOutcome(
        spec.scheduler, spec.seed, summarize_run(result), result.jct,
        result if keep_result else None,
    )


@dataclass
class Comparison:
    """Per scheduler: every run and the aggregate (mean ± 95% CI over traces)."""

    config: str
    seeds: list[int]
    slot_seconds: float
    runs: dict[str, list[RunOutcome]] = field(default_factory=dict)

    def summary(self) -> list[dict[str, float | str]]:
        rows: list[dict] = []
        for name, runs in self.runs.items():
            row: dict = {"scheduler": name, **aggregate([r.metrics for r in runs])}
            rows.append(row)
        base = self.runs.get("drf")
        if base:
            drf = aggregate([r.metrics for r in base])
            for row in rows:
                for key in ("avg_jct", "p95_jct", "makespan"):
                    row[f"{key}_vs_drf"] = row[key] / drf[key] if drf[key] else float("nan")
        return rows


def compare(
    cfg: ExperimentConfig,
    schedulers: Sequence[str],
    seeds: Sequence[int],
    trace: Trace | None = None,
    processes: int | None = None,
    on_done: Callable[[RunOutcome], None] | None = None,
) -> Comparison:
    """Run every scheduler on every seed's trace; results keep the scheduler order."""
    specs = [RunSpec(s, seed) for s in schedulers for seed in seeds]
    for s in schedulers:  # fail fast on a bad name, before any process starts
        make_scheduler(s, cfg)
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
    comp = Comparison(cfg.name, list(seeds), cfg.sim.slot_seconds)
    for s in schedulers:
        comp.runs[s] = [outcomes[RunSpec(s, seed)] for seed in seeds]
    return comp
