"""The twin a learner fits from what its cluster showed (dl2ray.learn.shape.twin): what it knows, and not."""

from __future__ import annotations

import numpy as np
import pytest
from support import tiny_shape_config

from dl2ray import seeds
from dl2ray.learn.shape.twin import ObservedTwin, TwinExperience, observed_trace
from dl2ray.policy.shape import ShapeEncoding
from dl2ray.policy.shape_net import NumpyShapePolicy, build_shape_policy
from dl2ray.schedulers.base import make_scheduler
from dl2ray.sim import run_episode
from dl2ray.world import build_simulator, speed_model

CFG = tiny_shape_config()


def _cluster_episode(seed: int = seeds.training(1)[0], max_slots: int | None = None):
    cfg = CFG if max_slots is None else CFG.model_copy(
        update={"sim": CFG.sim.model_copy(update={"max_slots": max_slots})})
    sim = build_simulator(cfg)
    run_episode(sim, make_scheduler("drf", cfg), seed)
    return sim


def test_observed_trace_keeps_what_a_submission_and_a_job_end_show() -> None:
    sim = _cluster_episode()
    seen = observed_trace(sim)
    assert [j.job_id for j in seen] == [j.job_id for j in sim.trace]  # every job finished
    for obs, true in zip(seen, sim.trace, strict=True):
        assert (obs.job_type, obs.arrival_slot, obs.est_epochs) == (true.job_type, true.arrival_slot,
                                                                     true.est_epochs)
        assert obs.true_epochs == pytest.approx(sim.finished[true.job_id].done)  # the epochs it trained


def test_a_job_still_running_counts_its_declared_epochs_and_unseen_jobs_are_absent() -> None:
    sim = _cluster_episode(max_slots=3)
    seen = {j.job_id: j for j in observed_trace(sim)}
    assert set(seen) == set(sim.jobs) | set(sim.finished)  # no job that had not arrived
    for jid, job in sim.jobs.items():
        assert seen[jid].true_epochs == max(job.spec.est_epochs, job.done)


def test_the_twin_replays_in_the_operators_world_with_its_own_draws() -> None:
    cluster = _cluster_episode()
    twin = ObservedTwin(CFG, window=2, salt=3)
    with pytest.raises(ValueError, match="observed no episode"):
        twin.episode(0)
    twin.observe(cluster)
    sim = twin.simulators(1)[0]
    assert sim.speed is speed_model(CFG, "operator") and sim.speed is not cluster.speed
    seed, trace = twin.episode(0)
    assert seeds.which(seed) == "twin" and trace == observed_trace(cluster)
    sim.reset(seed, trace)
    while not sim.done:
        sim.step(make_scheduler("drf", CFG).decide(sim.view()))
    factors = {j: sim.finished[j].factors for j in sim.finished}
    truth = {j: cluster.finished[j].factors for j in cluster.finished}
    assert factors.keys() == truth.keys() and all(factors[j] != truth[j] for j in truth)


def test_the_window_keeps_the_newest_observations() -> None:
    twin = ObservedTwin(CFG, window=2)
    traces = [twin.observe(_cluster_episode(s)) for s in seeds.training(3)]
    assert twin.observed == 3 and list(twin.traces) == traces[1:]
    assert [twin.episode(k)[1] for k in range(3)] == [traces[1], traces[2], traces[1]]
    assert len({twin.episode(k)[0] for k in range(5)}) == 5  # fresh twin draws per episode


def test_observed_experience_runs_its_cluster_then_tries_in_the_twin() -> None:
    enc = ShapeEncoding.from_config(CFG)
    policy = NumpyShapePolicy(build_shape_policy(enc, (16,), 8, 0))
    exp = TwinExperience(CFG, seeds.training(2), np.random.default_rng(0), "observed", window=4,
                         observe_every=2)
    for _ in range(3):
        data = exp.collect(policy)
        assert len(data.slots) == 3 and data.rollouts > 0
    assert exp.twin is not None and exp.twin.observed == 2 and len(exp.cluster_jct) == 2  # updates 1 and 3
    assert all(sim.speed is speed_model(CFG, "operator") for sim in exp.collector.sims)


def test_bad_twin_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="twin"):
        TwinExperience(CFG, seeds.training(1), np.random.default_rng(0), "truth")
    with pytest.raises(ValueError, match="window"):
        ObservedTwin(CFG, window=0)


def test_live_observations_build_the_window_a_live_scheduler_saw() -> None:
    from dl2ray.learn.shape.twin import LiveObservations

    sim = build_simulator(CFG)
    view = sim.reset(seeds.training(1)[0])
    obs = LiveObservations(window_slots=1000)
    seen_done: dict[int, float] = {}
    drf = make_scheduler("drf", CFG)
    while not sim.done:
        obs.see(view)
        seen_done.update({j.job_id: j.done_epochs for j in view.jobs})
        view = sim.step(drf.decide(view)).view
    obs.see(view)
    trace = obs.trace()
    assert {j.job_id for j in trace} == set(seen_done)
    start = min(j.arrival_slot for j in sim.trace if j.job_id in seen_done)
    for job in trace:
        true = next(t for t in sim.trace if t.job_id == job.job_id)
        assert job.arrival_slot == true.arrival_slot - start and job.est_epochs == true.est_epochs
        assert job.true_epochs == max(true.est_epochs, seen_done[job.job_id])  # no hidden length
    assert LiveObservations(5).trace() == ()


def test_the_live_window_forgets_old_finished_jobs() -> None:
    from dl2ray.learn.shape.twin import LiveObservations

    sim = build_simulator(CFG)
    view = sim.reset(seeds.training(1)[0])
    obs = LiveObservations(window_slots=2)
    drf = make_scheduler("drf", CFG)
    while not sim.done:
        obs.see(view)
        view = sim.step(drf.decide(view)).view
    obs.see(view)
    assert all(j.arrival_slot >= 0 for j in obs.trace())
    assert all(seen.arrival >= obs.slot - 2 or not seen.finished for seen in obs.jobs.values())
