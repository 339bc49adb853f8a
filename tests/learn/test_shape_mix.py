"""Twin credit and on-policy advantages in one update (``--algo mix``): with the on-policy term weighted 0
it is the counterfactual update; with weight 1 both move the policy, within the KL limit; a run writes,
resumes with its baseline and both episode counters, is reproducible, and bad options exit 2."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from support import run_cli, tiny_shape_config

from dl2ray.envs.cluster_env import ClusterEnvironment
from dl2ray.learn import seeds
from dl2ray.learn.records import MixRow, RLOptions, update_record
from dl2ray.learn.shape.counterfactual import CounterfactualCollector, improve_policy
from dl2ray.learn.shape.mix import mix_update
from dl2ray.learn.shape.pg import OnPolicyCollector, build_job_value, environments
from dl2ray.learn.train import train_rl
from dl2ray.policy.shape import ShapeEncoding
from dl2ray.policy.shape_net import NumpyShapePolicy, ShapePolicyNet, build_shape_policy
from dl2ray.world import build_simulator

TINY = tiny_shape_config()
ENC = ShapeEncoding.from_config(TINY)


def _experience(net: ShapePolicyNet):
    """Tries of 6 slots (2 side-by-side episodes) and 2 on-policy episodes of ``net`` on TINY."""
    s = TINY.policy.shape
    cf = CounterfactualCollector([build_simulator(TINY) for _ in range(2)], ENC, seeds.training(3),
                                 np.random.default_rng(4), s.horizon, s.gamma, s.jobs_per_slot, s.samples,
                                 s.uniform, s.temperature)
    env = ClusterEnvironment(build_simulator(TINY, world="operator"), lambda k: (1_000_000 + k, None))
    pg = OnPolicyCollector(environments([env]), ENC, np.random.default_rng(0), "slot")
    policy = NumpyShapePolicy(net)
    return cf.collect(policy, 6), pg.collect(policy, 2)


def _params(net: ShapePolicyNet) -> list[torch.Tensor]:
    return [p.detach().clone() for p in net.parameters()]


def test_weight_zero_is_the_counterfactual_update() -> None:
    s = TINY.policy.shape.model_copy(update={"trust": None, "epochs": 3})
    net = build_shape_policy(ENC, (16,), 8, 0)
    tries, played = _experience(net)
    assert any(len(t.actions) > 1 for t in tries.tries)
    ref = build_shape_policy(ENC, (16,), 8, 0)
    improve_policy(ref, torch.optim.Adam(ref.parameters(), lr=1e-2), tries, s.epochs, s.kl, s.entropy_weight)
    value = build_job_value(ENC, 8, 0)
    row = mix_update(net, value, torch.optim.Adam(net.parameters(), lr=1e-2),
                     torch.optim.Adam(value.parameters(), lr=1e-2), tries, played, s, weight=0.0, update=1)
    assert row.steps == 3 and row.surrogate_loss != 0.0
    assert all(torch.allclose(a, b) for a, b in zip(_params(ref), net.parameters(), strict=True))


def test_both_terms_move_the_policy_within_the_kl_limit() -> None:
    s = TINY.policy.shape.model_copy(update={"trust": 0.02, "epochs": 8})
    moved = {}
    for weight in (0.0, 1.0):
        net = build_shape_policy(ENC, (16,), 8, 0)
        tries, played = _experience(net)
        value = build_job_value(ENC, 8, 0)
        row = mix_update(net, value, torch.optim.Adam(net.parameters(), lr=1e-2),
                         torch.optim.Adam(value.parameters(), lr=1e-2), tries, played, s, weight, update=1)
        assert isinstance(row, MixRow) and 1 <= row.steps <= 8 and row.kl >= 0
        assert row.steps == 8 or row.kl > s.trust  # stopped by the KL limit, or ran every epoch
        assert row.decisions == sum(len(x.actions) for x in played.slots) and row.tries == len(tries.tries)
        assert update_record(row.__dict__) == row
        moved[weight] = _params(net)
    assert any(not torch.equal(a, b) for a, b in zip(moved[0.0], moved[1.0], strict=True))


def test_a_negative_weight_is_refused() -> None:
    net = build_shape_policy(ENC, (16,), 8, 0)
    tries, played = _experience(net)
    value = build_job_value(ENC, 8, 0)
    with pytest.raises(ValueError, match="mix_weight"):
        mix_update(net, value, torch.optim.Adam(net.parameters()), torch.optim.Adam(value.parameters()),
                   tries, played, TINY.policy.shape, weight=-1.0)


def test_train_rl_mix_writes_resumes_and_reproduces(tmp_path) -> None:
    opts = RLOptions(traces=2, val_traces=1, val_every=1, checkpoint_every=1, algo="mix", credit="job",
                     mix_weight=0.5)
    out = tmp_path / "mix.pt"
    _, res = train_rl(TINY, None, 2, 0, out, opts)
    first = list(res.history)
    assert res.updates == 2 and all(isinstance(h, MixRow) for h in res.history)
    rec = json.loads(out.with_suffix(".json").read_text())
    assert rec["options"]["algo"] == "mix" and rec["options"]["mix_weight"] == 0.5
    ckpt = torch.load(out, weights_only=False)
    assert ckpt["extra"]["pg_episodes"] == 2 * TINY.policy.shape.envs  # one set of episodes per update
    _, again = train_rl(TINY, None, 3, 0, out, opts, resume=True)
    assert again.updates == 3 and [h.update for h in again.history] == [1, 2, 3]
    _, same = train_rl(TINY, None, 2, 0, tmp_path / "same.pt", opts)  # (a resume restarts the episodes)
    assert [h.policy_loss for h in same.history] == [h.policy_loss for h in first]


@pytest.mark.parametrize(("argv", "message"), [
    (["--algo", "mix", "--agents", "2"], "--algo mix: single process only"),
    (["--algo", "mix", "--mix-weight", "-1"], "--mix-weight: -1.0"),
])
def test_bad_mix_options_exit_2(capsys, tmp_path, argv, message) -> None:
    code, _, err = run_cli(capsys, "train", "rl", *argv, "--out", str(tmp_path / "a.pt"), "--updates", "1")
    assert code == 2 and message in err and "Traceback" not in err
