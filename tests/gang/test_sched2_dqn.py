"""SCHED²: DQN math by hand (TD target, prioritised replay), the Q-network in torch = numpy,
the state's shape, and the invariants of the learned scheduler with random weights."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import gang_trace
from test_gang_sim import run_checked

from dl2ray.sched2.dqn import PrioritizedReplay, td_targets
from dl2ray.sched2.qnet import NumpyQNet, build_qnet
from dl2ray.sched2.scheduler import Sched2Scheduler
from dl2ray.sched2.state import Sched2Shape
from dl2ray.world import build_simulator


def test_td_target_by_hand():
    r = np.array([0.5, 0.2, 0.0])
    done = np.array([False, True, False])
    nq = np.array([[1.0, 3.0, 2.0], [9.0, 9.0, 9.0], [4.0, 7.0, 1.0]])
    masks = np.array([[True, False, True], [True, True, True], [False, False, False]])
    y = td_targets(r, done, nq, masks, gamma=0.9)
    # 0.5 + 0.9·max(1, 2) (3 is masked); a terminal step keeps r; no allowed action bootstraps 0
    assert y == pytest.approx([0.5 + 0.9 * 2.0, 0.2, 0.0])


def test_prioritized_replay_probabilities_and_weights_by_hand():
    rb = PrioritizedReplay(4, state_dim=1, actions=2, alpha=0.5, eps=0.0)
    for i in range(3):
        rb.add(np.array([i]), np.array([True, True]), 0, 0.0, np.array([i]), np.array([True, True]), False)
    rb.update(np.array([0, 1, 2]), np.array([1.0, -4.0, 9.0]))
    # p^α = 1, 2, 3 -> P = 1/6, 2/6, 3/6
    assert rb.probabilities() == pytest.approx([1 / 6, 2 / 6, 3 / 6])
    idx, w = rb.sample(200, np.random.default_rng(0), beta=1.0)
    # w_i ∝ (3·P_i)^-1: 2, 1, 2/3, normalised by the batch max (index 0 drawn in 200 tries)
    assert set(idx) == {0, 1, 2}
    expect = {0: 1.0, 1: 0.5, 2: 1 / 3}
    assert w == pytest.approx([expect[i] for i in idx])
    assert rb.max_p == 9.0
    rb.add(np.array([3]), np.array([True, True]), 1, 0.0, np.array([3]), np.array([True, True]), True)
    assert rb.p[3] == 9.0  # a new transition gets the largest priority seen


def test_numpy_qnet_equals_torch(sched2_cfg):
    import torch

    shape = Sched2Shape.from_config(sched2_cfg, window=4)
    net = build_qnet(shape, seed=3)
    x = np.random.default_rng(0).random((5, shape.state_dim)).astype(np.float32)
    want = net(torch.from_numpy(x)).detach().numpy()
    npnet = NumpyQNet(shape, {k: v.detach().numpy() for k, v in net.state_dict().items()})
    assert npnet.q(x) == pytest.approx(want, rel=1e-5, abs=1e-5)
    assert shape.state_dim == 3 * 4 + 6 * 4 + 4


def test_paper_state_dimension(sched2_cfg):
    from support import CONFIGS

    from dl2ray.config import load_config

    assert Sched2Shape.from_config(load_config(CONFIGS / "sched2.yaml")).state_dim == 184


def _random_scheduler(cfg, seed):
    shape = Sched2Shape.from_config(cfg, window=4)
    net = build_qnet(shape, seed=seed)
    npnet = NumpyQNet(shape, {k: v.detach().numpy() for k, v in net.state_dict().items()})
    return Sched2Scheduler(cfg, shape, npnet.greedy)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_learned_scheduler_invariants_and_determinism(sched2_cfg, seed):
    jobs = [
        (5, 0, 600.0, 2),
        (0, 0, 300.0, 8),
        (4, 1, 900.0, 1),
        (3, 2, 200.0, 4),
        (1, 2, 120.0, 12),
        (2, 5, 400.0, 3),
        (5, 6, 60.0, 1),
        (4, 6, 800.0, 6),
    ]
    sched = _random_scheduler(sched2_cfg, seed)
    trace = gang_trace(sched2_cfg.catalogue, jobs)
    jct = run_checked(build_simulator(sched2_cfg, trace), sched, seed)
    assert run_checked(build_simulator(sched2_cfg, trace), sched, seed) == jct


def test_train_writes_a_checkpoint_that_compare_can_load(sched2_cfg, tmp_path):
    from dl2ray.evaluation.comparison import RunSpec, run_one
    from dl2ray.sched2.train import DQNSettings, train

    cfg = sched2_cfg.model_copy(update={"workload": sched2_cfg.workload.model_copy(update={"num_jobs": 25})})
    out = tmp_path / "s.pt"
    log = train(cfg, DQNSettings(episodes=2, window=4, batch=8, eval_every=1, val_traces=1), out)
    assert out.is_file() and log.best["episode"] in (0, 1) and log.rows[-1]["updates"] > 0
    outcome = run_one(cfg, RunSpec(f"sched2:{out}", 3_000_000), None)
    assert outcome.metrics["unfinished"] == 0 and outcome.metrics["effectiveness"] > 0


def test_cli_refuses_a_dl2_config(capsys, tmp_path):
    from support import CONFIGS, run_cli

    code, _, err = run_cli(
        capsys, "train", "sched2", "--out", str(tmp_path / "x.pt"), "-c", str(CONFIGS / "testbed.yaml")
    )
    assert code == 2 and "gang-mode" in err and len(err.strip().splitlines()) == 1


# --- warm start: imitation of a baseline (dl2ray.sched2.imitation) ---

# All arrive at slot 0 and fit one 4-GPU server each, so SAF's key is the ideal time:
# (type, arrival slot, ideal seconds, GPUs)
SAF_CASE = [(0, 0, 600.0, 2), (1, 0, 300.0, 4), (2, 0, 900.0, 1), (3, 0, 200.0, 4), (4, 0, 400.0, 3)]


def test_teacher_labels_are_what_saf_does_by_hand(sched2_cfg):
    from dl2ray.sched2.baselines import factory
    from dl2ray.sched2.imitation import TeacherScheduler
    from dl2ray.sim import run_episode

    shape = Sched2Shape.from_config(sched2_cfg, window=8)
    trace = gang_trace(sched2_cfg.catalogue, SAF_CASE)
    steps: list[tuple] = []
    teacher = TeacherScheduler(sched2_cfg, shape, "saf", record=lambda s, m, a, r: steps.append((a, r)))
    got = run_episode(build_simulator(sched2_cfg, trace), teacher, 0)
    # 12 free GPUs: job 3 (200 s) is window index 3; then among [0, 1, 2, 4] job 1 (300 s) is
    # index 1; among [0, 2, 4] job 4 (400 s, 3 GPUs) is index 2; 1 GPU left: only job 2 (index 1)
    assert [a for a, _ in steps[:4]] == [3, 1, 2, 1]
    # nothing waited, each ran at its best locality: effectiveness 1
    assert [r for _, r in steps[:4]] == pytest.approx([1.0] * 4)
    # with the window holding every job the teacher is SAF itself: same completion times
    saf = run_episode(build_simulator(sched2_cfg, trace), factory("saf")(None, sched2_cfg), 0)
    assert got.jct == pytest.approx(saf.jct)


def test_demos_chain_into_replay_transitions(sched2_cfg):
    from dl2ray import seeds
    from dl2ray.sched2.imitation import record_demos

    cfg = sched2_cfg.model_copy(update={"workload": sched2_cfg.workload.model_copy(update={"num_jobs": 20})})
    shape = Sched2Shape.from_config(cfg, window=4)
    d = record_demos(cfg, shape, "saf", seeds.training(2))
    assert d.s.shape == (len(d), shape.state_dim) and d.m.shape == (len(d), shape.actions)
    assert d.m[np.arange(len(d)), d.a].all()  # the teacher only takes allowed actions
    assert d.d.sum() == 2 and d.d[-1]  # one terminal per trace
    ends = np.flatnonzero(~d.d)
    assert np.array_equal(d.s2[ends], d.s[ends + 1])  # s' is the next decision's state


def test_imitation_makes_the_greedy_policy_follow_the_teacher(sched2_cfg, tmp_path):
    from dataclasses import fields

    from dl2ray import seeds
    from dl2ray.sched2.imitation import Demos, ImitationSettings, accuracy, record_demos
    from dl2ray.sched2.train import DQNSettings, train

    cfg = sched2_cfg.model_copy(update={"workload": sched2_cfg.workload.model_copy(update={"num_jobs": 40})})
    st = DQNSettings(episodes=0, window=4, val_traces=2, seed=0)
    warm = ImitationSettings(teacher="saf", epochs=30, traces=20, td_weight=0.0, lr=3e-3, batch=32)
    log = train(cfg, st, tmp_path / "w.pt", warm=warm)
    assert log.best["episode"] == -1 and (tmp_path / "w.pt").is_file()
    assert log.imitation[-1]["val_acc"] >= 0.85, log.imitation[-1]
    # the saved checkpoint, run greedily in numpy, agrees with SAF on held-out states, also on
    # those with a real choice (≥ 3 allowed actions), where an untrained network mostly does not
    from dl2ray.sched2.qnet import read_checkpoint

    shape, weights, _ = read_checkpoint(tmp_path / "w.pt")
    val = record_demos(cfg, shape, "saf", seeds.validation(2))
    choice = val.m.sum(axis=1) >= 3
    hard = Demos(*(getattr(val, f.name)[choice] for f in fields(Demos)))
    assert len(hard) >= 20
    assert accuracy(NumpyQNet(shape, weights).q(val.s), val) >= 0.85
    assert accuracy(NumpyQNet(shape, weights).q(hard.s), hard) >= 0.75
    fresh = build_qnet(shape, seed=0)
    untrained = NumpyQNet(shape, {k: v.detach().numpy() for k, v in fresh.state_dict().items()})
    assert accuracy(untrained.q(hard.s), hard) < 0.6


def test_cli_refuses_an_unknown_teacher(capsys, tmp_path):
    from support import run_cli

    code, _, err = run_cli(capsys, "train", "sched2", "--out", str(tmp_path / "x.pt"), "--warm-start", "dsif")
    assert code == 2 and "--warm-start" in err and len(err.strip().splitlines()) == 1


def test_jobwise_numpy_equals_torch_and_scores_jobs_independently_of_their_slot(sched2_cfg):
    """The shared scorer: numpy = torch, and swapping two window jobs swaps their Q-values."""
    import torch

    from dl2ray.sched2.qnet import numpy_qnet

    shape = Sched2Shape.from_config(sched2_cfg, window=5, arch="jobwise")
    assert shape.state_dim == 3 * 4 + 8 * 5 + 4
    net = build_qnet(shape, seed=1)
    x = np.random.default_rng(0).random((4, shape.state_dim)).astype(np.float32)
    want = net(torch.from_numpy(x)).detach().numpy()
    npnet = numpy_qnet(shape, {k: v.detach().numpy() for k, v in net.state_dict().items()})
    assert npnet.q(x) == pytest.approx(want, rel=1e-5, abs=1e-5)
    nm, f = 3 * 4, shape.job_features
    swapped = x.copy()
    jobs = swapped[:, nm : nm + 5 * f].reshape(4, 5, f)
    jobs[:, [1, 3]] = jobs[:, [3, 1]]
    q = npnet.q(swapped)
    assert q[:, 1] == pytest.approx(want[:, 3], rel=1e-5) and q[:, 3] == pytest.approx(want[:, 1], rel=1e-5)
    assert q[:, [0, 2, 4, 5]] == pytest.approx(want[:, [0, 2, 4, 5]], rel=1e-5)


def test_jobwise_state_carries_the_placement_each_job_would_get_now(sched2_cfg):
    """Per window job: profiled time at its placement now and s_now / s_min (0 when it does not fit)."""
    from dl2ray.gang.sim import keep_running, locality_factor, running
    from dl2ray.sched2.baselines import Profile
    from dl2ray.sched2.state import busy_gpus, encode, waiting_jobs
    from dl2ray.world import build_simulator

    cat = sched2_cfg.catalogue
    # job 0 (4 GPUs) runs on server 0 from slot 0; at slot 1 job 1 (6 GPUs) spans 2 servers,
    # job 2 (9 GPUs) does not fit in the 8 GPUs left
    trace = gang_trace(cat, [(5, 0, 3600.0, 4), (4, 1, 1800.0, 6), (3, 1, 1800.0, 9)])
    sim = build_simulator(sched2_cfg, trace)
    view = sim.reset(0)
    shape = Sched2Shape.from_config(sched2_cfg, window=3, arch="jobwise")
    sched = Sched2Scheduler(sched2_cfg, shape, lambda s, m: 0)
    view = sim.step(sched.decide(view)).view
    profile = Profile(sched2_cfg)
    _, _, free = keep_running(view)
    waiting = waiting_jobs(view, set())
    busy = busy_gpus(view, profile, running(view.jobs))
    state, mask, places = encode(view, shape, profile, free, busy, waiting)
    rows = state[12 : 12 + 3 * 8].reshape(3, 8)
    j1 = waiting[0]
    assert len(set(places[0].worker_nodes)) == 2
    lam = locality_factor(profile.beta[j1.type_index], 2)
    assert rows[0, 6] == pytest.approx(profile.ideal_s(j1) * lam / 3600, rel=1e-5)
    assert rows[0, 7] == pytest.approx(2 / 2)  # needs 2 servers at best, gets 2
    assert list(mask) == [True, False, False, True]
    assert rows[1, 6] == 0 and rows[1, 7] == 0  # does not fit now
    assert rows[2].sum() == 0  # no third waiting job


def test_jct_reward_sums_to_minus_the_total_jct(sched2_cfg):
    """The DQN's jct reward over an episode = −jct_scale × Σ_jobs JCT in hours."""
    from dl2ray import seeds
    from dl2ray.sched2.imitation import record_demos
    from dl2ray.sim import run_episode
    from dl2ray.world import build_simulator

    cfg = sched2_cfg.model_copy(update={"workload": sched2_cfg.workload.model_copy(update={"num_jobs": 30})})
    shape = Sched2Shape.from_config(cfg, window=6)
    seed = seeds.validation(1)[0]
    demos = record_demos(cfg, shape, "saf", [seed], jct_scale=0.1)
    from dl2ray.sched2.imitation import TeacherScheduler

    result = run_episode(build_simulator(cfg), TeacherScheduler(cfg, shape, "saf"), seed)
    total_h = (
        sum(result.end_time[j] - result.arrival[j] for j in result.end_time) * cfg.sim.slot_seconds / 3600
    )
    assert demos.r.sum() == pytest.approx(-0.1 * total_h, rel=0.02)
    assert (demos.r <= 0).all() and demos.d[-1]


def test_cli_refuses_an_unknown_arch_or_reward(capsys, tmp_path):
    from support import run_cli

    for flag, value in (("--arch", "lstm"), ("--reward", "speed")):
        code, _, err = run_cli(capsys, "train", "sched2", "--out", str(tmp_path / "x.pt"), flag, value)
        assert code == 2 and flag in err and len(err.strip().splitlines()) == 1


def test_rollout_cost_replays_the_run_from_a_snapshot(sched2_cfg):
    """From slot 0's snapshot, π's rollout to the end costs exactly the job-slots of π's own run,
    and forcing π's own first action changes nothing."""
    from dl2ray.sched2.rollout import _Forced, rollout_cost

    cfg = sched2_cfg.model_copy(update={"workload": sched2_cfg.workload.model_copy(update={"num_jobs": 25})})
    sched = _random_scheduler(cfg, 1)
    shape, greedy = sched.shape, sched.choose
    sim = build_simulator(cfg)
    view = sim.reset(7)
    snap, view0 = sim.snapshot(), view
    job_slots = 0
    first: list[int] = []
    pi = Sched2Scheduler(cfg, shape, greedy, record=lambda s, m, a, r: first.append(a))
    while not sim.done:
        job_slots += len(view.jobs)
        view = sim.step(pi.decide(view)).view
    profile = sched.profile
    again = rollout_cost(sim, snap, view0, Sched2Scheduler(cfg, shape, greedy), 10**6, profile)
    assert again == job_slots > 0
    assert rollout_cost(sim, snap, view0, _Forced(cfg, shape, greedy, first[0]), 10**6, profile) == job_slots
    # a short horizon adds the lower bound of what is left, so it costs less than the whole run
    short = rollout_cost(sim, snap, view0, Sched2Scheduler(cfg, shape, greedy), 30, profile)
    assert 0 < short <= job_slots


def test_rollout_labels_are_allowed_and_only_move_for_a_real_gain(sched2_cfg):
    from dl2ray import seeds
    from dl2ray.sched2.qnet import numpy_qnet
    from dl2ray.sched2.rollout import RolloutSettings, label_trace

    cfg = sched2_cfg.model_copy(update={"workload": sched2_cfg.workload.model_copy(update={"num_jobs": 40})})
    shape = Sched2Shape.from_config(cfg, window=6, arch="jobwise")
    net = numpy_qnet(
        shape, {k: v.detach().numpy() for k, v in build_qnet(shape, seed=2).state_dict().items()}
    )
    st = RolloutSettings(points=12, candidates=3, horizon=200, min_gain=1.0)
    s, m, a, g = label_trace(cfg, shape, net.q, seeds.training(1)[0], st, np.random.default_rng(0))
    assert 0 < len(s) <= 12 and len(s) == len(m) == len(a) == len(g)
    for state, mask, action, gain in zip(s, m, a, g, strict=True):
        assert mask[action] and mask.sum() >= 2
        greedy = int(np.argmax(np.where(mask, net.q(state), -np.inf)))
        assert gain >= 0
        assert action == greedy or gain >= 1.0


def test_train_with_rollout_rounds_validates_each_round(sched2_cfg, tmp_path):
    from dl2ray.sched2.imitation import ImitationSettings
    from dl2ray.sched2.rollout import RolloutSettings
    from dl2ray.sched2.train import DQNSettings, train

    cfg = sched2_cfg.model_copy(update={"workload": sched2_cfg.workload.model_copy(update={"num_jobs": 30})})
    st = DQNSettings(episodes=0, window=6, arch="jobwise", val_traces=1, seed=0)
    warm = ImitationSettings(teacher="saf", epochs=3, traces=2, td_weight=0.0)
    roll = RolloutSettings(iterations=2, traces=1, points=5, horizon=100, epochs=2)
    log = train(cfg, st, tmp_path / "r.pt", warm=warm, rollout=roll)
    rounds = [r for r in log.rows if "rollout_iter" in r]
    assert [r["rollout_iter"] for r in rounds] == [0, 1]
    assert all(r["val_jct"] > 0 and r["labels"] > 0 for r in rounds)
    assert log.best["episode"] == -1 and log.best["stage"] in (
        "imitation",
        "rollout round 0",
        "rollout round 1",
    )
    assert (tmp_path / "r.pt").is_file()


def test_cli_refuses_rollouts_without_a_warm_start(capsys, tmp_path):
    from support import run_cli

    code, _, err = run_cli(capsys, "train", "sched2", "--out", str(tmp_path / "x.pt"), "--rollout-iters", "2")
    assert code == 2 and "--warm-start" in err and len(err.strip().splitlines()) == 1


def test_dagger_labels_the_students_own_states_with_the_teachers_choice(sched2_cfg, tmp_path):
    from dl2ray import seeds
    from dl2ray.sched2.imitation import ImitationSettings, student_demos
    from dl2ray.sched2.qnet import numpy_qnet
    from dl2ray.sched2.train import DQNSettings, train

    cfg = sched2_cfg.model_copy(update={"workload": sched2_cfg.workload.model_copy(update={"num_jobs": 30})})
    shape = Sched2Shape.from_config(cfg, window=6, arch="jobwise")
    net = numpy_qnet(
        shape, {k: v.detach().numpy() for k, v in build_qnet(shape, seed=4).state_dict().items()}
    )
    demos = student_demos(cfg, shape, "fifo-gang", net.q, seeds.training(1))
    assert len(demos) > 0 and all(demos.m[i, demos.a[i]] for i in range(len(demos)))
    # fifo-gang's label is the oldest allowed window job: the first allowed index
    assert list(demos.a) == [int(np.flatnonzero(m[:-1])[0]) for m in demos.m]
    st = DQNSettings(episodes=0, window=6, arch="jobwise", val_traces=1, seed=0)
    warm = ImitationSettings(
        teacher="saf", epochs=3, traces=2, td_weight=0.0, dagger=2, dagger_traces=1, dagger_epochs=2
    )
    log = train(cfg, st, tmp_path / "d.pt", warm=warm)
    rounds = [r for r in log.rows if "dagger_round" in r]
    assert [r["dagger_round"] for r in rounds] == [0, 1]
    assert all(r["new_states"] > 0 and 0 <= r["agreement_before"] <= 1 and r["val_jct"] > 0 for r in rounds)
