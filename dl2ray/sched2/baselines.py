"""SCHED²'s baselines: list schedulers over the waiting queue, every job placed by gang packing.

Each slot the running jobs are re-emitted where they are (:func:`dl2ray.gang.sim.keep_running`);
then the waiting jobs are started one at a time, the one with the smallest key first, each
that fits now (skipping those that do not: no head-of-line blocking), until none fits.
Keys (times in seconds, from profiled numbers a scheduler may read):

- ``sif``: ideal time ``T_ideal = est_epochs · compute_s`` (shortest ideal time first);
- ``dsif``: SIF, but a job that would not get its best locality (the fewest servers that
  can hold it) is passed over, at most 3 times (counted per decision it was passed over);
- ``saf``: actual time under the placement it would get now, ``T_ideal · λ(s)``;
- ``lrf``: GPUs (least resource first);
- ``spf``: GPUs × ``T_ideal`` (smallest product first);
- ``fifo-gang``: arrival (first in, first out, with packing).

Ties go to the earlier arrival, then the lower job id.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from dl2ray.errors import UserError
from dl2ray.gang.sim import gang_place, keep_running, locality_factor, usage_of
from dl2ray.view import Allocation, ClusterView, JobPlacement, JobView, Tasks


class Profile:
    """What SCHED² profiles per job type: mini-batch time at the best locality and the locality β."""

    def __init__(self, cfg) -> None:
        if cfg is None or getattr(cfg, "gang", None) is None:
            raise UserError(
                "SCHED² schedulers need a gang-mode config (a `gang:` group, e.g. configs/sched2.yaml)"
            )
        cat = cfg.catalogue
        self.compute_s = np.array([t.compute_s for t in cat.types])
        self.beta = np.array([cfg.gang.locality.get(n, 0.0) for n in cat.names])
        self.gpus_per_node = float(cfg.cluster.capacity[:, 1].max())

    def ideal_s(self, job: JobView) -> float:
        """Seconds the job's remaining mini-batches take at its best locality."""
        return job.remaining_epochs * float(self.compute_s[job.type_index])

    def actual_s(self, job: JobView, pl: JobPlacement) -> float:
        return self.ideal_s(job) * locality_factor(self.beta[job.type_index], len(set(pl.worker_nodes)))

    def best_servers(self, job: JobView) -> int:
        assert job.fixed_tasks is not None
        return max(1, math.ceil(job.fixed_tasks.workers / self.gpus_per_node))


Key = Callable[[JobView, JobPlacement, Profile], float]

KEYS: dict[str, Key] = {
    "sif": lambda j, pl, p: p.ideal_s(j),
    "dsif": lambda j, pl, p: p.ideal_s(j),
    "saf": lambda j, pl, p: p.actual_s(j, pl),
    "lrf": lambda j, pl, p: float(j.fixed_tasks.workers if j.fixed_tasks else 0),
    "spf": lambda j, pl, p: float(j.fixed_tasks.workers if j.fixed_tasks else 0) * p.ideal_s(j),
    "fifo-gang": lambda j, pl, p: float(j.arrival_slot),
}


class ListScheduler:
    """Start waiting jobs by ascending ``key`` while any fits (see the module docstring)."""

    def __init__(self, name: str, cfg, max_delays: int = 0) -> None:
        self.name = name
        self.key = KEYS[name]
        self.profile = Profile(cfg)
        self.max_delays = max_delays
        self._delays: dict[int, int] = {}

    def reset(self, seed: int) -> None:
        self._delays = {}

    def decide(self, view: ClusterView) -> Allocation:
        tasks, placement, free = keep_running(view)
        waiting = [j for j in view.jobs if j.workers == 0]
        passed: set[int] = set()
        while waiting:
            gpus_free = int(np.floor(free[:, 1].sum() + 1e-9))
            best = None
            for j in waiting:
                if j.fixed_tasks is None or j.fixed_tasks.workers > gpus_free or j.job_id in passed:
                    continue
                pl = gang_place(free, j, view.catalogue, view.placement)
                if pl is None:
                    continue
                cand = (self.key(j, pl, self.profile), j.arrival_slot, j.job_id)
                if best is None or cand < best[0]:
                    best = (cand, j, pl)
            if best is None:
                break
            _, job, pl = best
            relaxed = len(set(pl.worker_nodes)) > self.profile.best_servers(job)
            if self.max_delays and relaxed and self._delays.get(job.job_id, 0) < self.max_delays:
                self._delays[job.job_id] = self._delays.get(job.job_id, 0) + 1
                passed.add(job.job_id)
                continue
            size = job.fixed_tasks
            assert size is not None  # a gang job has one size
            tasks[job.job_id] = Tasks(size.workers, size.ps)
            placement[job.job_id] = pl
            free = free - usage_of(view.capacity, [job], lambda _j, pl=pl: pl)
            waiting.remove(job)
        return Allocation(tasks, placement)


def factory(name: str):
    """Registry loader for ``name`` (one of :data:`KEYS`)."""
    return lambda arg, cfg: ListScheduler(name, cfg, max_delays=3 if name == "dsif" else 0)
