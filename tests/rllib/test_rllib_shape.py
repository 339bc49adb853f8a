"""RLlib carries the shape policy: ShapeEnv, the shape RLModule, its export, and one short PPO run.

What equality holds between the module and the shipped scheduler (``dl2:PATH``): both score the jobs with
the same network on the same features, so the module's logits are the scheduler's; the module's greedy
action takes each job's best row within its menu mask (caps, and fitting the free cluster alone), and
the scheduler takes that very row for every job whose mask at its turn (the capacity left by the jobs
before it, work conservation) still allows it — and the best allowed row otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env
from support import run_cli, tiny_shape_config

from dl2ray.config import ExperimentConfig, load_config
from dl2ray.envs.shape_env import ShapeEnv, apply_actions
from dl2ray.learn.rllib.export import export_policy
from dl2ray.learn.rllib.shape_module import (
    ShapeAPPOTorchRLModule,
    ShapeTorchRLModule,
    shape_module_config,
)
from dl2ray.learn.rllib.train import ALGOS, RLlibRun, algorithm_config, run_arch
from dl2ray.policy.network import CheckpointError
from dl2ray.policy.shape import WAIT, job_features
from dl2ray.policy.shape_decode import cap_mask, decide_shapes
from dl2ray.policy.shape_net import checkpoint_arch, load_shape_checkpoint
from dl2ray.schedulers.base import make_scheduler

HERE = Path(__file__).resolve().parent
TINY_SHAPE_YAML = HERE / "tiny-shape.yaml"
TINY_SHAPE = load_config(TINY_SHAPE_YAML)
TEST_SEED = 3_000_000


def _profiled() -> ExperimentConfig:
    """The tiny shape config of tests/support with the shipped policy's profile features."""
    cfg = tiny_shape_config()
    shape = cfg.policy.shape.model_copy(update={"profile_features": True})
    return cfg.model_copy(update={"policy": cfg.policy.model_copy(update={"shape": shape})})


CONFIGS = {"one-hot": tiny_shape_config, "profile": _profiled}


def _module(env: ShapeEnv, seed: int = 0, init: str | None = None, cls=ShapeTorchRLModule):
    s = env.cfg.policy.shape
    return cls(observation_space=env.observation_space, action_space=env.action_space,
               model_config=shape_module_config(env.enc, s.embed, s.head, env.max_jobs, seed, init))


def _batch(obs: dict[str, np.ndarray]) -> dict:
    from ray.rllib.core.columns import Columns

    return {Columns.OBS: {k: torch.as_tensor(v)[None] for k, v in obs.items()}}


def _greedy(module, obs: dict[str, np.ndarray]) -> np.ndarray:
    """RLlib's greedy action: the inference distribution's deterministic sample."""
    from ray.rllib.core.columns import Columns

    with torch.no_grad():
        logits = module.forward_inference(_batch(obs))[Columns.ACTION_DIST_INPUTS]
    dist = module.get_inference_action_dist_cls().from_logits(logits)
    return dist.to_deterministic().sample()[0].numpy()


# -- the environment ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("features", sorted(CONFIGS))
def test_env_spaces_hold_every_observation(features) -> None:
    """gymnasium's checker, then random episodes with 2 job rows for 6 jobs: every observation is in the
    space, padding rows allow wait only, and the jobs beyond the rows are counted as waiting."""
    env = ShapeEnv(cfg=CONFIGS[features](), reward="avg_jct", max_jobs=2, max_slots=40)
    with pytest.warns(UserWarning, match="infinity"):  # log-scaled features have no finite bound
        check_env(env, skip_render_check=True)
    for episode in range(2):
        obs, info = env.reset(seed=episode)
        done = False
        while not done:
            assert env.observation_space.contains(obs)
            pad = obs["job_mask"] == 0
            assert (obs["action_mask"][:, WAIT] == 1).all() and (obs["action_mask"][pad, 1:] == 0).all()
            assert not obs["jobs"][pad].any()
            obs, _, term, trunc, info = env.step(env.action_space.sample())
            done = term or trunc
        assert env.observation_space.contains(obs)
    assert info["waiting_jobs"] > 0 and info["masked_actions"] > 0


def test_avg_jct_return_is_minus_the_censored_average_jct() -> None:
    """The reward is DL2Env's (dl2ray.envs.dl2_env.step_slot): with "avg_jct" an episode's return is
    −censored_avg_jct of the run, cut off or not."""
    env = ShapeEnv(cfg=tiny_shape_config(), reward="avg_jct", max_jobs=4)
    for max_slots in (None, 5):
        env.max_slots = max_slots or env.cfg.sim.max_slots
        env.reset(options={"trace_seed": TEST_SEED})
        total, done = 0.0, False
        while not done:
            _, r, term, trunc, info = env.step(env.action_space.sample())
            total, done = total + r, term or trunc
        assert trunc == (max_slots is not None)
        assert total == pytest.approx(-info["metrics"]["censored_avg_jct"], rel=1e-9)


@pytest.mark.parametrize("conserving", [True, False])
def test_actions_are_placed_by_decide_shapes_in_a_fixed_order_with_a_fixed_fallback(conserving) -> None:
    """apply_actions on many views and random actions: jobs that chose a shape come first, then those that
    chose wait (arrival order within each); a job gets its row when its turn's mask allows it, else wait if
    allowed, else its first allowed row; the masked count is the number of jobs that did not get theirs."""
    cfg = tiny_shape_config()
    shape = cfg.policy.shape.model_copy(update={"work_conserving": conserving})
    env = ShapeEnv(cfg=cfg.model_copy(update={"policy": cfg.policy.model_copy(update={"shape": shape})}),
                   max_jobs=6)
    assert env.enc.work_conserving is conserving
    rng = np.random.default_rng(0)
    got = fell_back = 0
    for seed in range(3):
        env.reset(options={"trace_seed": TEST_SEED + seed})
        while env.view is not None:
            view, k = env.view, env.enc.num_shapes
            acts = rng.integers(0, k, len(view.jobs))
            acts[rng.random(len(view.jobs)) < 0.3] = WAIT
            decision, masked = apply_actions(view, env.enc, acts)
            caps = cap_mask(view, env.enc)
            assert caps[:, 1:].any(axis=1).all()  # else a job that can only wait may come earlier
            shape = caps[np.arange(len(acts)), acts] & (acts != WAIT)  # a row outside the caps: wait
            assert decision.order.tolist() == [*np.flatnonzero(shape), *np.flatnonzero(~shape)]
            for j, a in enumerate(acts):
                m = decision.masks[j]
                if m[a]:
                    assert decision.actions[j] == a
                    got += 1
                else:
                    assert decision.actions[j] == (WAIT if m[WAIT] else int(np.flatnonzero(m)[0]))
                    fell_back += 1
            assert masked == int((decision.actions != acts).sum())
            env.step(np.resize(acts, env.max_jobs))
    assert got > 0 and fell_back > 0


def test_decision_order_puts_shape_choices_first() -> None:
    """The order by itself, on one view with every job present: shape choosers, then wait choosers."""
    env = ShapeEnv(cfg=tiny_shape_config(), max_jobs=6)
    env.reset(options={"trace_seed": TEST_SEED})
    while env.view is not None and len(env.view.jobs) < 3:
        env.step(np.zeros(env.max_jobs, np.int64))
    view = env.view
    assert view is not None
    n = len(view.jobs)
    acts = np.ones(n, np.int64)  # row 1, (1, 1) in the tiny menu: within every job's caps
    acts[0] = WAIT
    decision, _ = apply_actions(view, env.enc, acts)
    assert decision.order.tolist() == [*range(1, n), 0]


# -- the module against the shipped scheduler ------------------------------------------------------------


@pytest.mark.parametrize("features", sorted(CONFIGS))
def test_greedy_module_agrees_with_the_shipped_scheduler(tmp_path, features) -> None:
    """For the same weights (the module's network exported and run as dl2:PATH) and the view ShapeEnv
    decides on: the same logits; the scheduler takes the module's greedy row for every job whose mask at its
    turn allows it (module docstring) — checked on every slot of two greedy episodes."""
    cfg = CONFIGS[features]()
    env = ShapeEnv(cfg=cfg, max_jobs=8)  # more rows than jobs: the env shows the whole view
    module = _module(env, seed=1)
    path = export_policy(tmp_path, module.pi, module.vf, cfg.catalogue.names, {"kind": "test"})
    sched = make_scheduler(f"dl2:{path}", cfg)
    agreed = total = 0
    for seed in range(2):
        obs, _ = env.reset(options={"trace_seed": TEST_SEED + seed})
        while env.view is not None:
            view, n = env.view, len(env.view.jobs)
            x, g = job_features(view, sched.enc)
            np.testing.assert_allclose(obs["jobs"][:n], x)
            logits = sched.policy.logits(x, g)
            with torch.no_grad():
                x_t, g_t = torch.as_tensor(obs["jobs"])[None], torch.as_tensor(obs["global"])[None]
                ours = module.pi(x_t, torch.as_tensor(obs["job_mask"] > 0)[None], g_t)[0, :n].numpy()
            np.testing.assert_allclose(ours, logits, rtol=1e-5, atol=1e-5)
            greedy = _greedy(module, obs)
            menu = obs["action_mask"][:n].astype(bool)
            assert (greedy[:n] == np.where(menu, logits, -np.inf).argmax(axis=1)).all()
            assert (greedy[n:] == WAIT).all()
            shipped = decide_shapes(view, sched.enc, logits)
            assert sched.decide(view) == shipped.allocation
            for j in range(n):
                if shipped.masks[j, greedy[j]]:
                    assert shipped.actions[j] == greedy[j], (j, greedy[j], shipped.actions[j])
                    agreed += 1
                total += 1
            obs, *_ = env.step(greedy)
    assert 0 < agreed <= total


def test_export_round_trip_loads_and_decides_identically(tmp_path) -> None:
    """A trained-looking module (weights moved off the init) → policy.pt (a shape checkpoint) → the same
    weights and decisions as the in-memory network; a module started from it (``init``) holds them."""
    from dl2ray.policy.shape_net import NumpyShapePolicy
    from dl2ray.schedulers.dl2 import DL2Scheduler

    env = ShapeEnv(cfg=TINY_SHAPE)
    module = _module(env, seed=2)
    with torch.no_grad():
        for p in module.pi.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.3)
    path = export_policy(tmp_path, module.pi, module.vf, TINY_SHAPE.catalogue.names, {"kind": "rllib"})
    assert checkpoint_arch(path) == "shape"
    loaded = load_shape_checkpoint(path).policy
    for name, tensor in module.pi.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name
    restarted = _module(env, seed=5, init=str(path))
    for name, tensor in module.pi.state_dict().items():
        assert torch.equal(tensor, restarted.pi.state_dict()[name]), name
    in_memory = DL2Scheduler.from_policy(NumpyShapePolicy(module.pi))
    from_file = make_scheduler(f"dl2:{path}", TINY_SHAPE)
    env.reset(options={"trace_seed": TEST_SEED})
    decisions = 0
    while env.view is not None:
        assert from_file.decide(env.view) == in_memory.decide(env.view)
        decisions += 1
        env.step(np.zeros(env.max_jobs, np.int64))
    assert decisions > 3


# -- selection, bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize("algo", ALGOS)
def test_shape_config_gets_the_shape_module_with_the_apis_its_learner_needs(algo) -> None:
    config = algorithm_config(TINY_SHAPE, RLlibRun(algo, max_jobs=3))
    config.validate()
    module_class = config.rl_module_spec.module_class
    assert module_class is (ShapeAPPOTorchRLModule if algo == "appo" else ShapeTorchRLModule)
    assert all(issubclass(module_class, api) for api in config.learner_class.rl_module_required_apis())
    assert config.env is ShapeEnv and config.env_config["max_jobs"] == 3
    assert config.rl_module_spec.model_config["max_jobs"] == 3


def test_the_init_checkpoint_picks_the_architecture(tmp_path) -> None:
    """A shape checkpoint makes a paper config train the shape module, and a paper checkpoint the reverse."""
    from dl2ray.learn.rllib.module import DL2TorchRLModule
    from dl2ray.policy.encoding import Encoding
    from dl2ray.policy.network import build_networks, save_checkpoint

    paper_cfg = load_config(HERE / "tiny.yaml")
    env = ShapeEnv(cfg=paper_cfg)
    shape_ckpt = export_policy(tmp_path, _module(env).pi, None, paper_cfg.catalogue.names, {})
    assert run_arch(paper_cfg, RLlibRun()) == "paper"
    assert run_arch(paper_cfg, RLlibRun(init=str(shape_ckpt))) == "shape"
    paper_ckpt = tmp_path / "paper.pt"
    save_checkpoint(paper_ckpt, *build_networks(Encoding.from_config(TINY_SHAPE), [16], 0),
                    TINY_SHAPE.catalogue.names)
    config = algorithm_config(TINY_SHAPE, RLlibRun(init=str(paper_ckpt)))
    assert config.rl_module_spec.module_class is DL2TorchRLModule


def test_bad_input_names_the_field(tmp_path, capsys) -> None:
    from dl2ray.policy.encoding import Encoding
    from dl2ray.policy.network import build_networks, save_checkpoint

    with pytest.raises(ValueError, match=r"^max_jobs: 0: must be at least 1"):
        ShapeEnv(cfg=TINY_SHAPE, max_jobs=0)
    with pytest.raises(ValueError, match=r"^max_jobs: -1"):
        ShapeEnv({"cfg": TINY_SHAPE, "max_jobs": -1})
    env = ShapeEnv(cfg=TINY_SHAPE)
    with pytest.raises(ValueError, match=r"^max_jobs: 0"):
        shape_module_config(env.enc, [16], 8, 0, 0, None)
    paper = tmp_path / "paper.pt"
    save_checkpoint(paper, *build_networks(Encoding.from_config(TINY_SHAPE), [16], 0),
                    TINY_SHAPE.catalogue.names)
    with pytest.raises(CheckpointError, match=r"^init: .*'paper' checkpoint, not a shape policy"):
        _module(env, init=str(paper))
    with pytest.raises(ValueError, match=r"^action: 3 menu rows; the action space has 4"):
        env.reset(options={"trace_seed": TEST_SEED})
        env.step(np.zeros(3, np.int64))
    code, _, err = run_cli(capsys, "experiment", "rllib", "--config", str(TINY_SHAPE_YAML), "--out",
                           str(tmp_path / "r"), "--minutes", "1", "--max-jobs", "0")
    assert code == 2 and "--max-jobs: must be at least 1 (got 0)" in err
    assert not (tmp_path / "r").exists()


def test_appo_target_network_of_the_shape_module_is_a_masked_copy() -> None:
    from ray.rllib.core.columns import Columns
    from ray.rllib.core.rl_module.apis import TARGET_NETWORK_ACTION_DIST_INPUTS

    env = ShapeEnv(cfg=TINY_SHAPE)
    module = _module(env, cls=ShapeAPPOTorchRLModule)
    module.make_target_networks()
    assert module.get_target_network_pairs() == [(module.pi, module._old_pi)]
    assert not any(p.requires_grad for p in module._old_pi.parameters())
    obs, _ = env.reset(options={"trace_seed": TEST_SEED})
    with torch.no_grad():
        old = module.forward_target(_batch(obs))[TARGET_NETWORK_ACTION_DIST_INPUTS][0]
        current = module.forward_train(_batch(obs))[Columns.ACTION_DIST_INPUTS][0]
    assert torch.equal(old, current)
    mask = torch.as_tensor(obs["action_mask"]).flatten().bool()
    assert (~mask).any() and (old[~mask] < -1e30).all() and (old[mask] > -1e3).all()


# -- one real RLlib run ------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.ray
def test_ppo_samples_and_updates_the_shape_module_and_dl2_runs_the_export(tmp_path, capsys) -> None:
    """`dl2ray experiment rllib` on the tiny shape config (its policy.arch picks ShapeEnv and the shape
    module), two PPO iterations in a process of its own: ShapeEnv steps sampled, the learner's losses
    reported, the learner's network moved away from its initialisation, the best policy exported as a shape
    checkpoint, and `dl2ray compare` / `dl2ray simulate` run it as dl2:PATH."""
    from ray.rllib.core.rl_module.rl_module import RLModule

    out = tmp_path / "run"
    dl2ray = str(Path(sys.executable).with_name("dl2ray"))
    proc = subprocess.run(
        [dl2ray, "experiment", "rllib", "--config", str(TINY_SHAPE_YAML), "--out", str(out),
         "--seed", "3", "--minutes", "5", "--iterations", "2", "--val-every", "1",
         "--traces", "4", "--val-traces", "1", "--max-slots", "30", "--max-jobs", "3", "--json",
         "--algo-opt", "train_batch_size_per_learner=100", "--algo-opt", "minibatch_size=50",
         "--algo-opt", "num_epochs=2", "--algo-opt", "lr=0.01"],
        capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    record = json.loads((out / "run.json").read_text())
    assert doc["arch"] == record["arch"] == "shape" and record["run"]["max_jobs"] == 3
    assert [r["iteration"] for r in record["history"]] == [1, 2]
    assert record["history"][-1]["env_steps"] >= 200
    assert all(r["policy_loss"] is not None and r["vf_loss"] is not None for r in record["history"])
    path = out / "policy.pt"
    assert checkpoint_arch(path) == "shape"
    best = load_shape_checkpoint(path, expect=ShapeEnv(cfg=TINY_SHAPE).enc)
    assert best.extra["kind"] == "rllib" and best.extra["iteration"] == doc["best_iteration"]
    learner = RLModule.from_checkpoint(out / "rllib" / "learner_group" / "learner" / "rl_module"
                                       / "default_policy")
    assert isinstance(learner, ShapeTorchRLModule)
    start = _module(ShapeEnv(cfg=TINY_SHAPE, max_jobs=3), seed=3).pi.state_dict()
    saved = learner.pi.state_dict()
    assert start.keys() == saved.keys() and any(not torch.equal(start[k], saved[k]) for k in start)
    code, stdout, err = run_cli(capsys, "compare", "--config", str(TINY_SHAPE_YAML), "--schedulers",
                                f"drf,dl2:{path}", "--traces", "2", "--seed", str(TEST_SEED),
                                "--processes", "1", "--no-references", "--json")
    assert code == 0, err
    rows = {r["scheduler"]: r for r in json.loads(stdout)["results"]}
    assert rows[f"dl2:{path}"]["jobs"] == 4
    code, stdout, err = run_cli(capsys, "simulate", "--config", str(TINY_SHAPE_YAML), "--scheduler",
                                f"dl2:{path}", "--seed", str(TEST_SEED), "--json")
    assert code == 0 and json.loads(stdout)["jobs"] == 4, err
