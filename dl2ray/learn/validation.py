"""How every learner judges a policy: the greedy policy's average JCT on held-out traces, and a heuristic's on
the same traces (the reference every run is compared with)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from dl2ray.config import ExperimentConfig
from dl2ray.learn.records import RLResult, ValidationRow
from dl2ray.workload import Trace

if TYPE_CHECKING:
    from dl2ray.sim import Simulator


def episodes(cfg: ExperimentConfig, trace_seeds: Sequence[int],
             traces: Sequence[Trace] | None = None) -> list[tuple[Simulator, int]]:
    """``(simulator, seed)`` per validation run: the trace each seed generates; with fixed ``traces``
    (Parquet files: ``train rl --val-trace``) every trace with every seed, the seed drawing only the
    noise and each job's hidden factors."""
    from dl2ray.world import build_simulator

    if not traces:
        sim = build_simulator(cfg)
        return [(sim, s) for s in trace_seeds]
    return [(sim, s) for sim in (build_simulator(cfg, t) for t in traces) for s in trace_seeds]


def validate(cfg: ExperimentConfig, policy, trace_seeds: Sequence[int],
             traces: Sequence[Trace] | None = None) -> float:
    """Average over the runs of :func:`episodes` of the greedy policy's average JCT (slots), unfinished
    jobs counted until the run stopped (:func:`dl2ray.evaluation.metrics.censored_avg_jct`); ``policy``
    is the torch network of either architecture."""
    from dl2ray.evaluation.metrics import censored_avg_jct
    from dl2ray.policy.shape_net import numpy_policy
    from dl2ray.schedulers.base import on_cluster
    from dl2ray.schedulers.dl2 import DL2Scheduler
    from dl2ray.sim import run_episode

    sched = on_cluster(DL2Scheduler.from_policy(numpy_policy(policy)), cfg)  # a shared cluster: its queues
    return float(np.mean([censored_avg_jct(run_episode(sim, sched, s))
                          for sim, s in episodes(cfg, trace_seeds, traces)]))


def heuristic_jct(cfg: ExperimentConfig, name: str, trace_seeds: Sequence[int],
                  traces: Sequence[Trace] | None = None) -> float:
    """Average JCT (slots) of heuristic ``name`` on the runs of :func:`episodes`, counted as in
    :func:`validate`."""
    from dl2ray.evaluation.metrics import censored_avg_jct
    from dl2ray.schedulers.base import make_scheduler
    from dl2ray.sim import run_episode

    runs = [censored_avg_jct(run_episode(sim, make_scheduler(name, cfg), s))
            for sim, s in episodes(cfg, trace_seeds, traces)]
    return float(np.mean(runs))


def read_traces(cfg: ExperimentConfig, paths: Sequence[str]) -> list[Trace] | None:
    """The Parquet traces at ``paths`` on ``cfg``'s catalogue (None when there are none)."""
    if not paths:
        return None
    from dl2ray.traces.parquet import read_trace

    return [read_trace(p, cfg.catalogue) for p in paths]


class Validated(Protocol):
    """What :func:`validation_row` reads of a trainer."""

    @property
    def updates(self) -> int: ...

    val_cfg: ExperimentConfig
    val_seeds: list[int]
    val_traces: list[Trace] | None  # fixed validation traces (each with every seed); None: generated
    policy: Any
    result: RLResult


def validation_row(trainer: Validated) -> ValidationRow:
    """A trainer's validation now (:func:`validate` of its policy on its validation traces), recorded in
    its result and returned: what both trainers' ``validate()`` is."""
    row = ValidationRow(trainer.updates, validate(trainer.val_cfg, trainer.policy, trainer.val_seeds,
                                                  trainer.val_traces))
    trainer.result.validation.append(row)
    return row
