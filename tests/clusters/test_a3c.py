"""Federated A3C on Ray: updates flow from two agents, a killed agent comes back, the global actor resumes."""

from __future__ import annotations

import time

import numpy as np
import pytest
from support import small_config

from clusters.a3c import A3COptions, A3CRun
from clusters.backend import ClusterBackend
from clusters.sim_backend import SimBackend
from dl2ray.learn import seeds

TINY = small_config(
    cluster={"nodes": [{"count": 3, "cpu": 8, "gpu": 2, "mem": 48}]},
    workload={"num_jobs": 5, "arrivals": {"pattern": "poisson", "rate": 1.0, "max_per_slot": 2}},
    policy={"window": 6, "hidden": [32], "minibatch": 32},
    sim={"max_slots": 150},
)
OPTS = A3COptions(traces=3, checkpoint_every=2)


def test_sim_backend_follows_the_protocol() -> None:
    from dl2ray.view import Allocation

    backend = SimBackend.from_config(TINY)
    assert isinstance(backend, ClusterBackend)
    view = backend.reset(seeds.training(1)[0])
    nxt, reward, done = backend.step(Allocation({}))
    assert nxt.slot == view.slot + 1 and reward == 0.0 and not done


def _stats_after_restart(ray, gp, tries: int = 600) -> dict:
    """``stats()`` of the restarted actor (ray.kill is asynchronous: the old one may still answer)."""
    for _ in range(tries):
        st = ray.get(gp.stats.remote())
        if st["resumed"]:
            return st
        time.sleep(0.1)
    raise AssertionError("the GlobalPolicy did not come back from its checkpoint")


@pytest.fixture(scope="module")
def a3c_run(ray_session, tmp_path_factory):
    """One GlobalPolicy and two agents shared by this module's Ray tests (actor start-up is the slow part)."""
    run = A3CRun(TINY, None, agents=2, seed=0, checkpoint=tmp_path_factory.mktemp("a3c") / "a3c.pt",
                 options=OPTS)
    yield run
    run.shutdown()


@pytest.mark.ray
def test_two_agents_train_and_survive_a_killed_agent(ray_session, a3c_run) -> None:
    ray, run = ray_session, a3c_run
    first = run.train(4, chunk=2)
    assert first >= 4
    before = ray.get(run.gp.stats.remote())["per_agent"]
    assert set(before) == {0, 1}
    ray.kill(run.agents[0], no_restart=False)
    after = run.train(first + 6, chunk=2)  # training goes on while Ray restarts the agent
    assert after >= first + 6
    rep = ray.get(run.agents[0].run.remote(1))  # the killed agent is back, with fresh state
    assert rep.incarnation == 1 and rep.pushed == 1 and rep.last_update >= first
    assert ray.get(run.gp.stats.remote())["per_agent"][0] > before[0]


@pytest.mark.ray
def test_restarted_global_policy_resumes_from_its_checkpoint(ray_session, a3c_run) -> None:
    ray, run = ray_session, a3c_run
    run.train(run.updates() + 2, chunk=1)
    _, w = ray.get(run.gp.get_weights.remote())
    while ray.get(run.gp.stats.remote())["updates"] % OPTS.checkpoint_every:  # end on a checkpoint
        ray.get(run.gp.apply_gradients.remote(np.ones(w.size, np.float32), 9))
    before = ray.get(run.gp.stats.remote())
    updates, weights = ray.get(run.gp.get_weights.remote())
    assert not before["resumed"] and updates == before["updates"]
    ray.kill(run.gp, no_restart=False)
    after = _stats_after_restart(ray, run.gp)
    assert after == {**before, "resumed": True}
    _, back = ray.get(run.gp.get_weights.remote())
    np.testing.assert_array_equal(back, weights)
    assert run.train(updates + 2, chunk=1) >= updates + 2  # the agents push to the restarted actor
