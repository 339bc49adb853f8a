"""Planner: greedy allocation on *profiled* speeds — the strong, deployable teacher of DL2's warm start.

A cluster that profiles its job types (``dl2ray profile``: each type measured
at a few ``(PS, workers)`` points, with error; :mod:`dl2ray.knowledge.profile`) can plan
with that profile instead of learning speeds online as Optimus does. The
``planner`` reads only the operator's profile (the config's ``profile:``) and
the view (declared epochs), never the simulator: per-job speed deviations,
placement effects, variation and interference stay unknown to it.

``planner-truth`` is the same algorithm on the simulator's true type surfaces
(``configs/speed/``; ``planner-truth:optimus-fit``: Optimus's form fitted to
every real measurement) — a labelled reference, not deployable; it is what the
planner was before the operator's profile existed, so the ``*-clairvoyant``
configs reproduce the old numbers with it.

Per decision, for job ``j`` of type ``t`` with ``p`` PS and ``w`` workers and
``c_t(p, w)`` the seconds per epoch of the profile (or the truth):

1. jobs in order of remaining time at one bundle, ``R_j·c_t(1, 1)`` (shortest
   first; ties: arrival, id), get one worker + one PS while they fit;
2. then Optimus's greedy (:class:`~dl2ray.schedulers.optimus.scheduler.Greedy`) with the
   *relative* gain: repeatedly the one task (a worker or a PS of any job) that
   saves the largest fraction of its job's remaining time per unit of dominant
   share, ``(c_t(p, w) − c_t(p', w')) / c_t(p, w) / s``, is added, until no task
   shortens a job, every job is at its caps, or nothing fits.

The relative gain is what differs from Optimus's absolute ``R·(c − c')/s``
(which favours long jobs): halving a short job's time is worth as much as
halving a long one's, which is what a sum of completion times rewards
(testbed, 5 validation traces: 9.72 slots with it, 9.99 with the absolute gain).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import numpy as np

from dl2ray.errors import UserError
from dl2ray.schedulers.optimus.scheduler import Greedy
from dl2ray.view import Allocation, ClusterView

Profile = Literal["surfaces", "optimus-fit"]
Cost = Callable[[int, int, int], float]
"""``(type_index, ps, workers) -> seconds per epoch`` (inf when the job cannot train)."""


def operator_cost(cfg, path: str | None = None) -> Cost:
    """Seconds per epoch per ``(type_index, ps, workers)`` from the operator's profile: the file ``path``
    (``planner:FILE``), else the config's ``profile:``."""
    from dl2ray.knowledge.profile import config_profile, load_profile

    if path:
        prof = load_profile(path)
        prof.covers(cfg.catalogue, path)
    else:
        prof = config_profile(cfg)
    return prof.seconds_per_epoch(cfg.catalogue)


def profiled_cost(cfg, profile: str = "surfaces") -> Cost:
    """Seconds per epoch per ``(type_index, ps, workers)`` from the simulator's true speed files (cached):
    the reference ``planner-truth``."""
    from dl2ray.measurements import OPTIMUS_FILE, load_surfaces, optimus_speed

    cat = cfg.catalogue
    per_epoch = [t.batches_per_epoch for t in cat.types]
    if profile == "surfaces":
        surfaces = load_surfaces(cfg.surfaces_dir)
        table = [surfaces[t.name] for t in cat.types]

        def batches(t: int, p: int, w: int) -> float:
            return table[t](p, w)
    elif profile == "optimus-fit":
        path = Path(cfg.surfaces_dir) / OPTIMUS_FILE
        try:
            models = json.loads(path.read_text(encoding="utf-8"))["models"]
            theta = [np.asarray(models[t.name]["theta"], dtype=np.float64) for t in cat.types]
        except (OSError, KeyError, ValueError) as exc:
            raise UserError(f"{path}: cannot read Optimus speed fits: {exc}") from None
        sizes = [t.batch_size for t in cat.types]

        def batches(t: int, p: int, w: int) -> float:
            return float(optimus_speed(theta[t], p, w, sizes[t])[0])
    else:
        raise UserError(f"planner: unknown profile {profile!r}; known: surfaces, optimus-fit")
    cache: dict[tuple[int, int, int], float] = {}

    def cost(t: int, p: int, w: int) -> float:
        key = (t, p, w)
        v = cache.get(key)
        if v is None:
            eps = batches(t, p, w) / per_epoch[t] if p > 0 and w > 0 else 0.0
            v = cache[key] = 1.0 / eps if eps > 0 else float("inf")
        return v

    return cost


class Planner:
    """Shortest-first bundles, then the relative-gain greedy (see the module docstring)."""

    name = "planner"
    reference = False
    placement = "optimus"
    """Its own placement, chosen on validation (docs/notebook/2026-11-28.md, "Placement";
    bench_placers.py)."""

    def __init__(self, cost: Cost) -> None:
        self.cost = cost

    def job_cost(self, view: ClusterView) -> Cost:
        """``(i, ps, workers) -> seconds per epoch`` of the ``i``-th job of ``view``: its type's cost."""
        jobs = view.jobs
        return lambda i, p, w: self.cost(jobs[i].type_index, p, w)

    def decide(self, view: ClusterView) -> Allocation:
        placer = view.placer()
        jobs = view.jobs
        cost = self.job_cost(view)
        order = sorted(range(len(jobs)), key=lambda i: (
            jobs[i].remaining_epochs * cost(i, 1, 1), jobs[i].arrival_slot, jobs[i].job_id))
        greedy = Greedy(view, cost, relative=True, per_job=True)
        for i in order:
            job = jobs[i]
            if placer.place_bundle(job.job_id, job.worker_demand, job.ps_demand):
                greedy.add_job(i, job.remaining_epochs)
        greedy.run(placer)
        return placer.allocation()


class JobTruthPlanner(Planner):
    """``planner-job-truth`` (†): the planner given each job's *true* speed — its type's true surface and
    its own compute/communication factors (:func:`dl2ray.speed.job_factors`, drawn from the run's seed as
    the simulator draws them), at the spread layout the surfaces were measured on:
    ``c_j(p, w) = c_t(p, w) · (φ_t(p, w)·a_j + (1 − φ_t(p, w))·b_j)``. Declared epochs, placement and
    interference stay as the planner sees them: the headroom of knowing every job's speed exactly."""

    name = "planner-job-truth"
    reference = True

    def __init__(self, cfg) -> None:
        from dl2ray.world import speed_model

        super().__init__(profiled_cost(cfg, "surfaces"))
        self.speed = speed_model(cfg)
        self.deviation = float(cfg.speed.job_deviation)
        self.seed = 0

    def reset(self, seed: int) -> None:
        self.seed = seed

    def job_cost(self, view: ClusterView) -> Cost:
        from dl2ray.speed import deviation_divisor, job_factors, spread_layout

        jobs, speed = view.jobs, self.speed
        factors = [job_factors(self.seed, j.job_id, self.deviation) for j in jobs]

        def cost(i: int, p: int, w: int) -> float:
            t = jobs[i].type_index
            base = self.cost(t, p, w)
            if not np.isfinite(base):
                return base
            return base * deviation_divisor(speed.compute_fraction(t, spread_layout(w, p)), factors[i])
        return cost
