"""A3C of the shape policy (the architecture that ships): the GlobalPolicy's outer step and its refusals,
shape agents on Ray in both twins, and ``train rl --algo counterfactual --agents N``."""

from __future__ import annotations

import json
from dataclasses import replace as dataclasses_replace

import numpy as np
import pytest
import torch
from support import run_cli

from clusters.a3c.global_policy import A3COptions, GlobalPolicyImpl
from clusters.a3c.weights import load_vector, params_vector
from dl2ray.learn.records import CounterfactualRow
from dl2ray.learn.shape.trainer import counterfactual_update
from dl2ray.learn.shape.twin import TwinExperience
from dl2ray.policy.shape_net import NumpyShapePolicy, ShapePolicyNet, load_shape_checkpoint

OPTS = A3COptions(agents=2, traces=4, val_every=None, checkpoint_every=2, max_update_norm=10.0, max_lag=3)
ROW = CounterfactualRow(-1, 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0, 0)


def test_the_global_policy_holds_the_shape_network_and_applies_pseudo_gradients(tiny_shape) -> None:
    """One agent, no lag: the master's weights after a push are exactly the agent's improved ones."""
    gp = GlobalPolicyImpl(tiny_shape, None, 0, None, OPTS)
    assert isinstance(gp.policy, ShapePolicyNet) and gp.value is None
    version, theta = gp.get_weights()
    net = ShapePolicyNet(gp.policy.enc, (16,), 8)
    load_vector(net, None, theta)
    opt = torch.optim.Adam(net.parameters(), lr=tiny_shape.policy.shape.lr)
    exp = TwinExperience(tiny_shape, [1_000_000, 1_000_001], np.random.default_rng(0))
    row = counterfactual_update(net, opt, exp.collect(NumpyShapePolicy(net)), tiny_shape, None)
    improved = params_vector(net, None)
    assert not np.allclose(improved, theta)
    updates, weights = gp.push(theta - improved, row, 0, pull=True, version=version)
    assert updates == 1 and np.allclose(weights, improved, atol=1e-6)
    assert isinstance(gp.result.history[0], CounterfactualRow) and gp.result.history[0].update == 1


@pytest.mark.parametrize(("poison", "reason"), [
    (lambda g: g[:-1], "shape"),
    (lambda g: np.where(np.arange(g.size) == 3, np.nan, g), "nan"),
    (lambda g: np.full_like(g, np.inf), "nan"),
    (lambda g: g + 1.0, "norm"),
])
def test_a_poisoned_push_is_refused_counted_and_never_applied(tiny_shape, poison, reason) -> None:
    gp = GlobalPolicyImpl(tiny_shape, None, 0, None, OPTS)
    _, theta = gp.get_weights()
    updates, weights = gp.push(poison(np.zeros_like(theta)), ROW, 0, pull=True, version=0)
    assert updates == 0 and np.array_equal(weights, theta)
    assert gp.stats()["refused"] == {reason: 1} and not gp.result.history


def test_a_push_beyond_the_staleness_bound_is_refused(tiny_shape) -> None:
    gp = GlobalPolicyImpl(tiny_shape, None, 0, None, OPTS)
    small = np.full(gp.size, 1e-4, np.float32)
    for _ in range(4):
        gp.push(small, ROW, 0, version=gp.get_weights()[0])
    gp.push(small, ROW, 1, version=0)  # computed 4 updates ago; the bound is 3
    gp.push(small, ROW, 1, version=1)  # 3 ago: accepted
    assert gp.stats()["updates"] == 5 and gp.stats()["refused"] == {"stale": 1}


def test_shape_checkpoints_resume_with_their_counts(tiny_shape, tmp_path) -> None:
    out = tmp_path / "a3c.pt"
    gp = GlobalPolicyImpl(tiny_shape, None, 0, str(out), OPTS)
    gp.push(np.full(gp.size, 1e-3, np.float32), ROW, 0)
    gp.push(np.full(gp.size, np.nan, np.float32), ROW, 1)
    gp.push(np.full(gp.size, 1e-3, np.float32), ROW, 1)  # the second update writes the checkpoint
    ckpt = load_shape_checkpoint(out)
    assert ckpt.extra["kind"] == "a3c" and ckpt.extra["updates"] == 2 and ckpt.extra["refused"] == {"nan": 1}
    again = GlobalPolicyImpl(tiny_shape, None, 0, str(out), OPTS, resume=True)
    assert again.stats()["updates"] == 2 and again.stats()["refused"] == {"nan": 1}
    assert np.array_equal(again.get_weights()[1], gp.get_weights()[1])
    assert [type(r) for r in again.result.history] == [CounterfactualRow, CounterfactualRow]


SHARED = A3COptions(agents=2, traces=4, val_every=None, checkpoint_every=1, algo="pg", share_baseline=True)


def test_a_shared_baseline_travels_with_the_policy_and_the_master_applies_both(tiny_shape) -> None:
    """``share_baseline``: the master hands out ``[policy ; baseline]``; an online agent that took it
    pushes both networks' pseudo-gradients, and with one agent and no lag the master's weights after the
    push are exactly the agent's improved policy and fitted baseline."""
    from clusters.a3c.local import LocalSettings, local_learner
    from clusters.a3c.weights import num_params

    gp = GlobalPolicyImpl(tiny_shape, None, 0, None, SHARED)
    version, theta = gp.get_weights()
    n_policy = num_params(gp.policy, None)
    assert gp.baseline is not None and theta.shape == (n_policy + num_params(gp.baseline, None),)
    step = local_learner(tiny_shape, [1_000_000], 0, [0, 0], LocalSettings(algo="pg", share_baseline=True))
    step.take(theta)
    assert np.array_equal(params_vector(step.baseline, None), theta[n_policy:])
    push = step.compute(version)
    assert push.grad.shape == theta.shape
    assert np.abs(push.grad[:n_policy]).sum() > 0 and np.abs(push.grad[n_policy:]).sum() > 0
    updates, weights = gp.push(push.grad, push.row, 0, pull=True, version=version)
    assert updates == 1 and np.allclose(weights[:n_policy], params_vector(step.policy, None), atol=1e-6)
    assert np.allclose(weights[n_policy:], params_vector(step.baseline, None), atol=1e-6)
    with pytest.raises(ValueError, match="shared baseline"):
        step.take(theta[:n_policy])  # the policy alone: not what a sharing agent takes


def test_without_sharing_an_online_agent_pushes_its_policy_alone(tiny_shape) -> None:
    from clusters.a3c.local import LocalSettings, local_learner

    gp = GlobalPolicyImpl(tiny_shape, None, 0, None, dataclasses_replace(SHARED, share_baseline=False))
    version, theta = gp.get_weights()
    assert gp.baseline is None and theta.shape == (gp.size,)
    step = local_learner(tiny_shape, [1_000_000], 0, [0, 0], LocalSettings(algo="pg"))
    step.take(theta)
    assert step.compute(version).grad.shape == theta.shape


def test_a_shared_baseline_is_in_the_checkpoint_and_resumes(tiny_shape, tmp_path) -> None:
    out = tmp_path / "a3c.pt"
    gp = GlobalPolicyImpl(tiny_shape, None, 0, str(out), SHARED)
    gp.push(np.full(gp.size, 1e-3, np.float32), ROW, 0)  # writes the checkpoint (checkpoint_every 1)
    again = GlobalPolicyImpl(tiny_shape, None, 0, str(out), SHARED, resume=True)
    assert np.array_equal(again.get_weights()[1], gp.get_weights()[1])
    plain = tmp_path / "plain.pt"
    GlobalPolicyImpl(tiny_shape, None, 0, str(plain), dataclasses_replace(SHARED, share_baseline=False))
    with pytest.raises(ValueError, match="no shared baseline"):
        GlobalPolicyImpl(tiny_shape, None, 0, str(plain), SHARED, resume=True)


def test_only_the_online_learner_shares_a_baseline() -> None:
    with pytest.raises(ValueError, match="algo pg"):
        A3COptions(algo="counterfactual", share_baseline=True)


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("twin", ["config", "observed"])
def test_two_shape_agents_train_the_global_policy(ray_session, tiny_shape, tmp_path, twin) -> None:
    from clusters.a3c.training import A3CRun

    opts = A3COptions(agents=2, traces=4, val_every=3, val_traces=1, twin=twin, twin_window=2)
    run = A3CRun(tiny_shape, None, 0, tmp_path / "a3c.pt", opts)
    try:
        assert run.train(4) == 4
        history = run.finish()
        agents = run.agent_stats()
    finally:
        run.shutdown()
    assert [r.update for r in history.history] == [1, 2, 3, 4]
    assert all(isinstance(r, CounterfactualRow) and r.slots == 3 for r in history.history)
    vals = [v.update for v in history.validation]  # update 3's may be dropped while update 0's runs
    assert vals[0] == 0 and vals[-1] == 4 and set(vals) <= {0, 3, 4}
    if twin == "observed":  # every agent that pushed ran its own cluster first
        assert all(a["observed"] >= 1 and len(a["cluster_jct"]) == a["observed"] for a in agents
                   if a["observed"])
        assert sum(a["observed"] for a in agents) >= 1
    assert load_shape_checkpoint(tmp_path / "a3c.best.pt").extra["kind"] == "a3c-best"


@pytest.mark.ray
@pytest.mark.slow
def test_train_rl_counterfactual_with_two_agents(capsys, tmp_path, tiny_shape_yaml, ray_session) -> None:
    out = tmp_path / "a3c.pt"
    code, stdout, err = run_cli(capsys, "train", "rl", "--config", str(tiny_shape_yaml),
                                "--algo", "counterfactual", "--agents", "2", "--twin", "observed",
                                "--updates", "3", "--out", str(out), "--traces", "2", "--val-traces", "1",
                                "--val-every", "3", "--json")
    assert code == 0, err
    doc = json.loads(stdout)
    assert doc["updates"] == 3 and doc["agents"] == 2 and sum(doc["per_agent"].values()) == 3
    assert doc["refused"] == {}
    run = json.loads(out.with_suffix(".json").read_text())
    assert run["options"]["twin"] == "observed" and "kl" in run["history"][0]
    assert load_shape_checkpoint(out).extra["updates"] == 3


@pytest.mark.ray
@pytest.mark.slow
def test_bench_a3c_measures_a_warm_started_shape_run(ray_session, tiny_shape, tmp_path) -> None:
    """``bench a3c --init``: the single-process row and the Ray rows all start from the checkpoint."""
    from clusters.a3c.bench import bench_a3c
    from clusters.a3c.weights import fresh_networks, save_networks

    init = tmp_path / "init.pt"
    net, _ = fresh_networks(tiny_shape, seed=7)
    save_networks(init, net, None, tiny_shape.catalogue.names, {"kind": "test"})
    paper = tiny_shape.model_copy(update={"policy": tiny_shape.policy.model_copy(update={"arch": "paper"})})
    doc = bench_a3c(paper, [1], seconds=0.1, warmup=0.0, traces_per_agent=2, single_process=True, init=init)
    assert doc["init"] == str(init)
    assert [(r["mode"], r["agents"]) for r in doc["results"]] == [("process", 1), ("ray", 1)]
    assert all(r["slots"] > 0 and r["updates"] >= 1 for r in doc["results"])  # the init's arch ran: shape


@pytest.mark.ray
@pytest.mark.slow
def test_bench_a3c_puts_a_plain_row_beside_each_ray_row(ray_session, tiny_shape) -> None:
    """``--plain --same-traces``: per count a plain row then a Ray row, speed-ups within a mode, of_plain."""
    from clusters.a3c.bench import bench_a3c

    doc = bench_a3c(tiny_shape, [1, 2], seconds=0.1, warmup=0.0, traces_per_agent=2, plain=True,
                    same_traces=True)
    rows = doc["results"]
    assert doc["same_traces"] is True
    assert [(r["mode"], r["agents"]) for r in rows] == [("plain", 1), ("ray", 1), ("plain", 2), ("ray", 2)]
    assert rows[0]["speedup"] == rows[1]["speedup"] == 1.0
    for plain, ray_row in (rows[0:2], rows[2:4]):
        assert plain["slots"] > 0 and ray_row["slots"] > 0
        assert ray_row["of_plain"] == pytest.approx(ray_row["slots_per_s"] / plain["slots_per_s"], abs=1e-3)


@pytest.mark.parametrize(("argv", "message"), [
    (["--algo", "improve", "--agents", "2"], "--algo improve"),
    (["--algo", "paper", "--twin", "observed"], "--twin observed"),
    (["--algo", "counterfactual", "--twin", "truth"], "--twin: 'truth'"),
    (["--algo", "pg", "--share-baseline"], "--share-baseline"),
    (["--algo", "counterfactual", "--agents", "2", "--share-baseline"], "--share-baseline"),
    (["--algo", "pg", "--defer-validation"], "--defer-validation"),
])
def test_bad_learner_options_exit_2(capsys, tmp_path, argv, message) -> None:
    code, _, err = run_cli(capsys, "train", "rl", *argv, "--out", str(tmp_path / "a.pt"), "--updates", "1")
    assert code == 2 and message in err and "Traceback" not in err


@pytest.mark.parametrize(("given", "algo", "agents", "critic", "shared"), [
    (None, "pg", 2, True, True),          # the default of A3C learning online
    (None, "pg", 4, True, True),
    (None, "pg", 1, True, False),         # one learner: no master
    (None, "pg", 2, False, False),        # no critic: no baseline to share
    (None, "counterfactual", 2, True, False),
    (None, "paper", 2, True, False),      # the paper's networks keep their critic in the master anyway
    (False, "pg", 2, True, False),        # --own-baseline
    (True, "pg", 2, True, True),          # --share-baseline
])
def test_the_shared_baseline_is_the_default_of_a3c_pg_only(given, algo, agents, critic, shared) -> None:
    from dl2ray.cli.train import shared_baseline

    assert shared_baseline(given, algo, agents, critic) is shared


@pytest.mark.ray
@pytest.mark.slow
def test_federation_experiment_trains_the_shape_policy_and_judges_a_held_out_member(
        ray_session, tmp_path, tiny_shape_yaml) -> None:
    import yaml

    from clusters.federation.experiment import HEURISTICS, run_experiment

    def member(name: str, mode: str, nodes: int) -> dict:
        overrides = {"cluster": {"nodes": [{"count": nodes}]}}
        return {"name": name, "mode": mode, "traces": 2,
                "backend": {"kind": "sim", "config": str(tiny_shape_yaml), "overrides": overrides}}

    path = tmp_path / "fed.yaml"
    path.write_text(yaml.safe_dump({
        "name": "shape", "learner": {"config": str(tiny_shape_yaml), "out": str(tmp_path / "out"),
                                     "learning": {"twin": "observed", "twin_window": 2}},
        "members": [member("a", "learn", 3), member("b", "learn", 4), member("c", "shadow", 5)]}))
    doc = run_experiment(path, updates=2, test_traces=2, progress=lambda _: None, learning_seeds=[0, 1])
    assert [r["member"] for r in doc["members"]] == ["a", "b", "c"]
    for seed in ("0", "1"):
        runs = doc["training"][seed]
        assert set(runs) == {"federated", "a", "b"} and all(r["updates"] >= 2 for r in runs.values())
        assert all(r["refused"] == {} for r in runs.values())
    a, c = doc["members"][0], doc["members"][2]
    assert not a["held_out"] and len(a["federated_vs_alone"]["per_seed"]) == 2
    assert c["held_out"] and "alone" not in c and len(c["federated"]) == 2
    assert all(len(a[h]) == 2 for h in HEURISTICS) and a["best_heuristic"] in HEURISTICS
    assert a["federated_vs_best_heuristic"]["mean"] > 0


class _InProcessSink:
    """The GlobalPolicy's push/fetch in this process (what GlobalPolicySink calls through Ray)."""

    def __init__(self, gp: GlobalPolicyImpl) -> None:
        self.gp = gp

    def fetch(self):
        return self.gp.get_weights()

    def push(self, grad, row, version):
        return self.gp.push(grad, row, 1000, None, True, version)


def test_the_live_shape_learner_pushes_from_what_its_cluster_showed(tiny_shape) -> None:
    """Views of a cluster the learner cannot see into: it decides greedily, observes, pushes in the
    background; the global policy advances and the learner decides with the weights that come back."""
    from clusters.a3c.live_shape import LiveShapeLearner
    from clusters.a3c.weights import fresh_networks
    from dl2ray.world import build_simulator

    gp = GlobalPolicyImpl(tiny_shape, None, 0, None, OPTS)
    net, _ = fresh_networks(tiny_shape)
    learner = LiveShapeLearner(tiny_shape, net, _InProcessSink(gp), slots_per_update=3, seed=0, streams=[0])
    cluster = build_simulator(tiny_shape)
    view = cluster.reset(1_000_000)
    for _ in range(40):
        alloc = learner.decide(view)
        learner.join()  # the test waits for each push; the live loop never does
        res = cluster.step(alloc)
        view = cluster.reset(1_000_001) if res.done else res.view
    st = learner.stats()
    assert st["pushed"] >= 3 and st["errors"] == 0 and st["twin_traces"] == st["pushed"]
    assert gp.stats()["updates"] == st["pushed"] == st["version"] and gp.stats()["refused"] == {}
    assert np.array_equal(params_vector(learner.net, None), gp.get_weights()[1])
    assert all(isinstance(r, CounterfactualRow) for r in gp.result.history)


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize(("flags", "share"), [([], True), (["--own-baseline"], False)])
def test_train_rl_pg_online_with_two_agents(capsys, tmp_path, tiny_shape_yaml, ray_session, flags,
                                            share) -> None:
    """``--algo pg --agents 2``: each agent learns online on its own cluster (policy.experience: cluster)
    and pushes on-policy pseudo-gradients; the run's records are on-policy rows. By default the baseline
    is the master's; ``--own-baseline``: the same with each agent's own."""
    out = tmp_path / "a3c.pt"
    code, stdout, err = run_cli(capsys, "train", "rl", "--config", str(tiny_shape_yaml),
                                "--algo", "pg", "--agents", "2", "--updates", "3", "--out", str(out),
                                "--traces", "2", "--val-traces", "1", "--val-every", "3", "--json", *flags)
    assert code == 0, err
    doc = json.loads(stdout)
    assert doc["updates"] == 3 and sum(doc["per_agent"].values()) == 3 and doc["refused"] == {}
    run = json.loads(out.with_suffix(".json").read_text())
    assert run["options"]["algo"] == "pg" and run["config"]["policy"]["experience"] == "cluster"
    assert run["options"]["share_baseline"] is share
    assert ("baseline" in load_shape_checkpoint(out).extra) is share
    assert all("mean_credit" in r and "decisions" in r for r in run["history"])
