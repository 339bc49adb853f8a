"""How every learner judges a policy: the greedy policy's average JCT on held-out traces, and a heuristic's on
the same traces (the reference every run is compared with)."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from dl2ray.config import ExperimentConfig
from dl2ray.learn.records import RLResult, ValidationRow


def validate(cfg: ExperimentConfig, policy, trace_seeds: list[int]) -> float:
    """Average over ``trace_seeds`` of the greedy policy's average JCT (slots), unfinished jobs
    counted until the run stopped (:func:`dl2ray.evaluation.metrics.censored_avg_jct`); ``policy`` is the
    torch network of either architecture."""
    from dl2ray.evaluation.metrics import censored_avg_jct
    from dl2ray.policy.shape_net import numpy_policy
    from dl2ray.schedulers.base import on_cluster
    from dl2ray.schedulers.dl2 import DL2Scheduler
    from dl2ray.sim import run_episode
    from dl2ray.world import build_simulator

    sim = build_simulator(cfg)
    sched = on_cluster(DL2Scheduler.from_policy(numpy_policy(policy)), cfg)  # a shared cluster: its queues
    return float(np.mean([censored_avg_jct(run_episode(sim, sched, s)) for s in trace_seeds]))


def heuristic_jct(cfg: ExperimentConfig, name: str, trace_seeds: list[int]) -> float:
    """Average JCT (slots) of heuristic ``name`` on ``trace_seeds``, counted as in :func:`validate`."""
    from dl2ray.evaluation.metrics import censored_avg_jct
    from dl2ray.schedulers.base import make_scheduler
    from dl2ray.sim import run_episode
    from dl2ray.world import build_simulator

    sim = build_simulator(cfg)
    runs = [censored_avg_jct(run_episode(sim, make_scheduler(name, cfg), s)) for s in trace_seeds]
    return float(np.mean(runs))


class Validated(Protocol):
    """What :func:`validation_row` reads of a trainer."""

    @property
    def updates(self) -> int: ...

    val_cfg: ExperimentConfig
    val_seeds: list[int]
    policy: Any
    result: RLResult


def validation_row(trainer: Validated) -> ValidationRow:
    """A trainer's validation now (:func:`validate` of its policy on its validation traces), recorded in
    its result and returned: what both trainers' ``validate()`` is."""
    row = ValidationRow(trainer.updates, validate(trainer.val_cfg, trainer.policy, trainer.val_seeds))
    trainer.result.validation.append(row)
    return row
