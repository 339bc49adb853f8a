"""How much better than the planner can a scheduler of the same action space be? Search on top of it (†).

The parity target of issue 37 ("DL2 ≤ 0.975× the planner") only makes sense
if there is room below the planner for a policy that chooses each job's
workers and PS every slot. This module measures that room with a reference
that reads the simulator — it snapshots and rewinds it, so it is never
deployable and its rows are marked †:

**search** — at each slot ``t`` with view ``s_t``:

1. the planner decides; its counts ``T_0`` (job → (workers, PS));
2. every one-task change of one job's counts
   (:func:`dl2ray.learn.shape.search.shape_moves`: one worker or PS more or
   fewer, a job with nothing gets ``(1, 1)``) is placed by the planner's own
   placer (:func:`place_counts`; a change that does not fit is dropped);
3. each candidate ``T`` (``T_0`` included) is scored from the simulator's
   snapshot (common random numbers) by applying it and letting the planner
   decide the next ``horizon − 1`` slots (to the end of the run with
   ``horizon=None``): ``q(T) = −Σ_{h<H} Σ_{j in system at t+h} min(1, end_j − (t+h))``,
   minus the job-slots spent in the system, whose sum over a whole run is
   minus the total JCT;
4. the best candidate is applied (``T_0`` on ties) and the run goes on.

Two ways to score (step 3):

- ``futures=0`` — on the trace's *own* future (which jobs arrive when, the
  noise draws): hindsight no scheduler has, so an optimistic bound. With
  ``horizon=None`` it is a rollout-improvement of the planner evaluated exactly,
  so its run is never worse than the planner's on that trace (the planner's
  own choice is always a candidate whose score is the planner's continuation);
- ``futures=F`` — the mean over ``F`` redrawn futures
  (:func:`dl2ray.learn.shape.search.redraw_future`: the jobs still to arrive
  replaced by another draw of the workload, the noise re-seeded), the same
  ``F`` for every candidate of the slot: the honest estimate of what knowing
  the present (but not the future) is worth.

Beside it, ``planner-job-truth`` (:class:`dl2ray.schedulers.planner.JobTruthPlanner`,
a registered reference) gives the planner each job's true speed.
``tests/bench/bench_headroom.py`` runs both on validation traces.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dl2ray.config import ExperimentConfig
from dl2ray.evaluation.metrics import summarize_run
from dl2ray.learn.shape.search import redraw_future, shape_moves
from dl2ray.schedulers.base import make_scheduler
from dl2ray.sim import RunResult, SimSnapshot, Simulator
from dl2ray.view import Allocation, ClusterView, Tasks
from dl2ray.workload import Trace
from dl2ray.world import build_simulator


@dataclass(frozen=True)
class SearchSettings:
    """``horizon``: slots each candidate is rolled out (None: to the end of the run); ``futures``: 0 scores on
    the trace's own future, F > 0 on the mean of F redrawn ones; ``base``: the scheduler searched on top of
    and rolled out (a registry name)."""

    horizon: int | None = 10
    futures: int = 0
    base: str = "planner"

    @property
    def label(self) -> str:
        h = "end" if self.horizon is None else str(self.horizon)
        scored = "own-future" if self.futures == 0 else f"{self.futures}-futures"
        return f"search:{self.base}:h{h}:{scored}"


@dataclass
class SearchRun:
    """One searched run: its result, and per slot how many candidates were scored and whether one won."""

    result: RunResult
    candidates: list[int]
    changed: list[bool]

    @property
    def metrics(self) -> dict[str, float]:
        return summarize_run(self.result)


def place_counts(view: ClusterView, tasks: dict[int, Tasks], policy: str) -> Allocation | None:
    """``tasks`` placed by ``policy``'s placer on ``view`` (jobs in ``tasks``' order, each its first worker
    and PS as a bundle, then the rest); None if a job is outside its caps or some task does not fit."""
    placer = view.placer(policy)
    for job_id, t in tasks.items():
        job = view.job(job_id)
        if not (1 <= t.workers <= job.max_workers and 1 <= t.ps <= job.max_ps):
            return None
        if not placer.place_bundle(job_id, job.worker_demand, job.ps_demand):
            return None
        for _ in range(t.workers - 1):
            if placer.place(job_id, "worker", job.worker_demand) is None:
                return None
        for _ in range(t.ps - 1):
            if placer.place(job_id, "ps", job.ps_demand) is None:
                return None
    return placer.allocation()


def jobs_in_system(sim: Simulator, view: ClusterView) -> float:
    """After ``sim`` stepped the slot of ``view``: minus the job-slots its jobs spent in the system that slot
    (a job that finished within it counts the fraction it was there)."""
    end = sim.result.end_time
    return -sum(min(1.0, end[j.job_id] - view.slot) if j.job_id in end else 1.0 for j in view.jobs)


def rollout_return(sim: Simulator, view: ClusterView, allocation: Allocation, base,
                   horizon: int | None) -> float:
    """``q``: ``allocation`` now, then ``base`` deciding, for ``horizon`` slots in all (None: to the end)."""
    res = sim.step(allocation)
    q = jobs_in_system(sim, view)
    steps = 1
    while not res.done and (horizon is None or steps < horizon):
        now = res.view
        res = sim.step(base.decide(now))
        q += jobs_in_system(sim, now)
        steps += 1
    return q


def _score(sim: Simulator, snap: SimSnapshot, view: ClusterView, allocation: Allocation, base,
           s: SearchSettings, futures: list[tuple[int, int]]) -> float:
    if not futures:
        sim.restore(snap)
        return rollout_return(sim, view, allocation, base, s.horizon)
    total = 0.0
    for trace_seed, noise_seed in futures:
        sim.restore(snap)
        redraw_future(sim, trace_seed, noise_seed)
        total += rollout_return(sim, view, allocation, base, s.horizon)
    return total / len(futures)


def search_episode(cfg: ExperimentConfig, seed: int, s: SearchSettings, rng: np.random.Generator,
                   trace: Trace | None = None) -> SearchRun:
    """One run of the search reference (module docstring) on the true simulator of ``cfg``'s trace ``seed``.

    ``rng`` draws the redrawn futures' seeds (far from every seed set this project uses).
    """
    sim = build_simulator(cfg, trace)
    base = make_scheduler(s.base, cfg)
    policy = str(getattr(base, "placement", None) or cfg.cluster.default_placement)
    view = sim.reset(seed)
    if hasattr(base, "reset"):
        base.reset(seed)
    candidates: list[int] = []
    changed: list[bool] = []
    while not sim.done:
        planned = base.decide(view)
        snap = sim.snapshot()
        futures = [(int(a), int(b)) for a, b in rng.integers(900_000_000, 999_999_999, size=(s.futures, 2))]
        best, best_q = planned, _score(sim, snap, view, planned, base, s, futures)
        scored = 1
        for moved in shape_moves(view, dict(planned.tasks)):
            allocation = place_counts(view, moved, policy)
            if allocation is None:
                continue
            scored += 1
            q = _score(sim, snap, view, allocation, base, s, futures)
            if q > best_q + 1e-9:
                best, best_q = allocation, q
        sim.restore(snap)
        candidates.append(scored)
        changed.append(best is not planned)
        view = sim.step(best).view
    return SearchRun(sim.result, candidates, changed)
