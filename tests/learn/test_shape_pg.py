"""On-policy per-job policy gradient of the shape policy (``--algo pg``): its credit by hand, a run that
learns, resumes with its baseline and ships, and its control."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from support import run_cli, tiny_shape_config

from dl2ray.envs.cluster_env import ClusterEnvironment
from dl2ray.learn.records import PolicyGradientRow, RLOptions, update_record
from dl2ray.learn.shape.pg import OnPolicyCollector, build_job_value, environments, pg_update
from dl2ray.learn.train import train_rl
from dl2ray.policy.shape import ShapeEncoding
from dl2ray.policy.shape_net import NumpyShapePolicy, build_shape_policy
from dl2ray.world import build_simulator

TINY = tiny_shape_config()
ENC = ShapeEncoding.from_config(TINY)


def _collector(credit: str, seed: int = 0, explore: bool = True, discount: float = 1.0) -> OnPolicyCollector:
    sims = [build_simulator(TINY, world="operator")]
    envs = [ClusterEnvironment(sim, lambda k: (1_000_000 + k, None)) for sim in sims]
    return OnPolicyCollector(environments(envs), ENC, np.random.default_rng(seed), credit, explore=explore,
                             discount=discount)


def test_credit_by_hand() -> None:
    """Jobs 1 (slots 0–1, ends at 1.5) and 2 (arrives at slot 1, unfinished when the run stops at 3)."""
    seen = present = [(0, [1]), (1, [1, 2]), (2, [2])]
    end = {1: 1.5}
    job = _collector("job")._credit(seen, present, end, last=3.0)
    assert [c.tolist() for c in job] == [[-1.5], [-0.5, -2.0], [-1.0]]
    # slot: every job's time in the system from slot t on: 1 + (0.5 + 1) + 1 = 3.5, then 2.5, then 1
    slot = _collector("slot")._credit(seen, present, end, last=3.0)
    assert [c.tolist() for c in slot] == [[-3.5], [-2.5, -2.5], [-1.0]]
    # discounted (γ = 0.5): slot 2: 1; slot 1: 1.5 + 0.5·1 = 2; slot 0: 1 + 0.5·2 = 2
    slot = _collector("slot", discount=0.5)._credit(seen, present, end, last=3.0)
    assert [c.tolist() for c in slot] == [[-2.0], [-2.0, -2.0], [-1.0]]
    # a slot with no job in between still counts as a step: slots 0 and 2, γ² between them
    gap = [(0, [1]), (1, []), (2, [2])]
    slot = _collector("slot", discount=0.5)._credit([gap[0], gap[2]], gap, {1: 1.0, 2: 3.0}, last=3.0)
    assert [c.tolist() for c in slot] == [[-1.25], [-1.0]]
    with pytest.raises(ValueError, match="discount"):
        _collector("slot", discount=0.0)


def test_collection_samples_on_policy_and_credits_every_decision() -> None:
    policy = NumpyShapePolicy(build_shape_policy(ENC, (16,), 8, 0))
    data = _collector("job").collect(policy, 2)
    assert data.episodes == 2 and len(data.credit) == len(data.slots) > 0
    pairs = zip(data.credit, data.slots, strict=True)
    assert all(len(c) == len(s.actions) and (c <= 0).all() for c, s in pairs)
    assert all(s.masks[np.arange(len(s.actions)), s.actions].all() for s in data.slots)  # allowed rows only
    again = _collector("job").collect(policy, 2)
    assert [s.actions.tolist() for s in again.slots] == [s.actions.tolist() for s in data.slots]


@pytest.mark.parametrize("control", [False, True])
def test_an_update_moves_the_policy_within_its_kl_limit(control: bool) -> None:
    net = build_shape_policy(ENC, (16,), 8, 0)
    value = build_job_value(ENC, 8, 0)
    before = [p.detach().clone() for p in net.parameters()]
    data = _collector("slot").collect(NumpyShapePolicy(net), 2)
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    vopt = torch.optim.Adam(value.parameters(), lr=1e-2)
    row = pg_update(net, value, opt, vopt, data, epochs=3, trust=0.05, entropy_weight=0.0, update=1,
                    control=np.random.default_rng(0) if control else None)
    assert isinstance(row, PolicyGradientRow) and 1 <= row.steps <= 3
    assert row.decisions == sum(len(s.actions) for s in data.slots) and row.slots == len(data.slots)
    assert row.kl >= 0 and np.isfinite(row.value_loss)
    assert any(not torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))
    assert update_record(row.__dict__) == row


@pytest.mark.parametrize("trust", [None, 0.05, 1e-6])
def test_the_update_equals_a_plain_loop_of_loss_step_and_kl(trust) -> None:
    """``pg_update`` shares one forward pass between a step's KL and the next step's loss; the plain loop
    (each step's loss, then the KL of its new weights, each from its own pass) ends at the same weights,
    steps and record (the KL stop included: 1e-6 stops after the first step)."""
    from dl2ray.learn.shape.pg import SurrogateTarget

    net = build_shape_policy(ENC, (16,), 8, 0)
    data = _collector("job").collect(NumpyShapePolicy(net), 2)
    plain = build_shape_policy(ENC, (16,), 8, 0)
    nets, values = (net, plain), (build_job_value(ENC, 8, 0), build_job_value(ENC, 8, 0))
    opts = [torch.optim.Adam(n.parameters(), lr=1e-2) for n in nets]
    vopts = [torch.optim.Adam(v.parameters(), lr=1e-2) for v in values]
    row = pg_update(net, values[0], opts[0], vopts[0], data, epochs=3, trust=trust, entropy_weight=0.01)
    target = SurrogateTarget(plain, values[1], vopts[1], data, 3)
    steps = 0
    for _ in range(3):
        loss, _ent = target.loss(plain, 0.01)
        opts[1].zero_grad()
        loss.backward()
        opts[1].step()
        steps += 1
        kl = target.moved(plain)
        if trust is not None and kl > trust:
            break
    assert row.steps == steps and row.kl == kl and (trust != 1e-6 or steps == 1)
    assert all(torch.equal(a, b) for a, b in zip(net.parameters(), plain.parameters(), strict=True))


def test_train_rl_pg_writes_resumes_with_its_baseline(tmp_path) -> None:
    out = tmp_path / "pg.pt"
    opts = RLOptions(traces=2, val_traces=1, val_every=1, checkpoint_every=1, algo="pg", credit="slot")
    _, res = train_rl(TINY, None, 2, 0, out, opts)
    assert res.updates == 2 and all(isinstance(h, PolicyGradientRow) for h in res.history)
    rec = json.loads(out.with_suffix(".json").read_text())
    assert rec["options"]["algo"] == "pg" and rec["options"]["credit"] == "slot"
    _, again = train_rl(TINY, None, 3, 0, out, opts, resume=True)
    assert again.updates == 3 and [h.update for h in again.history] == [1, 2, 3]


@pytest.mark.parametrize(("argv", "message"), [
    (["--algo", "mix", "--agents", "2"], "--algo mix: single process only"),
    (["--algo", "pg", "--experience", "lab"], "--experience: 'lab'"),
    (["--algo", "pg", "--credit", "team"], "--credit: 'team'"),
    (["--algo", "pg", "--no-replay"], "replay=false: --algo pg has no such part"),
    (["--algo", "counterfactual", "--no-critic", "--agents", "2"], "critic=false: --algo counterfactual"),
])
def test_bad_pg_options_exit_2(capsys, tmp_path, argv, message) -> None:
    code, _, err = run_cli(capsys, "train", "rl", *argv, "--out", str(tmp_path / "a.pt"), "--updates", "1")
    assert code == 2 and message in err and "Traceback" not in err


def test_without_the_critic_the_baseline_is_the_mean_credit_and_the_value_net_is_not_touched() -> None:
    from dl2ray.learn.shape.pg import SurrogateTarget

    net = build_shape_policy(ENC, (16,), 8, 0)
    value = build_job_value(ENC, 8, 0)
    before = [p.detach().clone() for p in value.parameters()]
    data = _collector("job").collect(NumpyShapePolicy(net), 2)
    vopt = torch.optim.Adam(value.parameters(), lr=1e-2)
    plain = SurrogateTarget(net, value, vopt, data, epochs=2, critic=False)
    assert all(torch.equal(a, b) for a, b in zip(before, value.parameters(), strict=True))
    credit = torch.from_numpy(np.concatenate(data.credit)).float()
    z = (credit - credit.mean()) / (credit.std() + 1e-6)
    # the decisions in PackedSlots' order are the slots' in order, so the advantages are the credit's z-scores
    assert torch.allclose(plain.adv, (z - z.mean()) / (z.std() + 1e-6), atol=1e-5)
    critic = SurrogateTarget(net, value, vopt, data, epochs=2)
    assert any(not torch.equal(a, b) for a, b in zip(before, value.parameters(), strict=True))
    assert not torch.allclose(critic.adv, plain.adv)


@pytest.mark.parametrize(("switch", "entropy", "critic"), [
    ("exploration", 0.0, True), ("critic", None, False), (None, None, True)])
def test_pg_ablation_switches_reach_the_update(monkeypatch, switch, entropy, critic) -> None:
    import dl2ray.learn.shape.trainer as trainer_mod

    seen: dict = {}
    real = trainer_mod.pg_update

    def spy(*args, **kw):
        seen["entropy"], seen["critic"] = args[7], args[10]
        return real(*args, **kw)

    monkeypatch.setattr(trainer_mod, "pg_update", spy)
    opts = RLOptions(traces=2, val_traces=1, val_every=5, algo="pg", **({switch: False} if switch else {}))
    train_rl(TINY, None, 1, 0, None, opts)
    assert seen["entropy"] == (TINY.policy.shape.entropy_weight if entropy is None else entropy)
    assert seen["critic"] is critic


@pytest.mark.parametrize(("algo", "off", "message"), [
    ("pg", "replay", "replay=false: --algo pg has no such part"),
    ("counterfactual", "critic", "critic=false: --algo counterfactual has no such part"),
    ("mix", "exploration", "its switches: none"),
])
def test_a_switch_the_algorithm_does_not_have_is_refused(algo, off, message) -> None:
    from dl2ray.errors import UserError

    with pytest.raises(UserError, match=message):
        train_rl(TINY, None, 1, 0, None, RLOptions(traces=2, val_traces=1, algo=algo, **{off: False}))


def test_each_algorithm_ablates_what_it_has() -> None:
    from dl2ray.studies.learning import ABLATIONS, ablations_of

    assert ablations_of("paper") == tuple(ABLATIONS)
    assert ablations_of("pg") == ("full", "no-actor-critic", "no-exploration", "zero-advantage")
    assert ablations_of("counterfactual") == ablations_of("mix") == ablations_of("improve") == (
        "full", "zero-advantage")


def test_without_exploration_every_stretch_is_played_greedily() -> None:
    policy = NumpyShapePolicy(build_shape_policy(ENC, (16,), 8, 0))
    greedy = [_collector("job", seed, explore=False).collect(policy, 2) for seed in (0, 1)]
    sampled = [_collector("job", seed).collect(policy, 2) for seed in (0, 1)]
    actions = [[s.actions.tolist() for s in d.slots] for d in greedy]
    assert actions[0] == actions[1]  # the generator draws nothing
    assert [s.actions.tolist() for s in sampled[0].slots] != actions[0]
    for sample in greedy[0].slots:  # each job's row is its best allowed one
        logits = np.where(sample.masks, policy.logits(sample.x, sample.g), -np.inf)
        assert (logits[np.arange(len(sample.actions)), sample.actions] == logits.max(axis=1)).all()



@pytest.mark.parametrize("argv", [["--algo", "pg"], ["--algo", "pg", "--credit", "job"], ["--algo", "paper"]])
def test_a_credit_discount_without_slot_credit_exits_2(capsys, tmp_path, argv) -> None:
    """``policy.shape.credit_discount`` discounts ``--credit slot`` alone: elsewhere it would be ignored."""
    config = Path(__file__).resolve().parents[2] / "configs/testbed-online-explore-discounted.yaml"
    code, _, err = run_cli(capsys, "train", "rl", "--config", str(config), *argv, "--out",
                           str(tmp_path / "a.pt"), "--updates", "1")
    assert code == 2 and "policy.shape.credit_discount: 0.9" in err and "Traceback" not in err


@pytest.mark.parametrize("argv", [["--algo", "pg", "--agents", "2"], ["--algo", "paper"]])
def test_rollback_where_nothing_rolls_back_exits_2(capsys, tmp_path, argv) -> None:
    """``policy.shape.rollback`` is the single-process shape learners' (dl2ray.learn.train)."""
    config = Path(__file__).resolve().parents[2] / "configs/testbed-online-explore-rollback.yaml"
    code, _, err = run_cli(capsys, "train", "rl", "--config", str(config), *argv, "--out",
                           str(tmp_path / "a.pt"), "--updates", "1")
    assert code == 2 and "policy.shape.rollback: 1.2" in err and "Traceback" not in err
