"""Federated A3C on Ray: updates flow from two agents, a killed agent comes back, the global actor resumes."""

from __future__ import annotations

import numpy as np
import pytest
from support import small_config

from clusters.a3c import A3COptions, A3CRun, GlobalPolicy
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


@pytest.mark.ray
def test_two_agents_train_and_survive_a_killed_agent(ray_session, tmp_path) -> None:
    ray = ray_session
    run = A3CRun(TINY, None, agents=2, seed=0, checkpoint=tmp_path / "a3c.pt", options=OPTS)
    try:
        first = run.train(4, chunk=2)
        assert first >= 4
        before = ray.get(run.gp.stats.remote())["per_agent"]
        assert set(before) == {0, 1}
        ray.kill(run.agents[0], no_restart=False)
        after = run.train(first + 6, chunk=2)
        assert after >= first + 6
        rep = ray.get(run.agents[0].run.remote(1))  # Ray restarted the killed agent
        assert rep.incarnation == 1 and rep.pushed == 1 and rep.last_update >= first
        per_agent = ray.get(run.gp.stats.remote())["per_agent"]
        assert per_agent[0] > before[0]
        assert (tmp_path / "a3c.pt").exists()
    finally:
        run.shutdown()


@pytest.mark.ray
def test_restarted_global_policy_resumes_from_its_checkpoint(ray_session, tmp_path) -> None:
    ray = ray_session
    ckpt = tmp_path / "global.pt"
    gp = GlobalPolicy.remote(TINY, None, 0, str(ckpt), 2)
    try:
        _, w0 = ray.get(gp.get_weights.remote())
        rng = np.random.default_rng(0)
        counts = [ray.get(gp.apply_gradients.remote(rng.normal(size=w0.size).astype(np.float32), 7))
                  for _ in range(4)]
        assert counts == [1, 2, 3, 4]
        updates, w4 = ray.get(gp.get_weights.remote())
        assert updates == 4
        ray.kill(gp, no_restart=False)
        stats = ray.get(gp.stats.remote())  # queued until the actor is back
        assert stats == {"updates": 4, "per_agent": {7: 4}, "resumed": True}
        _, w_back = ray.get(gp.get_weights.remote())
        np.testing.assert_array_equal(w_back, w4)
        assert not np.array_equal(w4, w0)
        assert ray.get(gp.apply_gradients.remote(np.zeros(w0.size, np.float32), 7)) == 5
    finally:
        ray.kill(gp, no_restart=True)
