"""SCHED²: DQN math by hand (TD target, prioritised replay), the Q-network in torch = numpy,
the state's shape, and the invariants of the learned scheduler with random weights."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import gang_trace
from test_gang_sim import run_checked

from dl2ray.experiments import build_simulator
from dl2ray.sched2.dqn import PrioritizedReplay, td_targets
from dl2ray.sched2.qnet import NumpyQNet, build_qnet
from dl2ray.sched2.scheduler import Sched2Scheduler
from dl2ray.sched2.state import Sched2Shape


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
    from dl2ray.experiments import RunSpec, run_one
    from dl2ray.sched2.dqn import DQNSettings, train

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
