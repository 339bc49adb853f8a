"""Counterfactual per-job policy optimisation (``train rl --algo counterfactual``) of the shape policy."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from support import run_cli, small_config

from dl2ray import seeds
from dl2ray.learn.records import RLOptions
from dl2ray.learn.shape.counterfactual import (
    Collected,
    CounterfactualCollector,
    Try,
    improve_policy,
    job_reward,
    solve_eta,
)
from dl2ray.learn.shape.sl import SlotSample
from dl2ray.learn.sl import SLRun, run_sl
from dl2ray.learn.train import train_rl
from dl2ray.policy.shape import ShapeEncoding, job_features
from dl2ray.policy.shape_decode import decide_shapes
from dl2ray.policy.shape_net import NumpyShapePolicy, build_shape_policy
from dl2ray.schedulers.base import make_scheduler
from dl2ray.schedulers.dl2 import DL2Scheduler
from dl2ray.world import build_simulator

TINY = small_config(
    cluster={"nodes": [{"count": 3, "cpu": 8, "gpu": 2, "mem": 48}]},
    workload={"num_jobs": 6, "arrivals": {"pattern": "poisson", "rate": 1.5, "max_per_slot": 3}},
    policy={"sl_traces": 2, "sl_val_traces": 1, "sl_epochs": 2, "sl_max_slots": 50,
            "shape": {"embed": [16], "head": 8, "envs": 2, "slots_per_update": 3, "jobs_per_slot": 2,
                      "samples": 2, "uniform": 1, "horizon": 4}},
    sim={"max_slots": 200},
)
ENC = ShapeEncoding.from_config(TINY)


def _net(seed=0):
    return build_shape_policy(ENC, (16,), 8, seed)


def test_advantages_are_against_the_greedy_row():
    t = Try(0, 0, np.ones(3, bool), np.array([2, 0, 1]), np.array([-5.0, -7.0, -4.5]))
    np.testing.assert_allclose(t.advantages, [0.0, -2.0, 0.5])


def test_solve_eta_meets_the_kl_limit():
    adv = [np.array([0.0, 1.0, -1.0]), np.array([0.0, 3.0])]
    prior = [np.array([0.6, 0.2, 0.2]), np.array([0.9, 0.1])]
    for eps in (0.01, 0.1, 0.5):
        eta = solve_eta(adv, prior, eps)
        kls = []
        for a, p in zip(adv, prior, strict=True):
            w = p * np.exp(a / eta)
            w /= w.sum()
            kls.append(np.sum(w * np.log(w / p)))
        assert np.mean(kls) == pytest.approx(eps, rel=0.05)


def _one_try_data(returns):
    """One slot with two resnet-50 jobs; job 0 tried with its greedy row and two others."""
    sim = build_simulator(TINY)
    view = sim.reset(seeds.training(1)[0])
    while len(view.jobs) < 2:
        view = sim.step(make_scheduler("drf", TINY).decide(view)).view
    net = _net()
    x, g = job_features(view, ENC)
    dec = decide_shapes(view, ENC, NumpyShapePolicy(net).logits(x, g))
    others = [k for k in np.flatnonzero(dec.masks[0]) if k != dec.actions[0]][:2]
    actions = np.array([dec.actions[0], *others])
    data = Collected([SlotSample(x, g, dec.masks, dec.actions)],
                     [Try(0, 0, dec.masks[0].copy(), actions, np.asarray(returns, float))], 3, 0.0)
    return net, data, actions


def _restricted(net, data, actions):
    with torch.no_grad():
        s = data.slots[0]
        logits = net(torch.from_numpy(s.x)[None], torch.ones(1, len(s.actions), dtype=torch.bool),
                     torch.from_numpy(s.g)[None])[0, 0]
    return torch.softmax(logits[torch.from_numpy(actions)], 0).numpy()


def test_the_update_moves_probability_to_the_better_row():
    net, data, actions = _one_try_data([-10.0, -6.0, -12.0])  # row 1 saves 4 job-slots, row 2 costs 2
    before = _restricted(net, data, actions)
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    st = improve_policy(net, opt, data, epochs=5, kl=0.2, entropy_weight=0.0)
    after = _restricted(net, data, actions)
    assert after[1] > before[1] and after[2] < before[2]
    assert st.kl == pytest.approx(0.2, rel=0.05) and st.mean_gain == 4.0 and st.better == 1.0


def test_the_control_moves_as_far_without_knowing_which_row_did_better():
    net, data, actions = _one_try_data([-10.0, -6.0, -12.0])
    real = improve_policy(net, torch.optim.Adam(net.parameters(), lr=1e-2), data, epochs=1, kl=0.2,
                          entropy_weight=0.0)
    moved = []
    for seed in range(6):
        net, data, actions = _one_try_data([-10.0, -6.0, -12.0])
        before = _restricted(net, data, actions)
        st = improve_policy(net, torch.optim.Adam(net.parameters(), lr=1e-2), data, epochs=1, kl=0.2,
                            entropy_weight=0.0, control=np.random.default_rng(seed))
        assert st.kl == pytest.approx(real.kl, rel=0.05)  # the same step size ...
        moved.append(int(np.argmax(_restricted(net, data, actions) - before)))
    assert len(set(moved)) > 1  # ... towards rows drawn at random, not always the best one


def _collector(seed=4):
    sims = [build_simulator(TINY) for _ in range(2)]
    s = TINY.policy.shape
    return CounterfactualCollector(sims, ENC, seeds.training(3), np.random.default_rng(seed), s.horizon,
                                   s.gamma, s.jobs_per_slot, s.samples, s.uniform, s.temperature), sims


def test_greedy_row_return_is_the_greedy_rollout_and_episodes_follow_the_greedy_policy():
    col, sims = _collector()
    policy = NumpyShapePolicy(_net(2))
    data = col.collect(policy, 1)
    # replay episode 0 by hand: the greedy decision, then horizon − 1 greedy slots
    sim = build_simulator(TINY)
    view = sim.reset(seeds.training(3)[0])
    sched = DL2Scheduler.from_policy(policy)
    res = sim.step(sched.decide(view))
    q, v = job_reward(sim, view), res.view
    for _ in range(TINY.policy.shape.horizon - 1):
        if res.done:
            break
        res = sim.step(sched.decide(v))
        q += job_reward(sim, v)
        v = res.view
    assert data.tries and all(t.returns[0] == pytest.approx(q) for t in data.tries)
    # the episode went on with the greedy decision: the collector's simulator is one slot in
    hand = build_simulator(TINY)
    first = hand.reset(seeds.training(3)[0])
    after = hand.step(sched.decide(first)).view
    def state(v):
        return [(j.job_id, j.done_epochs, j.workers, j.ps, j.worker_nodes, j.ps_nodes) for j in v.jobs]

    assert sims[0].slot == 1 and state(sims[0].view()) == state(after)


def test_collection_is_reproducible():
    a, _ = _collector(9)
    b, _ = _collector(9)
    policy = NumpyShapePolicy(_net(1))
    da, db = a.collect(policy, 3), b.collect(policy, 3)
    assert [(t.slot, t.job, t.actions.tolist(), t.returns.tolist()) for t in da.tries] == \
           [(t.slot, t.job, t.actions.tolist(), t.returns.tolist()) for t in db.tries]


def test_train_rl_counterfactual_writes_resumes_and_ships_a_shape_policy(tmp_path):
    sl = tmp_path / "sl.pt"
    run_sl(TINY, SLRun("drf", traces=2, val_traces=1, epochs=2, seed=0, max_slots=50, arch="shape"), out=sl)
    out = tmp_path / "rl.pt"
    opts = RLOptions(traces=2, val_traces=1, val_every=1, checkpoint_every=1, algo="counterfactual")
    _, res = train_rl(TINY, sl, 2, 0, out, opts)
    assert [v.update for v in res.validation] == [0, 1, 2] and res.updates == 2
    rec = json.loads(out.with_suffix(".json").read_text())
    assert rec["options"]["algo"] == "counterfactual" and rec["init"] == str(sl)
    assert all(r["tries"] > 0 for r in rec["history"])  # a CounterfactualRow per update
    _, again = train_rl(TINY, sl, 3, 0, out, opts, resume=True)
    assert again.updates == 3 and [h.update for h in again.history] == [1, 2, 3]
    assert DL2Scheduler(str(out.with_suffix(".best.pt")), TINY).arch == "shape"


def test_cli_refuses_mixed_architectures(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("name: t\njobtypes: " + str(TINY.base_dir) + "/jobtypes.yaml\n"
                   "cluster: {nodes: [{count: 2, cpu: 8, gpu: 2, mem: 48}]}\n")
    code, _, err = run_cli(capsys, "train", "sl", "--config", str(cfg), "--arch", "menu",
                           "--out", str(tmp_path / "x.pt"))
    assert code == 2 and "--arch" in err and "paper, shape" in err
    paper = tmp_path / "paper.pt"
    run_sl(TINY, SLRun("drf", traces=1, val_traces=1, epochs=1, seed=0, max_slots=20), out=paper)
    code, _, err = run_cli(capsys, "train", "rl", "--config", str(cfg), "--algo", "counterfactual",
                           "--init", str(paper), "--updates", "1", "--out", str(tmp_path / "rl.pt"))
    assert code == 2 and "'paper' checkpoint" in err and "--arch shape" in err
