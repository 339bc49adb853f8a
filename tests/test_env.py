"""DL2Env: gymnasium's checker, episode semantics, and one RLlib PPO iteration on it."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from support import small_config

from dl2ray import seeds
from dl2ray.envs.dl2_env import REWARDS, DL2Env

TINY = small_config(
    cluster={"nodes": [{"count": 3, "cpu": 8, "gpu": 2, "mem": 48}]},
    workload={"num_jobs": 4, "arrivals": {"pattern": "poisson", "rate": 1.0, "max_per_slot": 2}},
    policy={"window": 4, "hidden": [16]},
    sim={"max_slots": 60},
)


def _env() -> DL2Env:
    return DL2Env(cfg=TINY, trace_seeds=seeds.training(3))


@pytest.mark.parametrize("reward", REWARDS)
def test_passes_gymnasium_env_checker(reward: str) -> None:
    check_env(DL2Env(cfg=TINY, trace_seeds=seeds.training(3), reward=reward), skip_render_check=True)


def _episode(env: DL2Env, seed: int, choose) -> tuple[float, int, bool, bool]:
    obs, _ = env.reset(seed=seed)
    total, steps = 0.0, 0
    while True:
        mask = obs["action_mask"].astype(bool)
        assert mask[env.enc.stop]
        obs, r, term, trunc, info = env.step(choose(mask))
        total, steps = total + r, steps + 1
        assert info["masked_actions"] == 0
        if term or trunc:
            return total, steps, term, trunc


def _greedy_bundles(mask: np.ndarray) -> int:
    """The highest feasible non-stop action (bundles come last), else stop (the last action)."""
    return int(np.flatnonzero(mask[:-1])[-1]) if mask[:-1].any() else len(mask) - 1


def test_greedy_episode_ends_with_reward_and_is_reproducible() -> None:
    env = _env()
    a = _episode(env, 5, _greedy_bundles)
    b = _episode(env, 5, _greedy_bundles)
    assert a == b
    total, steps, terminated, truncated = a
    assert steps > 0 and total > 0 and terminated != truncated
    # Truncated exactly when the slot limit ended the trace (these jobs outlast 60 slots).
    assert truncated == (env.sim.slot >= TINY.sim.max_slots)


def _run(env: DL2Env, choose, **reset) -> tuple[float, dict, bool, bool]:
    """One episode from ``env.reset(**reset)``: (return, last info, terminated, truncated)."""
    obs, _ = env.reset(**reset)
    total = 0.0
    while True:
        obs, r, term, trunc, info = env.step(choose(obs["action_mask"].astype(bool)))
        total += r
        if term or trunc:
            return total, info, term, trunc


def _stop_first(mask: np.ndarray) -> int:
    """The first feasible non-stop action (a worker for the first job that can take one)."""
    return int(np.flatnonzero(mask)[0])


@pytest.mark.parametrize("choose", [_greedy_bundles, _stop_first], ids=["bundles", "first"])
def test_jct_rewards_sum_to_minus_total_and_average_jct(choose) -> None:
    """``jct``: return = −Σ_j (end_j − arrival_j) with unfinished jobs counted until the stop;
    ``avg_jct``: that over the trace's job count; ``paper``: Σ epochs/E — from the recorded run."""
    returns = {}
    for reward in REWARDS:
        returns[reward], info, _, _ = _run(DL2Env(cfg=TINY, reward=reward), choose, options={"trace_seed": 7})
    m = info["metrics"]
    assert returns["jct"] == pytest.approx(-m["censored_avg_jct"] * m["jobs"], rel=1e-9)
    assert returns["avg_jct"] == pytest.approx(-m["censored_avg_jct"], rel=1e-9)
    assert 0 <= returns["paper"] <= m["jobs"] + 1e-9  # a worker without a PS makes no progress


def test_reset_options_pick_the_trace_whatever_the_seed() -> None:
    env = _env()
    a = _run(env, _greedy_bundles, seed=0, options={"trace_seed": 3_000_001})
    b = _run(env, _greedy_bundles, seed=99, options={"trace_seed": 3_000_001})
    assert a[1]["trace_seed"] == 3_000_001 and a == b
    c = _run(env, _greedy_bundles, options={"trace_seed": 3_000_002})
    assert c[1]["metrics"] != a[1]["metrics"]  # another trace, other jobs
    drawn = _run(env, _greedy_bundles, seed=0)
    assert drawn[1]["trace_seed"] in env.trace_seeds


def test_cutoff_truncates_and_reports_the_run_so_far() -> None:
    full = _run(DL2Env(cfg=TINY), _stop_first, options={"trace_seed": 5})
    cut = _run(DL2Env(cfg=TINY, max_slots=6), _stop_first, options={"trace_seed": 5})
    _, info, terminated, truncated = cut
    assert (terminated, truncated) == (False, True) and info["slot"] == 6
    assert info["metrics"]["unfinished"] > 0 and full[1]["slot"] > 6
    with pytest.raises(ValueError, match="max_slots"):
        DL2Env(cfg=TINY, max_slots=0)
    with pytest.raises(ValueError, match="reward"):
        DL2Env(cfg=TINY, reward="makespan")


def test_info_metrics_equal_what_simulate_reports(capsys, testbed) -> None:
    """The shipped policy's greedy actions through the env give the run `dl2ray simulate` reports
    for `dl2:` that policy on the same test trace: the same allocations, the same metrics."""
    import json

    import torch
    from support import CONFIGS, REPO, run_cli

    from dl2ray.policy.network import load_checkpoint

    model = REPO / "models" / "dl2-testbed-paper.pt"
    policy = load_checkpoint(model).policy

    def greedy(mask: np.ndarray) -> int:
        with torch.no_grad():
            logits = policy(torch.as_tensor(obs_box["obs"]))
        return int(np.argmax(np.where(mask, logits.numpy(), -np.inf)))

    env = DL2Env(cfg=testbed)
    obs_box = {}
    obs, _ = env.reset(options={"trace_seed": 3_000_000})
    while True:
        obs_box["obs"] = obs["observations"]
        obs, _, term, trunc, info = env.step(greedy(obs["action_mask"].astype(bool)))
        if term or trunc:
            break
    code, out, _ = run_cli(capsys, "simulate", "--config", str(CONFIGS / "testbed-clairvoyant.yaml"),
                           "--scheduler", f"dl2:{model}", "--seed", "3000000", "--json")
    assert code == 0
    reported = json.loads(out)
    assert info["metrics"]["completed"] == reported["completed"] == 30
    for key, value in info["metrics"].items():
        assert reported[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key


def test_forbidden_action_is_treated_as_stop() -> None:
    env = _env()
    obs, _ = env.reset(seed=0)
    forbidden = np.flatnonzero(obs["action_mask"] == 0)
    assert forbidden.size  # a 4-job window at the first decision has empty rows: something is masked
    _, _, _, _, info = env.step(int(forbidden[0]))
    assert info["masked_actions"] == 1


@pytest.mark.ray
@pytest.mark.slow
def test_rllib_ppo_runs_one_iteration(ray_session) -> None:
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from dl2ray.learn.rllib.module import DL2TorchRLModule, module_config

    config = (
        PPOConfig()
        .environment(DL2Env, env_config={"cfg": TINY, "trace_seeds": seeds.training(3), "reward": "avg_jct"})
        .env_runners(num_env_runners=0, rollout_fragment_length=64)
        .training(train_batch_size_per_learner=64, minibatch_size=32, num_epochs=1)
        .rl_module(rl_module_spec=RLModuleSpec(module_class=DL2TorchRLModule,
                                               model_config=module_config(_env().enc, [16], 0, None)))
        .debugging(seed=0)
    )
    algo = config.build_algo()
    try:
        result = algo.train()
        assert result["env_runners"]["num_env_steps_sampled_lifetime"] >= 64
    finally:
        algo.stop()
