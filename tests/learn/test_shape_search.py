"""Shape-search policy improvement (``policy.improve.operator: shape``)."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
from support import small_config

from dl2ray import seeds
from dl2ray.learn.records import RLOptions
from dl2ray.learn.rl import Trainer
from dl2ray.learn.shape.search import ShapeSearchCollector, shape_moves
from dl2ray.learn.teacher import decompose
from dl2ray.policy.decision import decide_slot
from dl2ray.policy.encoding import Encoding
from dl2ray.policy.network import NumpyPolicy, build_networks
from dl2ray.schedulers.base import make_scheduler
from dl2ray.view import Allocation, Tasks
from dl2ray.world import build_simulator

TINY = small_config(
    cluster={"nodes": [{"count": 3, "cpu": 8, "gpu": 2, "mem": 48}]},
    workload={"num_jobs": 6, "arrivals": {"pattern": "poisson", "rate": 1.5, "max_per_slot": 3}},
    policy={"window": 6, "hidden": [32],
            "improve": {"operator": "shape", "rounds": 2, "envs": 2, "slots_per_update": 2, "horizon": 3,
                        "batches": 2, "batch_size": 16}},
    sim={"max_slots": 200},
)
ENC = Encoding.from_config(TINY)


def _view_with_jobs(sim, seed=1_000_003, slots=2):
    drf = make_scheduler("drf", TINY)
    view = sim.reset(seed)
    for _ in range(slots):
        view = sim.step(drf.decide(view)).view
    return view


def test_moves_change_one_task_of_one_job():
    view = _view_with_jobs(build_simulator(TINY))
    a, b = view.jobs[0].job_id, view.jobs[1].job_id
    tasks = {a: Tasks(2, 1)}  # b has nothing
    moves = shape_moves(view, tasks)
    assert {a: Tasks(3, 1)} in moves and {a: Tasks(2, 2)} in moves and {a: Tasks(1, 1)} in moves
    assert {} in moves  # one PS fewer leaves a with no PS: it gets nothing
    assert {a: Tasks(2, 1), b: Tasks(1, 1)} in moves
    for m in moves:
        changed = [j for j in {*m, *tasks} if m.get(j, Tasks(0, 0)) != tasks.get(j, Tasks(0, 0))]
        assert len(changed) == 1
    assert len(moves) == len({tuple(sorted(m.items())) for m in moves})  # no move twice


def _collector(select="best", seed=0, rounds=2, reward="jobs"):
    return ShapeSearchCollector([build_simulator(TINY) for _ in range(2)], ENC, seeds.training(3),
                                np.random.default_rng(seed), horizon=3, reward=reward, select=select,
                                rounds=rounds)


def _policy(seed=5):
    policy, _ = build_networks(ENC, TINY.policy.hidden, seed)
    return NumpyPolicy.from_torch(policy)


def test_labels_rebuild_the_searched_shape_and_gains_are_real_rollouts():
    npol = _policy()
    col = _collector()
    sim = col.sims[0]
    view = _view_with_jobs(sim)
    col._views[0], col.episodes = view, 1
    snap = sim.snapshot()
    items = col.improve(npol, 0)
    # the episode went on with the greedy decision
    sim2 = build_simulator(TINY)
    view2 = _view_with_jobs(sim2)
    sim2.step(decide_slot(view2, npol, ENC).allocation)
    assert sim.view().slot == sim2.view().slot and dict(sim.result.end_time) == dict(sim2.result.end_time)
    assert items and len({(it.returns[0], it.returns[1]) for it in items}) == 1
    # the labelled steps replayed through the decision loop give the searched allocation
    target = decompose(view, _replayed(view, items), ENC).decision.allocation.tasks
    greedy = decide_slot(view, npol, ENC).allocation.tasks
    if items[0].tried:
        assert target != greedy and items[0].gain > 0
    else:
        assert target == greedy and items[0].gain == 0
    # returns[0] is the greedy counts' rollout: replay it by hand
    sim.restore(snap)
    total = col._evaluate(sim, snap, view, dict(greedy), npol)
    np.testing.assert_allclose(items[0].returns[0], total)


def _replayed(view, items) -> Allocation:
    """Replay the labels' actions through the reference decision loop."""
    from dl2ray.policy.decision import run_decision

    class Replay:
        def __init__(self):
            self.actions = iter(int(it.label) for it in items)

        def begin(self, slot):
            pass

        def choose(self, slot, mask):
            a = next(self.actions)
            assert mask[a]
            return a

        def applied(self, row, delta):
            pass

    return run_decision(view, ENC, Replay(), record=False, fast=False).allocation


def test_search_finds_gains_and_the_control_ignores_them():
    npol = _policy(7)
    best, rand = _collector("best", 3, reward="progress"), _collector("random", 3, reward="progress")
    a = [it for _ in range(6) for it in best.collect(npol, 2)]
    b = [it for _ in range(6) for it in rand.collect(npol, 2)]
    assert all(it.gain >= 0 for it in a) and any(it.gain > 0 for it in a)
    assert any(it.gain < 0 for it in b)  # random moves, whatever they cost


def test_shape_trainer_is_deterministic_and_learns():
    def run(seed):
        policy, value = build_networks(ENC, TINY.policy.hidden, seed)
        tr = Trainer(TINY, None, seed, RLOptions(traces=3, algo="improve"), policy, value)
        assert isinstance(tr.improver, ShapeSearchCollector)
        return [asdict(tr.update()) for _ in range(2)], [p.detach().clone() for p in tr.policy.parameters()]

    rows_a, params_a = run(2)
    rows_b, params_b = run(2)
    assert rows_a == rows_b
    assert all((x == y).all() for x, y in zip(params_a, params_b, strict=True))
    start, _ = build_networks(ENC, TINY.policy.hidden, 2)
    assert any((x != y).any() for x, y in zip(params_a, start.parameters(), strict=True))


def test_redrawn_future_keeps_the_pending_ids_and_arrives_later():
    from dl2ray.learn.shape.search import redraw_future
    from dl2ray.traces.generate import generate_trace

    sim = build_simulator(TINY)
    sim.reset(seeds.training(3)[0])
    assert sim._pending  # jobs still to arrive at slot 0
    ids = sorted(j.job_id for j in sim._pending)
    snap = sim.snapshot()
    redraw_future(sim, 123, 7)
    alt = generate_trace(TINY, 123)
    new = sorted(sim._pending, key=lambda j: (j.arrival_slot, j.job_id))
    assert sorted(j.job_id for j in new) == ids
    assert all(j.arrival_slot > sim.slot for j in new)
    assert [j.job_type for j in new] == [j.job_type for j in alt[:len(new)]]
    assert [j.arrival_slot - new[0].arrival_slot for j in new] == [
        j.arrival_slot - alt[0].arrival_slot for j in alt[:len(new)]]
    assert sim._pending[-1] is min(sim._pending, key=lambda j: (j.arrival_slot, j.job_id))  # pop() order
    sim.restore(snap)
    assert sorted(j.job_id for j in sim._pending) == ids and sim._pending == list(snap.pending)


def test_search_over_redrawn_futures_is_deterministic():
    def labels(seed):
        col = ShapeSearchCollector([build_simulator(TINY) for _ in range(2)], ENC, seeds.training(3),
                                   np.random.default_rng(seed), horizon=3, futures=2)
        return [(it.label, tuple(it.returns)) for _ in range(3) for it in col.collect(_policy(), 2)]

    assert labels(4) == labels(4)
