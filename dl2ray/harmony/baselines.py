"""Harmony's baselines: FIFO job order, each job placed whole, task by task, by a node score.

Each slot the running jobs stay where they are (:func:`dl2ray.gang.sim.keep_running`); waiting
jobs are taken in arrival order and each is started if all its workers and PS can be placed
now (no head-of-line blocking). A task goes to the fitting node with the best score:

- ``lb-place``: least loaded (the placer's dominant-share load balancing);
- ``tetris-place``: best alignment ``Σ_r d_r/C_r · f_{n,r}/C_{n,r}`` of the task's demand
  ``d`` with the node's free resources ``f`` (Tetris, Grandl et al. 2014), ties to lower load;
- ``lif-linear``: least interference first under a *linear* pairwise model: placing a task of
  type ``t`` on a node hosting ``n_{t'}`` foreign tasks of each type costs
  ``Σ_{t'} (c_{t,t'} + c_{t',t}) n_{t'}`` (:mod:`dl2ray.harmony.linear`), ties to lower load.

- ``pack-place`` (not one of Harmony's baselines; added because a job's own tasks never slow
  each other here): the job's tasks fill the nodes in one order fixed when the job starts —
  least loaded first — so a job sits on as few, as empty nodes as fit it.

All need a gang-mode config; ``lif-linear`` fits its coefficients when built
(on logged random, LB and Tetris placements of training traces, never on the test
traces). Logging them runs the simulator's truth (its interference), so ``lif-linear``
is a reference: it gets the whole config and its rows are marked so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from dl2ray.errors import UserError
from dl2ray.gang.sim import keep_running
from dl2ray.view import Allocation, ClusterView, JobPlacement, JobView, Tasks

_EPS = 1e-9
Score = Callable[[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray], np.ndarray]
"""(type index, task demand (3,), free (N, 3), capacity (N, 3), type counts (N, L)) → score (N,);
the lowest wins."""


def load_of(free: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """Shape (N,): dominant used share of each node."""
    inv = np.divide(1.0, cap, out=np.zeros_like(cap), where=cap > 0)
    return ((cap - free) * inv).max(axis=1)


def lb_score(t, d, free, cap, counts) -> np.ndarray:
    return load_of(free, cap)


def tetris_score(t, d, free, cap, counts) -> np.ndarray:
    total = cap.sum(axis=0)
    inv = np.divide(1.0, cap, out=np.zeros_like(cap), where=cap > 0)
    align = ((d / np.where(total > 0, total, 1.0)) * free * inv).sum(axis=1)
    return -align + 1e-6 * load_of(free, cap)


def linear_score(coef: np.ndarray) -> Score:
    """``lif-linear``'s score with coefficients ``coef`` (L, L): ``c[t, t']`` = slowdown of a
    type-``t`` task per foreign type-``t'`` task on its node."""

    def score(t, d, free, cap, counts) -> np.ndarray:
        return counts @ (coef[t] + coef[:, t]) + 1e-6 * load_of(free, cap)

    return score


def task_type_counts(view: ClusterView, placement: dict[int, JobPlacement]) -> np.ndarray:
    """Shape (N, L): tasks of each job type on each node under ``placement``."""
    counts = np.zeros((view.num_nodes, len(view.catalogue)))
    types = {j.job_id: j.type_index for j in view.jobs}
    for job_id, pl in placement.items():
        for node in (*pl.worker_nodes, *pl.ps_nodes):
            counts[node, types[job_id]] += 1
    return counts


def place_job(
    job: JobView, free: np.ndarray, cap: np.ndarray, counts: np.ndarray, score: Score
) -> JobPlacement | None:
    """Place every task of ``job`` (workers and PS alternating) by ``score``, or None (no change)."""
    assert job.fixed_tasks is not None
    free, counts = free.copy(), counts.copy()
    nodes: dict[str, list[int]] = {"worker": [], "ps": []}
    size = job.fixed_tasks
    for i in range(max(size.workers, size.ps)):
        for role, d, n in (("worker", job.worker_demand, size.workers), ("ps", job.ps_demand, size.ps)):
            if i >= n:
                continue
            fits = np.all(free + _EPS >= d, axis=1)
            if not fits.any():
                return None
            s = np.where(fits, score(job.type_index, d, free, cap, counts), np.inf)
            node = int(np.argmin(s))
            free[node] -= d
            counts[node, job.type_index] += 1
            nodes[role].append(node)
    return JobPlacement(tuple(nodes["worker"]), tuple(nodes["ps"]))


class WaitingJobsPlacer:
    """Gang mode's decision, written once for every placement scheduler (the baselines, the planner,
    Harmony's policy): the running jobs stay where they are (:func:`dl2ray.gang.sim.keep_running`); each
    waiting job, in the view's (arrival) order, starts where :meth:`place_waiting` puts all of its tasks
    now, or waits (no head-of-line blocking). What a scheduler keeps over the running jobs' placement
    while it places (type counts, a :class:`~dl2ray.harmony.policy.Placed`) is its :meth:`begin`'s."""

    name = "waiting-jobs"

    def decide(self, view: ClusterView) -> Allocation:
        tasks, placement, free = keep_running(view)
        state = self.begin(view, placement)
        for job in view.jobs:
            if job.workers > 0 or job.fixed_tasks is None:
                continue
            pl = self.place_waiting(job, free, view.capacity, state)
            if pl is None:
                continue
            tasks[job.job_id] = Tasks(*job.fixed_tasks)
            placement[job.job_id] = pl
            for node in pl.worker_nodes:
                free[node] -= job.worker_demand
            for node in pl.ps_nodes:
                free[node] -= job.ps_demand
        return Allocation(tasks, placement)

    def begin(self, view: ClusterView, placement: dict[int, JobPlacement]) -> Any:
        """The state :meth:`place_waiting` updates, over the running jobs' ``placement``."""
        return None

    def place_waiting(self, job: JobView, free: np.ndarray, cap: np.ndarray,
                      state: Any) -> JobPlacement | None:
        """Nodes for every task of the waiting ``job`` given ``free`` (N, 3) (not changed here), or None:
        it waits. A placement returned is taken (``state`` gains it)."""
        raise NotImplementedError


class FifoPlacer(WaitingJobsPlacer):
    """FIFO job order, whole-job placement by ``score`` (see the module docstring)."""

    reference = False  # True for lif-linear, whose fit reads the simulator's truth

    def __init__(self, name: str, score: Score) -> None:
        self.name, self.score = name, score

    def _place_one(self, job: JobView, free: np.ndarray, cap: np.ndarray, counts: np.ndarray):
        return place_job(job, free, cap, counts, self.score)

    def begin(self, view: ClusterView, placement: dict[int, JobPlacement]) -> np.ndarray:
        return task_type_counts(view, placement)

    def place_waiting(self, job: JobView, free: np.ndarray, cap: np.ndarray,
                      counts: np.ndarray) -> JobPlacement | None:
        pl = self._place_one(job, free, cap, counts)
        if pl is not None:
            for node in (*pl.worker_nodes, *pl.ps_nodes):
                counts[node, job.type_index] += 1
        return pl


def _need_gang(cfg) -> None:
    if cfg is None or getattr(cfg, "gang", None) is None:
        raise UserError(
            "Harmony's placement schedulers need a gang-mode config (a `gang:` group, "
            "e.g. configs/harmony.yaml)"
        )


def factory(name: str):
    """Registry loader for the placers named in the module docstring and ``random-place``."""

    def build(arg, cfg):
        _need_gang(cfg)
        if name == "lb-place":
            return FifoPlacer(name, lb_score)
        if name == "tetris-place":
            return FifoPlacer(name, tetris_score)
        if name == "random-place":
            return RandomPlacer(int(arg or 0))
        if name == "pack-place":
            return PackPlacer()
        from dl2ray.harmony.linear import fitted_coefficients

        placer = FifoPlacer(name, linear_score(fitted_coefficients(cfg)))
        placer.reference = True
        return placer

    # lif-linear fits its interference model on logs of random, LB and Tetris placements, which the
    # simulator can only produce by running its truth (a real cluster's history would be the operator's
    # logs; no file of them exists here): it is a reference, built with the whole config
    build.reads_truth = name == "lif-linear"  # type: ignore[attr-defined]
    return build


class RandomPlacer(FifoPlacer):
    """FIFO order, each task on a uniformly random fitting node (the reward model's exploration data)."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.rng = np.random.default_rng([seed, 0xA11D])
        super().__init__("random-place", self._random)

    def reset(self, seed: int) -> None:
        self.rng = np.random.default_rng([self.seed, seed, 0xA11D])

    def _random(self, t, d, free, cap, counts) -> np.ndarray:
        return self.rng.random(len(free))


class PackPlacer(FifoPlacer):
    """``pack-place``: nodes ranked by load when the job starts; each task on the first fitting one."""

    def __init__(self) -> None:
        super().__init__("pack-place", lb_score)

    rank = np.zeros(0)

    def _ranked(self, t, d, free, cap, counts) -> np.ndarray:
        return self.rank

    def _place_one(self, job, free, cap, counts):
        # rank 0 = least loaded now (ties: lower index); place_job then fills in that order
        order = np.argsort(load_of(free, cap), kind="stable")
        self.rank = np.empty(len(order))
        self.rank[order] = np.arange(len(order))
        return place_job(job, free, cap, counts, self._ranked)
