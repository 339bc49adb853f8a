"""``optimus-truth``: Optimus's greedy on the simulator's *true* speed surfaces — a reference, not deployable.

(Called ``oracle`` until issue 36; that name still works and warns. It is no
optimum: a greedy heuristic handed the true type surfaces, weaker than the
planner on the shipped configs.)

It is :class:`~dl2ray.schedulers.optimus.scheduler.Optimus`'s allocation (every job, in
arrival order, gets 1 worker + 1 PS while they fit; then, repeatedly, the one
worker or PS over all jobs with the largest ``(R/f(p, w) − R/f(p', w')) / s``,
``s`` the dominant share of the added task, until nothing gains, fits or is
below a cap) with two things Optimus has to learn handed to it:

- ``f`` = the speed the simulator uses for a job alone with every task on a
  node of its own (:meth:`dl2ray.speed.SpeedModel.nominal_batches_per_second`:
  the measured surfaces, or the analytic model under ``speed.model: analytic``);
- ``R`` = the declared remaining epochs (true ones when ``workload.epoch_error``
  is 0, as in the shipped configs).

No live cluster knows its jobs' speed functions exactly, so it only shows how
far a scheduler is from what a well-informed greedy reaches; tables and JSON
mark it ``reference``. Placement effects, variation and interference stay
unknown to it.
"""

from __future__ import annotations

from dl2ray.errors import UserError
from dl2ray.measurements import load_surfaces
from dl2ray.schedulers.optimus.scheduler import Greedy
from dl2ray.speed import SpeedModel, config_placement
from dl2ray.view import Allocation, ClusterView


class OptimusTruth:
    name = "optimus-truth"
    placement = "optimus"  # Optimus's rule, with its placement
    reference = True

    def __init__(self, speed: SpeedModel) -> None:
        self.speed = speed
        self._cost: dict[tuple[int, int, int], float] = {}

    @classmethod
    def from_config(cls, cfg) -> OptimusTruth:
        if cfg is None:
            raise UserError("optimus-truth reads the config's speed model: give a config")
        surfaces = load_surfaces(cfg.surfaces_dir) if cfg.speed.model == "measured" else None
        return cls(SpeedModel(cfg.catalogue, surfaces, cfg.speed.model, cfg.speed.placement_aware,
                              config_placement(cfg)))

    def seconds_per_epoch(self, t: int, p: int, w: int) -> float:
        """``1 / f_t(p, w)`` (s per epoch) from the true nominal speed; cached."""
        key = (t, p, w)
        v = self._cost.get(key)
        if v is None:
            jt = self.speed.catalogue.types[t]
            eps = self.speed.nominal_batches_per_second(t, p, w) / jt.batches_per_epoch
            v = self._cost[key] = 1.0 / eps if eps > 0 else float("inf")
        return v

    def decide(self, view: ClusterView) -> Allocation:
        placer = view.placer()
        greedy = Greedy(view, self.seconds_per_epoch)
        order = sorted(range(len(view.jobs)), key=lambda i: (view.jobs[i].arrival_slot, view.jobs[i].job_id))
        for i in order:
            job = view.jobs[i]
            if placer.place_bundle(job.job_id, job.worker_demand, job.ps_demand):
                greedy.add_job(i, job.remaining_epochs)
        greedy.run(placer)
        return placer.allocation()
