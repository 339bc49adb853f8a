"""Harmony: baselines' invariants in gang mode, the linear fit and the reward by hand, masks,
the numpy actor equal to torch, and the learned scheduler's invariants with random weights."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import CONFIGS
from test_gang_sim import run_checked_ps

from dl2ray.config import ClusterConfig, NodeGroup, load_config
from dl2ray.harmony.linear import Logged, fit_linear
from dl2ray.harmony.nets import (
    NumpyPolicy,
    build_actor_critic,
    build_reward_model,
    numpy_reward_model,
    rm_features,
)
from dl2ray.harmony.policy import HarmonyScheduler, Placed, dims, encode, placement_reward
from dl2ray.schedulers.base import make_scheduler
from dl2ray.workload import JobSpec, sort_trace
from dl2ray.world import build_simulator


@pytest.fixture(scope="module")
def harmony_cfg():
    cfg = load_config(CONFIGS / "harmony.yaml")
    return cfg.model_copy(
        update={
            "cluster": ClusterConfig(nodes=(NodeGroup(count=3, cpu=8, gpu=2, mem=48),)),
            "sim": cfg.sim.model_copy(update={"max_slots": 2000}),
        }
    )


def _trace(cat, jobs):
    out = []
    for i, (t, arrival, frac, w, p) in enumerate(jobs):
        jt = cat.types[t % len(cat)]
        epochs = frac * jt.base_epochs
        out.append(JobSpec(i, jt.name, arrival, epochs, epochs, workers=w, ps=p))
    return sort_trace(out)


job_st = st.tuples(
    st.integers(0, 7), st.integers(0, 4), st.floats(0.01, 0.05), st.integers(1, 2), st.integers(1, 2)
)


def _random_harmony(cfg, seed):
    m, types = int(cfg.cluster.capacity.shape[0]), len(cfg.catalogue)
    sd, jd, _ = dims(m, types)
    net = build_actor_critic(m, sd, jd, seed=seed)
    npnet = NumpyPolicy(m, sd, {k: v.detach().numpy() for k, v in net.state_dict().items()})
    return HarmonyScheduler(lambda s, mk, h: npnet.greedy(s, mk))


def _random_planner(seed, **kw):
    from dl2ray.harmony.planner import PlannerScheduler

    rm = build_reward_model(8, 8, seed=seed)
    return PlannerScheduler(
        numpy_reward_model({k: v.detach().numpy() for k, v in rm.state_dict().items()}), 4, **kw
    )


def _build(name, cfg):
    if name == "harmony-random":
        return _random_harmony(cfg, 0)
    if name == "planner-random":
        return _random_planner(0)
    if name == "lif-linear-random":  # lif-linear's scoring with arbitrary coefficients (its fit is slow)
        from dl2ray.harmony.baselines import FifoPlacer, linear_score

        return FifoPlacer(name, linear_score(np.random.default_rng(0).random((8, 8))))
    return make_scheduler(name, cfg)


@pytest.mark.parametrize(
    "name",
    [
        "lb-place",
        "tetris-place",
        "random-place",
        "pack-place",
        "lif-linear-random",
        "harmony-random",
        "planner-random",
    ],
)
@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(jobs=st.lists(job_st, min_size=1, max_size=6), seed=st.integers(0, 2**16))
def test_placement_scheduler_invariants(name, harmony_cfg, jobs, seed):
    sched = _build(name, harmony_cfg)
    trace = _trace(harmony_cfg.catalogue, jobs)
    jct = run_checked_ps(build_simulator(harmony_cfg, trace), sched, seed)
    assert run_checked_ps(build_simulator(harmony_cfg, trace), sched, seed) == jct


def test_linear_fit_recovers_coefficients():
    rng = np.random.default_rng(0)
    L, n = 3, 200
    coef = np.array([[0.1, 0.0, 0.3], [0.0, 0.2, 0.0], [0.05, 0.05, 0.05]])
    types = rng.integers(0, L, n)
    x = rng.random((n, L)) * 3
    slow = 1 - np.einsum("ij,ij->i", x, coef[types])
    data = Logged(types, np.ones((n, 2)), x, x, np.zeros((n, 3)), slow, slow)
    assert fit_linear(data, L) == pytest.approx(coef, abs=1e-9)


def test_placement_reward_by_hand():
    placed = Placed(servers=2, types=2)
    placed.add(1, 0, (0,), (0,))
    placed.add(2, 1, (0,), (1,))

    def predict(f):  # ŷ = 1 − 0.1 · (mean foreign tasks per task), from the per-node rows
        rows = f[:, 4:].reshape(len(f), 8, 4) * 4.0
        tasks, foreign = rows[:, :, :2].sum(2), rows[:, :, 2:].sum(2)
        return 1.0 - 0.1 * (tasks * foreign).sum(1) / tasks.sum(1)

    # job 2: its worker on node 0 meets 2 tasks of job 1, its PS on node 1 none -> mean 1 -> 0.9.
    # job 1 before: alone -> 1.0; after: each of its 2 tasks on node 0 meets 1 foreign -> 0.9
    assert placement_reward(placed, 2, predict) == pytest.approx(0.9 + (0.9 - 1.0))


def test_masks_follow_capacity_and_tasks_left(harmony_cfg):
    sim = build_simulator(harmony_cfg, _trace(harmony_cfg.catalogue, [(0, 0, 0.02, 2, 1)]))
    view = sim.reset(0)
    job = view.jobs[0]
    free = view.capacity.copy()
    free[1] = 0.0
    state, mask = encode(job, free, view.capacity, Placed(3, 8), np.zeros((3, 2)), (2, 0))
    assert mask.tolist() == [True, False, True, False, False, False]
    assert state.shape == (dims(3, 8)[2],)


def test_numpy_policy_equals_torch():
    import torch

    m, sd, jd = 3, 13, 12
    net = build_actor_critic(m, sd, jd, seed=1)
    x = np.random.default_rng(0).random(m * sd + jd).astype(np.float32)
    want = net(torch.from_numpy(x[None]))[0][0].detach().numpy()
    got = NumpyPolicy(m, sd, {k: v.detach().numpy() for k, v in net.state_dict().items()}).logits(x)
    assert got == pytest.approx(want, rel=1e-5, abs=1e-5)


def test_rm_features_by_hand():
    # type 1 of 3; a worker on node 0 and a worker and a PS on node 2; node 0 also hosts 2 tasks of
    # type 0 and one other type-1 task, node 2 one task of type 2
    counts = np.array([[2.0, 2.0, 0.0], [5.0, 0.0, 0.0], [0.0, 2.0, 1.0]])
    f = rm_features(1, (0, 2), (2,), counts, max_nodes=3)
    job = [0, 1, 0, 2 / 4, 1 / 4]
    node2 = [1, 1, 0, 0, 1]  # own workers, own PS, foreign tasks of types 0..2 (sorted first: most own)
    node0 = [1, 0, 2, 1, 0]
    assert f.tolist() == pytest.approx(job + [x / 4 for x in node2 + node0] + [0.0] * 5)


def test_rm_features_keep_which_types_meet():
    """Two placements with the same foreign task count per node but different foreign *types*
    must look different to the reward model (interference depends on the type pair), while
    relabelling the servers must not change anything."""
    a = np.array([[1.0, 2.0, 0.0], [0.0, 0.0, 0.0]])  # job of type 0 on node 0 with 2 type-1 tasks
    b = np.array([[1.0, 0.0, 2.0], [0.0, 0.0, 0.0]])  # ... with 2 type-2 tasks instead
    fa, fb = rm_features(0, (0,), (), a, 2), rm_features(0, (0,), (), b, 2)
    assert not np.allclose(fa, fb)
    swapped = rm_features(0, (1,), (), a[::-1].copy(), 2)
    assert swapped.tolist() == fa.tolist()
    # per node, not pooled: foreign tasks split over two nodes differ from all on one node
    one = rm_features(0, (0, 1), (), np.array([[1.0, 2.0, 0.0], [1.0, 0.0, 0.0]]), 2)
    split = rm_features(0, (0, 1), (), np.array([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]]), 2)
    assert not np.allclose(one, split)


def test_numpy_reward_model_equals_torch():
    import torch

    types, k = 3, 4
    model = build_reward_model(types, k, seed=2)
    rng = np.random.default_rng(1)
    x = np.stack(
        [
            rm_features(int(rng.integers(3)), (0, 1), (int(rng.integers(4)),), rng.integers(1, 4, (4, 3)), k)
            for _ in range(5)
        ]
    )
    want = model(torch.as_tensor(x, dtype=torch.float32))[:, 0].detach().numpy()
    got = numpy_reward_model({k_: v.detach().numpy() for k_, v in model.state_dict().items()})(x)
    assert got == pytest.approx(want, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("coef_seed", [None, 0, 1])
def test_teacher_places_as_its_baseline(harmony_cfg, coef_seed):
    """The imitation teacher, run through Harmony's one-task loop, gives the baseline's JCTs
    (``None``: lb-place; else lif-linear's scoring with random coefficients)."""
    from dl2ray.harmony.baselines import FifoPlacer, lb_score, linear_score
    from dl2ray.harmony.imitate import linear_teacher

    coef = np.zeros((8, 8)) if coef_seed is None else np.random.default_rng(coef_seed).random((8, 8))
    base = FifoPlacer("b", lb_score if coef_seed is None else linear_score(coef))
    teacher = HarmonyScheduler(linear_teacher(coef, 3), precheck=False)
    rng = np.random.default_rng(5)
    jobs = [
        (int(rng.integers(8)), int(rng.integers(6)), 0.03, int(rng.integers(1, 3)), int(rng.integers(1, 3)))
        for _ in range(12)
    ]
    trace = _trace(harmony_cfg.catalogue, jobs)
    want = run_checked_ps(build_simulator(harmony_cfg, trace), base, 0)
    assert run_checked_ps(build_simulator(harmony_cfg, trace), teacher, 0) == want


def test_planner_replay_records_its_own_placements(harmony_cfg):
    """The planner's imitation steps, replayed through Harmony's loop, change nothing: same JCTs
    with and without recording, one recorded step per placed task, every action allowed."""
    steps = []
    rng = np.random.default_rng(3)
    jobs = [
        (int(rng.integers(8)), int(rng.integers(6)), 0.03, int(rng.integers(1, 3)), int(rng.integers(1, 3)))
        for _ in range(10)
    ]
    trace = _trace(harmony_cfg.catalogue, jobs)
    plain = run_checked_ps(build_simulator(harmony_cfg, trace), _random_planner(1), 0)
    rec = _random_planner(1, record=lambda s, mk, a: steps.append(bool(mk[a])))
    assert run_checked_ps(build_simulator(harmony_cfg, trace), rec, 0) == plain
    assert len(steps) == sum(j.workers + j.ps for j in trace) and all(steps)


def test_pack_place_fills_the_least_loaded_node_first(harmony_cfg):
    """Node 1 is busy, nodes 0 and 2 empty: a 2-worker 1-PS job goes whole onto node 0."""
    from dl2ray.view import Allocation, JobPlacement, Tasks

    trace = _trace(harmony_cfg.catalogue, [(0, 0, 0.5, 1, 1), (1, 1, 0.02, 2, 1)])
    sim = build_simulator(harmony_cfg, trace)
    sim.reset(0)
    view = sim.step(Allocation({0: Tasks(1, 1)}, {0: JobPlacement((1,), (1,))})).view
    alloc = make_scheduler("pack-place", harmony_cfg).decide(view)
    assert alloc.placement[1] == JobPlacement((0, 0), (0,))


def test_pack_teacher_places_as_pack_place(harmony_cfg):
    from dl2ray.harmony.planner import PackTeacher

    rng = np.random.default_rng(4)
    jobs = [
        (int(rng.integers(8)), int(rng.integers(6)), 0.03, int(rng.integers(1, 3)), int(rng.integers(1, 3)))
        for _ in range(12)
    ]
    trace = _trace(harmony_cfg.catalogue, jobs)
    want = run_checked_ps(build_simulator(harmony_cfg, trace), make_scheduler("pack-place", harmony_cfg), 0)
    teacher = PackTeacher(lambda x: np.ones(len(x)), record=lambda s, mk, a: None)
    assert run_checked_ps(build_simulator(harmony_cfg, trace), teacher, 0) == want
