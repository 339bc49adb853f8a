"""RL training on a tiny config: rollouts, same seed → same curve, an end-to-end run from an SL init."""

from __future__ import annotations

import itertools
import json
from dataclasses import asdict

import numpy as np
import pytest
from support import run_cli, small_config

from dl2ray import seeds
from dl2ray.envs.cluster_env import ClusterEnvironment
from dl2ray.evaluation.metrics import summarize_run
from dl2ray.learn.exploration import JobAwareExploration
from dl2ray.learn.records import RLOptions
from dl2ray.learn.rl import Trainer
from dl2ray.learn.rollout import Collector, to_batch
from dl2ray.learn.sl import SLRun, run_sl
from dl2ray.learn.train import train_rl
from dl2ray.policy.encoding import Encoding
from dl2ray.policy.network import NumpyPolicy, build_networks, load_checkpoint
from dl2ray.schedulers.base import make_scheduler
from dl2ray.sim import run_episode
from dl2ray.world import build_simulator

TINY = small_config(
    cluster={"nodes": [{"count": 3, "cpu": 8, "gpu": 2, "mem": 48}]},
    workload={"num_jobs": 5, "arrivals": {"pattern": "poisson", "rate": 1.0, "max_per_slot": 2}},
    policy={"window": 6, "hidden": [32], "minibatch": 32, "replay_size": 256},
    sim={"max_slots": 150},  # a random-init greedy policy may never run a job
)
ENC = Encoding.from_config(TINY)


def test_collector_records_slots_with_shared_reward_and_next_state():
    policy, _ = build_networks(ENC, TINY.policy.hidden, 0)
    env = ClusterEnvironment.over_seeds(build_simulator(TINY), seeds.training(2))
    col = Collector(env, ENC, np.random.default_rng(0),
                    JobAwareExploration(0.5, 4.0), np.random.default_rng(1))
    recs = col.collect(NumpyPolicy.from_torch(policy), min_steps=1, whole_episodes=True)
    assert recs[-1].terminal and not any(r.terminal for r in recs[:-1])
    assert [r.slot for r in recs] == list(range(len(recs)))
    for prev, nxt in itertools.pairwise(recs):
        if nxt.steps:  # s_{t+1} is the first state the next slot's loop saw
            np.testing.assert_array_equal(prev.next_state, nxt.steps[0].state)
    assert not recs[-1].next_state.any()
    assert all(s.mask[s.action] for r in recs for s in r.steps)
    batch = to_batch(recs, ENC, TINY.policy.gamma)
    assert len(batch) == sum(len(r.steps) for r in recs) > 0


def _curve(opts: RLOptions, n: int = 3):
    policy, value = build_networks(ENC, TINY.policy.hidden, 11)
    tr = Trainer(TINY, None, 11, opts, policy, value)
    rows = [tr.update() for _ in range(n)]
    return [asdict(r) for r in rows], [p.detach().clone() for p in tr.policy.parameters()]


@pytest.mark.parametrize("opts", [
    RLOptions(traces=2),
    RLOptions(traces=2, prioritized=True),
    RLOptions(traces=2, critic=False, replay=False, exploration=False),
])
def test_same_seed_same_training_curve(opts):
    (c1, w1), (c2, w2) = _curve(opts), _curve(opts)
    assert c1 == c2
    assert all(bool((a == b).all()) for a, b in zip(w1, w2, strict=True))
    assert all(np.isfinite(r["policy_loss"]) for r in c1)


def test_rl_from_sl_init_end_to_end_and_resume(tmp_path):
    sl = tmp_path / "sl.pt"
    run_sl(TINY, SLRun("drf", traces=2, val_traces=1, epochs=2, seed=0, max_slots=50), out=sl)
    out = tmp_path / "rl.pt"
    opts = RLOptions(traces=3, val_traces=1, val_every=2, checkpoint_every=2)
    _, res = train_rl(TINY, sl, 4, 0, out, opts, logdir=tmp_path / "tb")
    assert res.updates == 4 and len(res.history) == 4
    assert [v.update for v in res.validation] == [0, 2, 4]
    ckpt = load_checkpoint(out, expect=ENC, catalogue=TINY.catalogue.names)
    assert ckpt.extra["kind"] == "rl" and ckpt.extra["updates"] == 4
    assert (tmp_path / "rl.best.pt").is_file() and list((tmp_path / "tb").iterdir())
    doc = json.loads(out.with_suffix(".json").read_text())
    assert doc["seed"] == 0 and doc["config"]["policy"]["window"] == 6 and len(doc["history"]) == 4
    assert doc["train_seeds"] == seeds.training(3)
    # the `dl2:` scheduler runs the checkpoint (a 4-update paper policy may idle, leaving jobs unfinished)
    m = summarize_run(run_episode(build_simulator(TINY), make_scheduler(f"dl2:{out}", TINY), 5))
    assert m["jobs"] == TINY.workload.num_jobs and m["completed"] >= 1
    # resuming continues the update count and the history
    _, more = train_rl(TINY, sl, 6, 0, out, opts, resume=True)
    assert more.updates == 6 and [r.update for r in more.history] == list(range(1, 7))
    assert more.history[:4] == res.history
    # a finished run read back leaves its TensorBoard curve as it was (no second, empty event file)
    events = sorted((tmp_path / "tb").iterdir())
    _, same = train_rl(TINY, sl, 4, 0, out, opts, logdir=tmp_path / "tb", resume=True)
    assert same.updates == 6 and sorted((tmp_path / "tb").iterdir()) == events


def _tiny_yaml(tmp_path):
    import yaml

    raw = TINY.model_dump(mode="json")
    raw.pop("base_dir")
    raw["jobtypes"] = str(TINY.resolve(TINY.jobtypes))
    raw["speed"]["surfaces"] = str(TINY.surfaces_dir)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


def test_cli_train_rl_ablation_flags_from_scratch(capsys, tmp_path):
    out = tmp_path / "m" / "rl.pt"
    code, stdout, _ = run_cli(capsys, "train", "rl", "--config", str(_tiny_yaml(tmp_path)), "--updates", "2",
                           "--out", str(out), "--seed", "3", "--no-critic", "--no-exploration", "--no-replay",
                           "--traces", "2", "--val-traces", "1", "--json")
    assert code == 0, stdout
    doc = json.loads(stdout)
    assert doc["updates"] == 2 and doc["init"] is None and out.is_file()
    opts = json.loads(out.with_suffix(".json").read_text())["options"]
    assert (opts["critic"], opts["exploration"], opts["replay"]) == (False, False, False)


def test_cli_train_rl_user_errors(capsys, tmp_path):
    code, _, err = run_cli(capsys, "train", "rl", "--updates", "1", "--out", str(tmp_path / "x.bin"))
    assert code != 0 and ".pt" in err
    code, _, err = run_cli(capsys, "train", "rl", "--updates", "1", "--out", str(tmp_path / "x.pt"),
                        "--init", str(tmp_path / "missing.pt"))
    assert code != 0 and "missing.pt" in err


@pytest.mark.parametrize("config, algo, missing", [("testbed-clairvoyant.yaml", "paper", "surfaces.json"),
                                                   ("testbed.yaml", "counterfactual", "profile missing")])
def test_cli_train_rl_without_speed_surfaces_or_profile_exits_2(capsys, tmp_path, config, algo, missing):
    """A config whose speed.surfaces directory has no surfaces.json, or whose operator profile is missing
    (a learner in the operator's twin needs it): one line, exit 2, no traceback."""
    from support import CONFIGS

    text = (CONFIGS / config).read_text(encoding="utf-8")
    cfg = tmp_path / "t.yaml"
    cfg.write_text(text.replace("jobtypes: jobtypes.yaml", f"jobtypes: {CONFIGS / 'jobtypes.yaml'}"),
                   encoding="utf-8")
    code, _, err = run_cli(capsys, "train", "rl", "--config", str(cfg), "--updates", "1", "--algo", algo,
                           "--out", str(tmp_path / "x.pt"))
    assert code == 2 and missing in err and "Traceback" not in err
