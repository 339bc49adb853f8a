"""The headroom references (dl2ray/studies/headroom.py, planner-job-truth): what they promise, checked."""

from __future__ import annotations

import numpy as np
import pytest
from support import small_config

from dl2ray.evaluation.comparison import RunSpec, run_one
from dl2ray.evaluation.metrics import censored_avg_jct
from dl2ray.schedulers.base import make_scheduler
from dl2ray.sim import run_episode
from dl2ray.studies.headroom import SearchSettings, place_counts, search_episode
from dl2ray.view import Tasks
from dl2ray.world import build_simulator

SMALL = small_config(cluster={"nodes": [{"count": 4, "cpu": 8, "gpu": 2, "mem": 48}]},
                     workload={"num_jobs": 8, "epoch_error": 0.2,
                               "arrivals": {"pattern": "poisson", "rate": 1.0, "max_per_slot": 3}},
                     speed={"job_deviation": 0.2, "variation": 0.05}, sim={"max_slots": 200})


@pytest.mark.parametrize("seed", [2_000_000, 2_000_001, 2_000_002])
def test_search_to_the_end_on_the_own_future_is_never_worse_than_the_planner(seed):
    """Exact rollout improvement: the planner's own choice is a candidate scored by the planner's own
    continuation, so the searched run's total JCT cannot exceed the planner's on the same trace."""
    planner = run_one(SMALL, RunSpec("planner", seed), None).metrics["censored_avg_jct"]
    run = search_episode(SMALL, seed, SearchSettings(horizon=None), np.random.default_rng(0))
    assert censored_avg_jct(run.result) <= planner + 1e-9
    assert all(n >= 1 for n in run.candidates) and len(run.changed) == run.result.slots


def test_search_with_redrawn_futures_runs_and_scores_every_candidate_on_the_same_futures():
    run = search_episode(SMALL, 2_000_000, SearchSettings(horizon=3, futures=2), np.random.default_rng(1))
    assert run.result.slots > 0 and len(run.result.end_time) == len(run.result.arrival)
    assert SearchSettings(horizon=3, futures=2).label == "search:planner:h3:2-futures"
    assert SearchSettings(horizon=None).label == "search:planner:hend:own-future"


def test_place_counts_rebuilds_the_planners_counts_and_refuses_what_breaks_caps_or_does_not_fit():
    sim = build_simulator(SMALL)
    view = sim.reset(2_000_000)
    while len(view.jobs) < 2:
        view = sim.step(make_scheduler("planner", SMALL).decide(view)).view
    planned = make_scheduler("planner", SMALL).decide(view)
    placed = place_counts(view, dict(planned.tasks), "optimus")
    assert placed is not None and dict(placed.tasks) == dict(planned.tasks)
    job = view.jobs[0]
    assert place_counts(view, {job.job_id: Tasks(job.max_workers + 1, 1)}, "optimus") is None
    assert place_counts(view, {job.job_id: Tasks(1, 0)}, "optimus") is None
    huge = {j.job_id: Tasks(j.max_workers, j.max_ps) for j in view.jobs}  # 4 nodes cannot hold every cap
    assert place_counts(view, huge, "load_balancing") is None


def test_planner_job_truth_is_planner_truth_when_jobs_do_not_deviate_and_differs_when_they_do():
    plain = small_config(speed={"job_deviation": 0.0})
    for cfg, same in ((plain, True), (SMALL, False)):
        runs = [run_episode(build_simulator(cfg), make_scheduler(name, cfg), 2_000_003)
                for name in ("planner-truth", "planner-job-truth")]
        assert (runs[0].end_time == runs[1].end_time) is same
