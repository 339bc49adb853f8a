"""The RLlib side of `experiment rllib` without Ray: which algorithms run, and APPO's target network.

RLlib's learners name the module APIs they need (``Learner.rl_module_required_apis``);
every algorithm `--algo` accepts gets a module that has them, and every other
algorithm of RLlib's registry is refused with a reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dl2ray.config import load_config
from dl2ray.envs.dl2_env import DL2Env
from dl2ray.learn.rllib.train import ALGOS, REFUSED, RLlibRun, algorithm_config, algorithm_refusal

TINY = load_config(Path(__file__).resolve().parent / "tiny.yaml")


def test_every_rllib_algorithm_is_accepted_or_refused_with_a_reason() -> None:
    from ray.rllib.algorithms.registry import ALGORITHMS

    names = {name.lower() for name in ALGORITHMS}
    assert set(ALGOS) | set(REFUSED) == names
    assert not set(ALGOS) & set(REFUSED)
    for name in ALGOS:
        assert algorithm_refusal(name) is None
    for name in REFUSED:
        assert algorithm_refusal(name).startswith(f"{name}: ")
    assert "not an RLlib algorithm" in algorithm_refusal("a2c")


@pytest.mark.parametrize("algo", ALGOS)
def test_each_algorithm_gets_a_module_with_the_apis_its_learner_needs(algo) -> None:
    config = algorithm_config(TINY, RLlibRun(algo))
    config.validate()  # RLlib's own checks of our defaults
    module_class = config.rl_module_spec.module_class
    needed = config.learner_class.rl_module_required_apis()
    assert needed and all(issubclass(module_class, api) for api in needed), (module_class, needed)
    if algo != "ppo":  # the learner's thread: 1 s iterations, not RLlib's 10 s
        assert config.min_time_s_per_iteration == 1


def test_appo_target_network_is_a_masked_frozen_copy_of_the_policy() -> None:
    from ray.rllib.core.columns import Columns
    from ray.rllib.core.learner.utils import update_target_network
    from ray.rllib.core.rl_module.apis import TARGET_NETWORK_ACTION_DIST_INPUTS

    from dl2ray.learn.rllib.module import DL2APPOTorchRLModule, module_config

    env = DL2Env(cfg=TINY)
    module = DL2APPOTorchRLModule(observation_space=env.observation_space, action_space=env.action_space,
                                  model_config=module_config(env.enc, [16], 0, None))
    module.make_target_networks()
    assert module.get_target_network_pairs() == [(module.pi, module._old_pi)]
    assert module._old_pi is not module.pi
    assert not any(p.requires_grad for p in module._old_pi.parameters())

    obs, _ = env.reset(options={"trace_seed": 3_000_000})
    batch = {Columns.OBS: {k: torch.as_tensor(v)[None] for k, v in obs.items()}}
    mask = torch.as_tensor(obs["action_mask"]).bool()
    assert (~mask).any()

    def target() -> torch.Tensor:
        with torch.no_grad():
            return module.forward_target(batch)[TARGET_NETWORK_ACTION_DIST_INPUTS][0]

    with torch.no_grad():
        current = module.forward_train(batch)[Columns.ACTION_DIST_INPUTS][0]
    old = target()
    assert torch.equal(old, current)  # a copy, masked like the policy
    assert (old[~mask] < -1e30).all() and (old[mask] > -1e3).all()

    with torch.no_grad():  # the policy moves, the copy stays until the learner syncs it
        for p in module.pi.parameters():
            p.add_(0.1)
    assert torch.equal(target(), old)
    update_target_network(main_net=module.pi, target_net=module._old_pi, tau=1.0)
    with torch.no_grad():
        assert torch.equal(target(), module.forward_train(batch)[Columns.ACTION_DIST_INPUTS][0])
