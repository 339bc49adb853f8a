"""A reward-model planner: for each starting job, the candidate placement with the best predicted
reward (``harmony-planner:PATH``; the warm-start teacher ``--warm-start rm-planner``).

Candidates for a job (FIFO order, as every placer here): the placements of ``lb-place``,
``tetris-place``, ``pack-place``, bin packing (most loaded fitting node) and ``candidates``
random ones (the nodes in a random order, each task on the first fitting one: few random
nodes), all made by :func:`~dl2ray.harmony.baselines.place_job`; the winner maximises
:func:`~dl2ray.harmony.policy.placement_reward` (the reward model's predicted speed of the job
plus the predicted change of every job sharing a node with it) — Harmony's reward, used here
to *search* instead of only to train. It reads the reward model (learned from logged
placements), never the hidden interference.

With ``record``, each placed job's actions are replayed through Harmony's decision loop
(:meth:`~dl2ray.harmony.policy.HarmonyScheduler.place`) so that ``record(state, mask, action)``
sees exactly the steps the learned policy would see, and ``finish(job_id, R)`` the job's
predicted reward: imitation data.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from dl2ray.harmony.baselines import WaitingJobsPlacer, lb_score, load_of, place_job, tetris_score
from dl2ray.harmony.policy import HarmonyScheduler, Placed, placement_reward
from dl2ray.view import ClusterView, JobPlacement


def _packing(t, d, free, cap, counts) -> np.ndarray:
    return -load_of(free, cap)


class PlannerScheduler(WaitingJobsPlacer):
    """Best-of-candidates placement by the reward model ``predict`` (see the module docstring)."""

    name = "harmony-planner"

    def __init__(
        self,
        predict: Callable[[np.ndarray], np.ndarray],
        candidates: int = 16,
        seed: int = 0,
        max_nodes: int = 8,
        record: Callable[[np.ndarray, np.ndarray, int], None] | None = None,
        finish: Callable[[int, float], None] | None = None,
    ) -> None:
        self.predict, self.candidates, self.seed, self.max_nodes = predict, candidates, seed, max_nodes
        self.record, self.finish = record, finish
        self.rng = np.random.default_rng([seed, 0x91A7])

    def reset(self, seed: int) -> None:
        self.rng = np.random.default_rng([self.seed, seed, 0x91A7])

    def _random_order(self, servers: int):
        """A score that ranks the nodes in one random order for all of a job's tasks: each task goes
        to the first fitting node of that order, so the job fills few, random nodes."""
        order = self.rng.random(servers)
        return lambda t, d, free, cap, counts: order

    def best(self, job, free: np.ndarray, cap: np.ndarray, placed: Placed) -> JobPlacement | None:
        """The candidate with the highest predicted reward, or None if the job fits nowhere."""
        best, best_r = None, -np.inf
        randoms = [self._random_order(len(free)) for _ in range(self.candidates)]
        least_loaded_first = np.argsort(np.argsort(load_of(free, cap), kind="stable"), kind="stable")
        for score in [lb_score, tetris_score, _packing, lambda *a: least_loaded_first, *randoms]:
            pl = place_job(job, free, cap, placed.counts, score)
            if pl is None:
                continue
            placed.add(job.job_id, job.type_index, pl.worker_nodes, pl.ps_nodes)
            r = placement_reward(placed, job.job_id, self.predict)
            placed.remove(job.job_id)
            if r > best_r:
                best, best_r = pl, r
        return best

    def begin(self, view: ClusterView, placement: dict[int, JobPlacement]) -> Placed:
        return Placed.running(view, placement, self.max_nodes)

    def place_waiting(self, job, free: np.ndarray, cap: np.ndarray, placed: Placed) -> JobPlacement | None:
        pl = self.best(job, free, cap, placed)
        if pl is None:
            return None
        if self.record is not None:  # replay through Harmony's loop (it adds the job to placed)
            script = iter(_actions(pl, len(free)))
            follow = HarmonyScheduler(_replay(script), record=self.record, precheck=False)
            follow.place(job, free, cap, placed)
            if self.finish is not None:
                self.finish(job.job_id, placement_reward(placed, job.job_id, self.predict))
        else:
            placed.add(job.job_id, job.type_index, pl.worker_nodes, pl.ps_nodes)
        return pl


class PackTeacher(PlannerScheduler):
    """``pack-place``'s placements, replayed through Harmony's loop for imitation
    (``--warm-start pack-place``): the planner's recording with one candidate and no choice."""

    name = "pack-teacher"

    def best(self, job, free: np.ndarray, cap: np.ndarray, placed: Placed) -> JobPlacement | None:
        rank = np.argsort(np.argsort(load_of(free, cap), kind="stable"), kind="stable")
        return place_job(job, free, cap, placed.counts, lambda *a: rank)


def _actions(pl: JobPlacement, servers: int) -> list[int]:
    """``pl`` as Harmony's actions in :func:`place_job`'s order (worker, PS, worker, PS, …)."""
    out = []
    for i in range(max(len(pl.worker_nodes), len(pl.ps_nodes))):
        if i < len(pl.worker_nodes):
            out.append(pl.worker_nodes[i])
        if i < len(pl.ps_nodes):
            out.append(servers + pl.ps_nodes[i])
    return out


def _replay(actions: Iterator[int]) -> Callable[..., int]:
    """A Harmony chooser that answers each decision with the next of ``actions``."""
    return lambda *_: next(actions)


def load(arg: str | None, cfg) -> PlannerScheduler:
    """``harmony-planner:PATH``: the planner with the reward model of a ``train harmony`` checkpoint."""
    from pathlib import Path

    from dl2ray.errors import UserError
    from dl2ray.harmony.nets import max_nodes, numpy_reward_model, read_checkpoint

    if cfg is None or getattr(cfg, "gang", None) is None:
        raise UserError("harmony-planner needs a gang-mode config (e.g. configs/harmony.yaml)")
    if not arg or not Path(arg).is_file():
        raise UserError(f"harmony-planner needs a checkpoint: harmony-planner:PATH ({arg!r} is not a file)")
    ck = read_checkpoint(arg)
    if "node.0.weight" not in ck["rm"]:
        raise UserError(f"harmony-planner: {arg}: an older reward-model format; train a new one")
    return PlannerScheduler(numpy_reward_model(ck["rm"]), max_nodes=max_nodes(cfg))
