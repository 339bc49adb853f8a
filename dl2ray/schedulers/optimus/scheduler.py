"""Optimus: greedy marginal-gain allocation on online-fitted models.

Peng et al., "Optimus: An Efficient Dynamic Resource Scheduler for Deep
Learning Clusters", EuroSys 2018, §4. Everything it knows comes from the
view and what it observed (:mod:`dl2ray.schedulers.optimus.fit`), never from
the simulator's speed model.

Per decision:

1. remaining epochs ``R_j``: ``k* - done`` from the job's fitted loss curve
   (``k*`` at the convergence gap ``δ``), or ``est_epochs - done`` until the
   job has 3 loss points, when the fit is degenerate, or when the fit claims
   the job already converged (it has not, or it would not be in the view);
2. speed ``f_j(p, w)`` per job, as the paper fits it, from the job's own
   observations: once the job has run at :data:`OWN_FIT_POINTS` distinct
   ``(p, w)``, its own NNLS fit of Optimus's form; before that (the paper
   profiles a job with short sample runs at its start, for which a time-slotted
   cluster has no room) the fit of its *type* — every observation of every job
   of the type, a sublinear prior before two distinct ``(p, w)`` were seen, a
   type never seen scaled so a job of ``base_epochs`` takes as long as the mean
   of the seen types — scaled to the job's own observed step times when it has
   any. ``optimus:type`` is the per-type fit alone (the pre-issue-21 Optimus,
   which the clairvoyant world's numbers were measured with);
3. every job, in arrival order, gets 1 PS + 1 worker while they fit;
4. then, repeatedly, the single worker or PS over all jobs with the largest
   ``(R/f(p, w) - R/f(p', w')) / s`` is added, ``s`` the dominant share of
   the added task's demand of the cluster's capacity, until no addition
   shortens a job, every job is at its caps, or nothing fits. A heap keeps
   each job's best candidate; only the job that changed is re-scored.

Placement is the configured policy (the ``optimus`` policy lays jobs out by
the paper's principle; see :mod:`dl2ray.cluster`).
"""

from __future__ import annotations

import heapq

import numpy as np

from dl2ray.schedulers.observed import NewObservations
from dl2ray.schedulers.optimus.fit import (
    SpeedFit,
    convergence_epochs,
    fit_loss_curves,
    step_time,
)
from dl2ray.view import Allocation, ClusterView, JobView

DEFAULT_GAP = 0.01
OWN_FIT_POINTS = 3
"""Distinct ``(p, w)`` a job must have run at before Optimus fits its speed from its own points alone."""
_ROLES = ("worker", "ps")


class Optimus:
    """``per_job``: fit each job's speed (the paper); False: one fit per job type (``optimus:type``)."""

    name = "optimus"
    placement = "optimus"  # its paper's principle: a job's PS and workers spread evenly over the fewest nodes

    def __init__(self, convergence_gap: float = DEFAULT_GAP, per_job: bool = True) -> None:
        if not 0 < convergence_gap < 1:
            raise ValueError("convergence_gap must be in (0, 1)")
        self.gap = convergence_gap
        self.per_job = per_job
        self._new = NewObservations()
        self._speed: dict[int, SpeedFit] = {}
        self._job_speed: dict[int, SpeedFit] = {}
        self._kstar: dict[int, tuple[int, float | None]] = {}

    def reset(self, seed: int) -> None:
        self._new.reset()
        self._speed.clear()
        self._job_speed.clear()
        self._kstar.clear()

    # -- models -----------------------------------------------------------------------

    def observe(self, view: ClusterView) -> None:
        """Add the view's new observations to the per-type (and per-job) speed fits."""
        for job, new in self._new.by_job(view):
            points = [(p, w, e / s) for _, p, w, e, s, _ in new if e > 0 and s > 0]
            self._speed_fit(view, job.type_index).add_many(points)
            if self.per_job and points:
                batch = view.catalogue.types[job.type_index].batch_size
                self._job_speed.setdefault(job.job_id, SpeedFit(batch)).add_many(points)
        live = {j.job_id for j in view.jobs}
        self._kstar = {j: v for j, v in self._kstar.items() if j in live}
        self._job_speed = {j: v for j, v in self._job_speed.items() if j in live}

    def job_coefficients(self, job: JobView, type_coef: tuple[float, float, float, float]
                         ) -> tuple[float, float, float, float]:
        """Step-time coefficients of ``job`` (module docstring, step 2) given its type's."""
        own = self._job_speed.get(job.job_id)
        if own is None:
            return type_coef
        if own.points >= OWN_FIT_POINTS:
            return own.coefficients(1.0)
        scale = own.mean_ratio(lambda p, w: step_time(type_coef, p, w))
        return (type_coef[0] * scale, type_coef[1] * scale, type_coef[2] * scale, type_coef[3] * scale)

    def _speed_fit(self, view: ClusterView, t: int) -> SpeedFit:
        fit = self._speed.get(t)
        if fit is None:
            fit = self._speed[t] = SpeedFit(view.catalogue.types[t].batch_size)
        return fit

    def coefficients(self, view: ClusterView) -> list[tuple[float, float, float, float]]:
        """Per catalogue type: step-time coefficients (see ``SpeedFit``)."""
        base = [t.base_epochs for t in view.catalogue.types]
        seen = [
            base[t] * step_time(fit.coefficients(1.0), 1, 1)
            for t, fit in self._speed.items() if fit.observed
        ]
        t_ref = sum(seen) / len(seen) if seen else 1.0
        return [
            self._speed_fit(view, t).coefficients(t_ref / base[t]) for t in range(len(base))
        ]

    def fit_convergence(self, view: ClusterView) -> None:
        """Refit the loss curve of every job with new loss points (one batch)."""
        stale = [
            j for j in view.jobs
            if self._kstar.get(j.job_id, (-1, None))[0] != len(j.history)
        ]
        fits = fit_loss_curves(
            [np.cumsum([o.epochs for o in j.history]) for j in stale],
            [np.array([o.loss for o in j.history]) for j in stale],
        )
        for job, fit in zip(stale, fits, strict=True):
            kstar = None if fit is None else convergence_epochs(fit[0], fit[1], self.gap)
            self._kstar[job.job_id] = (len(job.history), kstar)

    def remaining_epochs(self, job: JobView) -> float:
        """``k* - done`` from the loss fit, else the declared remaining epochs.

        Uses the fit of the last :meth:`fit_convergence`.
        """
        kstar = self._kstar.get(job.job_id, (0, None))[1]
        if kstar is None or kstar <= job.done_epochs:
            return job.remaining_epochs
        return kstar - job.done_epochs

    # -- allocation ---------------------------------------------------------------------

    def decide(self, view: ClusterView) -> Allocation:
        self.observe(view)
        self.fit_convergence(view)
        coef = self.coefficients(view)
        if self.per_job:
            jobs = [self.job_coefficients(j, coef[j.type_index]) for j in view.jobs]
            greedy = Greedy(view, lambda i, p, w: step_time(jobs[i], p, w) / w, per_job=True)
        else:
            greedy = Greedy(view, lambda t, p, w: step_time(coef[t], p, w) / w)
        placer = view.placer()
        for i in sorted(range(len(view.jobs)), key=lambda i: _arrival(view.jobs[i])):
            job = view.jobs[i]
            if placer.place_bundle(job.job_id, job.worker_demand, job.ps_demand):
                greedy.add_job(i, self.remaining_epochs(job))
        greedy.run(placer)
        return placer.allocation()


def _arrival(job: JobView) -> tuple[int, int]:
    return job.arrival_slot, job.job_id


def task_shares(view: ClusterView) -> list[tuple[float, float]]:
    """Per catalogue type: dominant share of one worker and of one PS in the cluster's capacity."""
    total = view.total_capacity
    mask = total > 0
    return [
        (float(np.max(wd[mask] / total[mask])), float(np.max(pd[mask] / total[mask])))
        for wd, pd in zip(view.catalogue.worker_demand, view.catalogue.ps_demand, strict=True)
    ]


class Greedy:
    """Step 4 of the module docstring, in plain floats (no numpy in the loop).

    ``seconds_per_epoch(type_index, ps, workers)`` is the speed model the
    gains are computed with: Optimus's fitted one, or the simulator's true
    surfaces for the ``oracle`` reference; with ``per_job`` its first argument
    is the job's index in the view (a model per job). ``relative``: the gain is the
    *fraction* of the job's remaining time saved, ``(c − c')/c / s`` with
    ``c`` the seconds per epoch, instead of the seconds saved ``R·(c − c')/s``
    (the planner's rule: it does not favour long jobs).
    """

    def __init__(self, view: ClusterView, seconds_per_epoch, relative: bool = False,
                 per_job: bool = False) -> None:
        self.view = view
        self.cost = seconds_per_epoch
        self.relative = relative
        self.per_job = per_job  # the cost's first argument: the job's index in the view, not its type
        self.dom = task_shares(view)
        self.heap: list[tuple[float, int, int, int, int]] = []
        self.tasks: dict[int, list[int]] = {}  # job index -> [workers, ps]
        self.remaining: dict[int, float] = {}
        self.blocked: dict[int, set[int]] = {}

    def add_job(self, i: int, remaining: float) -> None:
        self.tasks[i] = [1, 1]
        self.remaining[i] = remaining
        self.blocked[i] = set()
        self._push(i)

    def _push(self, i: int) -> None:
        job = self.view.jobs[i]
        w, p = self.tasks[i]
        t = i if self.per_job else job.type_index
        now = self.cost(t, p, w)
        dom_w, dom_p = self.dom[job.type_index]
        best, role = 0.0, -1
        if 0 not in self.blocked[i] and w < job.max_workers:
            gain = (now - self.cost(t, p, w + 1)) / max(dom_w, 1e-12)
            best, role = (gain, 0) if gain > best else (best, role)
        if 1 not in self.blocked[i] and p < job.max_ps:
            gain = (now - self.cost(t, p + 1, w)) / max(dom_p, 1e-12)
            best, role = (gain, 1) if gain > best else (best, role)
        if role >= 0:
            gain = best / now if self.relative else best * self.remaining[i]
            heapq.heappush(self.heap, (-gain, job.arrival_slot, job.job_id, role, i))

    def run(self, placer) -> None:
        while self.heap:
            _, _, job_id, role, i = heapq.heappop(self.heap)
            job = self.view.jobs[i]
            demand = job.worker_demand if role == 0 else job.ps_demand
            if placer.place(job_id, _ROLES[role], demand) is None:
                self.blocked[i].add(role)
            else:
                self.tasks[i][role] += 1
            self._push(i)
