"""DL2Env: gymnasium's checker, episode semantics, and one RLlib PPO iteration on it."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from support import small_config

from dl2ray.env import DL2Env
from dl2ray.learn import seeds

TINY = small_config(
    cluster={"nodes": [{"count": 3, "cpu": 8, "gpu": 2, "mem": 48}]},
    workload={"num_jobs": 4, "arrivals": {"pattern": "poisson", "rate": 1.0, "max_per_slot": 2}},
    policy={"window": 4, "hidden": [16]},
    sim={"max_slots": 60},
)


def _env() -> DL2Env:
    return DL2Env(cfg=TINY, trace_seeds=seeds.training(3))


def test_passes_gymnasium_env_checker() -> None:
    check_env(_env(), skip_render_check=True)


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


def test_forbidden_action_is_treated_as_stop() -> None:
    env = _env()
    obs, _ = env.reset(seed=0)
    forbidden = np.flatnonzero(obs["action_mask"] == 0)
    if forbidden.size:
        _, _, _, _, info = env.step(int(forbidden[0]))
        assert info["masked_actions"] == 1


@pytest.mark.ray
@pytest.mark.slow
def test_rllib_ppo_runs_one_iteration(ray_session) -> None:
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec
    from ray.rllib.examples.rl_modules.classes.action_masking_rlm import ActionMaskingTorchRLModule

    config = (
        PPOConfig()
        .environment(DL2Env, env_config={"cfg": TINY, "trace_seeds": seeds.training(3)})
        .env_runners(num_env_runners=0, rollout_fragment_length=64)
        .training(train_batch_size_per_learner=64, minibatch_size=32, num_epochs=1)
        .rl_module(rl_module_spec=RLModuleSpec(module_class=ActionMaskingTorchRLModule,
                                               model_config={"head_fcnet_hiddens": [16]}))
        .debugging(seed=0)
    )
    algo = config.build_algo()
    try:
        result = algo.train()
        assert result["env_runners"]["num_env_steps_sampled_lifetime"] >= 64
    finally:
        algo.stop()
