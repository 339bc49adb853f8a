"""Rollout policy improvement (``train rl --algo improve``) and the simulator snapshots it stands on."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
from support import small_config

from dl2ray import seeds
from dl2ray.learn.improve import ImitationBuffer, ImprovementCollector, _Deviate
from dl2ray.learn.records import RLOptions
from dl2ray.learn.rl import Trainer
from dl2ray.policy.decision import decide_slot, run_decision
from dl2ray.policy.encoding import Encoding
from dl2ray.policy.network import NumpyPolicy, build_networks
from dl2ray.schedulers.base import make_scheduler
from dl2ray.world import build_simulator

TINY = small_config(
    cluster={"nodes": [{"count": 3, "cpu": 8, "gpu": 2, "mem": 48}]},
    workload={"num_jobs": 6, "arrivals": {"pattern": "poisson", "rate": 1.5, "max_per_slot": 3}},
    policy={"window": 6, "hidden": [32],
            "improve": {"envs": 2, "slots_per_update": 2, "points": 2, "alternatives": 3, "horizon": 3,
                        "batches": 2, "batch_size": 16}},
    sim={"max_slots": 200},
)
ENC = Encoding.from_config(TINY)


def _mid_run(sim, seed=1_000_003, slots=2):
    drf = make_scheduler("drf", TINY)
    view = sim.reset(seed)
    for _ in range(slots):
        view = sim.step(drf.decide(view)).view
    return view


def test_snapshot_restore_replays_the_same_future():
    sim = build_simulator(TINY)
    view = _mid_run(sim)
    planner, drf = make_scheduler("planner", TINY), make_scheduler("drf", TINY)
    snap = sim.snapshot()

    def future(first):
        out = [sim.step(first.decide(view)).reward]
        while not sim.done:
            out.append(sim.step(drf.decide(sim.view())).reward)
        return out, dict(sim.result.end_time), list(sim.result.rewards)

    a = future(planner)
    sim.restore(snap)
    other = sim.step(drf.decide(view)).reward  # a different branch in between
    sim.restore(snap)
    assert future(planner) == a
    assert other != a[0][0]


def test_deviation_takes_the_forced_action_then_follows_the_greedy_policy():
    policy, _ = build_networks(ENC, TINY.policy.hidden, 3)
    npol = NumpyPolicy.from_torch(policy)
    view = _mid_run(build_simulator(TINY))
    greedy = decide_slot(view, npol, ENC, record=True, fast=False)
    assert len(greedy.steps) >= 2
    step = greedy.steps[1]
    other = int(np.flatnonzero(step.mask & (np.arange(len(step.mask)) != step.action))[0])
    dev = run_decision(view, ENC, _Deviate(npol, 1, other), record=True)
    assert [s.action for s in dev.steps[:1]] == [greedy.steps[0].action]
    assert dev.steps[1].action == other
    same = run_decision(view, ENC, _Deviate(npol, 1, step.action), record=True)
    assert same.allocation.tasks == greedy.allocation.tasks


def _collector(select="best", seed=0, horizon=3, reward="jobs"):
    return ImprovementCollector([build_simulator(TINY) for _ in range(2)], ENC, seeds.training(3), 3,
                                np.random.default_rng(seed), horizon=horizon, reward=reward, gamma=1.0,
                                select=select, points=2)


def test_labels_are_the_best_tried_action_and_returns_are_real_rollouts():
    policy, _ = build_networks(ENC, TINY.policy.hidden, 5)
    npol = NumpyPolicy.from_torch(policy)
    col = _collector()
    items = [it for _ in range(4) for it in col.collect(npol, 2)]
    assert any(not it.tried for it in items)
    assert all(len(it.actions) == 1 and it.chosen == 0 for it in items if not it.tried)
    items = [it for it in items if it.tried]
    assert items
    for it in items:
        assert it.mask[it.actions].all() and len(set(it.actions.tolist())) == len(it.actions)
        best = it.returns.max()
        if best > it.returns[0] + 1e-9:
            assert it.returns[it.chosen] == best and it.gain > 0
        else:
            assert it.chosen == 0 and it.gain == 0
    # a return is the jobs reward of a real rollout: replay one by hand
    col2 = _collector()
    sim = col2.sims[0]
    view = sim.reset(seeds.training(3)[0])
    col2._views[0] = view
    col2.episodes = 1
    snap = sim.snapshot()
    it = next(it for it in col2.improve(npol, 0) if it.tried)
    sim.restore(snap)
    greedy = decide_slot(view, npol, ENC, fast=False)
    res = sim.step(greedy.allocation)
    total = -float(len(view.jobs) - sum(1.0 - (sim.result.end_time[j] - view.slot)
                                        for j in res.completed))
    for _ in range(2):
        if res.done:
            break
        nxt = res.view
        res = sim.step(decide_slot(nxt, npol, ENC).allocation)
        total -= len(nxt.jobs) - sum(1.0 - (sim.result.end_time[j] - nxt.slot) for j in res.completed)
    np.testing.assert_allclose(it.returns[0], total)


def test_zero_advantage_control_ignores_the_outcomes():
    policy, _ = build_networks(ENC, TINY.policy.hidden, 5)
    npol = NumpyPolicy.from_torch(policy)
    # progress rewards: every allocation change shows (an untrained policy finishes few jobs)
    best, rand = _collector("best", 7, reward="progress"), _collector("random", 7, reward="progress")
    a = [it for _ in range(6) for it in best.collect(npol, 2) if it.tried]
    b = [it for _ in range(6) for it in rand.collect(npol, 2) if it.tried]
    assert any(it.chosen != 0 for it in b)
    assert any(it.returns[it.chosen] < it.returns.max() for it in b)  # random picks ignore returns
    assert all(it.returns[it.chosen] == it.returns.max() or it.chosen == 0 for it in a)


def test_imitation_buffer_keeps_the_last_labels():
    policy, _ = build_networks(ENC, TINY.policy.hidden, 5)
    col = _collector()
    buf = ImitationBuffer(5, ENC.state_dim, ENC.action_dim)
    items = [it for _ in range(6) for it in col.collect(NumpyPolicy.from_torch(policy), 2)]
    buf.add(items)
    assert len(buf) == min(5, len(items))
    assert buf.actions.tolist() == [it.label for it in items][-5:]


def _improve_run(seed: int, zero: bool = False, n: int = 3):
    policy, value = build_networks(ENC, TINY.policy.hidden, seed)
    tr = Trainer(TINY, None, seed, RLOptions(traces=3, algo="improve", zero_advantage=zero), policy, value)
    rows = [asdict(tr.update()) for _ in range(n)]
    return rows, [p.detach().clone() for p in tr.policy.parameters()]


def test_improve_trainer_is_deterministic_and_learns_from_labels():
    rows_a, params_a = _improve_run(2)
    rows_b, params_b = _improve_run(2)
    assert rows_a == rows_b
    assert all((x == y).all() for x, y in zip(params_a, params_b, strict=True))
    start, _ = build_networks(ENC, TINY.policy.hidden, 2)
    assert any((x != y).any() for x, y in zip(params_a, start.parameters(), strict=True))
    assert [r["update"] for r in rows_a] == [1, 2, 3]
