"""Supervised warm-start on a tiny config: reproduces its teacher; same seed, same curve."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from support import small_config

from dl2ray import seeds
from dl2ray.learn.sl import SLRun, record, run_sl, smoothed_cross_entropy, train
from dl2ray.policy.encoding import Encoding
from dl2ray.policy.network import build_networks, load_checkpoint

TINY = small_config(
    cluster={"nodes": [{"count": 4, "cpu": 8, "gpu": 2, "mem": 48}]},
    workload={"num_jobs": 8, "arrivals": {"pattern": "poisson", "rate": 1.0, "max_per_slot": 3}},
    policy={"window": 8, "hidden": [64, 64], "sl_batch_size": 64},
)


@pytest.mark.slow
def test_sl_reproduces_drf(tmp_path):
    out = tmp_path / "sl.pt"
    run = SLRun("drf", traces=10, val_traces=2, epochs=25, seed=0, max_slots=200)
    _, _, res = run_sl(TINY, run, out=out, logdir=tmp_path / "tb")
    assert res.val_accuracy >= 0.9
    assert res.jct["ratio"] == pytest.approx(1.0, abs=0.1)
    load_checkpoint(out, expect=Encoding.from_config(TINY), catalogue=TINY.catalogue.names)
    doc = json.loads(out.with_suffix(".json").read_text())
    assert doc["seed"] == 0 and doc["teacher"] == "drf" and doc["config"]["policy"]["window"] == 8
    assert doc["train_seeds"] == seeds.training(10) and doc["val_seeds"] == seeds.validation(2)
    assert list((tmp_path / "tb").iterdir())  # TensorBoard events


def test_same_seed_same_loss_curve():
    data = record(TINY, "drf", seeds.training(2), 30)
    val = record(TINY, "drf", seeds.validation(1), 30)
    assert len(data) > 50
    curves = []
    for _ in range(2):
        pol, _ = build_networks(Encoding.from_config(TINY), TINY.policy.hidden, 7)
        curves.append([(h.loss, h.val_loss) for h in train(pol, data, val, 0.005, 3, 32, seed=7)])
    assert curves[0] == curves[1]


def test_smoothed_cross_entropy_by_hand():
    # two allowed actions of three; logits (0, ln 3) → π = (1/4, 3/4) over the allowed ones
    logits = torch.tensor([[0.0, math.log(3.0), float("-inf")]])
    masks = torch.tensor([[True, True, False]])
    actions = torch.tensor([1])
    assert float(smoothed_cross_entropy(logits, masks, actions, 0.0)) == pytest.approx(-math.log(0.75))
    want = -(0.8 * math.log(0.75) + 0.2 * 0.5 * (math.log(0.25) + math.log(0.75)))
    assert float(smoothed_cross_entropy(logits, masks, actions, 0.2)) == pytest.approx(want, rel=1e-6)


def test_recorded_returns_are_the_teachers_discounted_returns():
    data = record(TINY, "drf", seeds.training(1), 30)
    assert data.returns.shape == data.actions.shape
    assert (data.returns > 0).all()  # every slot of a run trains something until the end
    # steps of one slot share its return; the discounted return falls towards the end of a trace
    assert data.returns[0] > data.returns[-1]


def test_value_network_is_fitted_to_the_returns():
    data = record(TINY, "drf", seeds.training(2), 30)
    pol, val_net = build_networks(Encoding.from_config(TINY), TINY.policy.hidden, 3)
    target = torch.from_numpy(data.returns)
    states = torch.from_numpy(data.states)
    with torch.no_grad():
        before = float(((val_net(states) - target) ** 2).mean())
    train(pol, data, data, 0.005, 5, 32, seed=3, value=val_net)
    with torch.no_grad():
        after = float(((val_net(states) - target) ** 2).mean())
    assert after < 0.25 * before


def test_sl_records_fixed_trace_files(tmp_path, capsys):
    from support import run_cli

    from dl2ray.traces.generate import generate_trace
    from dl2ray.traces.parquet import write_trace

    files = []
    for i, seed in enumerate((11, 12, 13)):
        files.append(tmp_path / f"t{i}.parquet")
        write_trace(files[-1], generate_trace(TINY, seed), source="test", slot_seconds=1200.0)
    by_file = record(TINY, "drf", seeds.training(2), 30,
                     traces=[generate_trace(TINY, 11), generate_trace(TINY, 12)])
    by_seed = record(TINY, "drf", [11, 12], 30)
    assert len(by_file) == len(by_seed) and (by_file.actions == by_seed.actions).all()
    run = SLRun("drf", traces=2, val_traces=1, epochs=1, seed=0, max_slots=30,
                train_files=(str(files[0]), str(files[1])), val_files=(str(files[2]),))
    _, _, res = run_sl(TINY, run)
    assert res.train_seeds == seeds.training(2) and res.val_seeds == seeds.validation(1)
    assert res.samples == len(by_file)
    code, _, err = run_cli(capsys, "train", "sl", "--out", str(tmp_path / "x.pt"),
                           "--train-trace", str(tmp_path / "missing.parquet"))
    assert code == 2 and "--train-trace" in err and "no such trace file" in err


def test_dagger_labels_the_students_own_slots_with_the_teacher():
    """Each recorded slot is a view the *student* reached (its greedy decisions drive the run), labelled with
    the teacher's decision in that view."""
    from dl2ray.learn.shape import sl as shape_sl
    from dl2ray.policy.shape import ShapeEncoding, job_features
    from dl2ray.policy.shape_decode import decide_shapes
    from dl2ray.policy.shape_net import NumpyShapePolicy, build_shape_policy
    from dl2ray.schedulers.base import make_scheduler
    from dl2ray.world import build_simulator

    cfg = TINY.model_copy(update={"policy": TINY.policy.model_copy(update={"arch": "shape"})})
    enc = ShapeEncoding.from_config(cfg)
    net = build_shape_policy(enc, (16,), 8, seed=5)
    got = shape_sl.record_on_student(cfg, "drf", net, [7], max_slots=20)
    sim, drf, student = build_simulator(cfg), make_scheduler("drf", cfg), NumpyShapePolicy(net)
    view, want = sim.reset(7), []
    while not sim.done and sim.slot < 20:
        label = drf.decide(view)
        if view.jobs:
            want.append(shape_sl.teacher_sample(view, enc, label))
            x, g = job_features(view, enc)
            view = sim.step(decide_shapes(view, enc, student.logits(x, g)).allocation).view
        else:
            view = sim.step(label).view
    assert len(got) == len(want) > 0
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a.x, b.x)
        np.testing.assert_array_equal(a.actions, b.actions)
    teacher_run = shape_sl.record(cfg, "drf", [7], max_slots=20)
    assert any(not np.array_equal(a.x, b.x) for a, b in zip(got, teacher_run, strict=False))


def _tiny_yaml(tmp_path):
    """TINY as a config file the CLI can read (its relative paths made absolute)."""
    import yaml

    cfg = tmp_path / "tiny.yaml"
    raw = TINY.model_dump(mode="json")
    raw.pop("base_dir")
    raw["jobtypes"] = str(TINY.resolve(TINY.jobtypes))
    raw["profile"] = str(TINY.profile_path)
    raw["speed"]["surfaces"] = str(TINY.surfaces_dir)
    cfg.write_text(yaml.safe_dump(raw))
    return cfg


def test_cli_dagger_runs_for_shape_and_is_refused_for_paper(capsys, tmp_path):
    from support import run_cli

    out = tmp_path / "d.pt"
    cfg = _tiny_yaml(tmp_path)
    code, _, err = run_cli(capsys, "train", "sl", "--config", str(cfg), "--out", str(out), "--teacher", "drf",
                           "--traces", "2", "--val-traces", "1", "--epochs", "2", "--arch", "shape",
                           "--dagger", "1")
    assert code == 0, err
    import json

    rec = json.loads(out.with_suffix(".json").read_text())
    assert rec["run"]["dagger"] == 1 and len(rec["history"]) == 3  # 2 epochs, then 1 after the DAgger round
    code, _, err = run_cli(capsys, "train", "sl", "--config", str(cfg), "--out", str(out), "--teacher", "drf",
                           "--arch", "paper", "--dagger", "1")
    assert code == 2 and "--dagger" in err


def test_cli_init_continues_a_student_and_dagger_skips_the_first_fit(capsys, tmp_path):
    """``--init`` starts from a checkpoint (its weights, not a fresh network); with ``--dagger`` only the
    rounds train; ``--lr`` reaches Adam; a paper run, a missing file or a non-positive rate is refused."""
    from support import run_cli

    from dl2ray.policy.shape import ShapeEncoding
    from dl2ray.policy.shape_net import load_shape_checkpoint

    cfg = _tiny_yaml(tmp_path)
    common = ("train", "sl", "--config", str(cfg), "--teacher", "drf", "--traces", "2", "--val-traces", "1",
              "--arch", "shape")
    first, second = tmp_path / "first.pt", tmp_path / "second.pt"
    code, _, err = run_cli(capsys, *common, "--out", str(first), "--epochs", "2")
    assert code == 0, err
    code, _, err = run_cli(capsys, *common, "--out", str(second), "--epochs", "4", "--init", str(first),
                           "--dagger", "1", "--lr", "0.0001")
    assert code == 0, err
    rec = json.loads(second.with_suffix(".json").read_text())
    assert rec["run"]["init"] == str(first) and rec["run"]["lr"] == 0.0001
    assert len(rec["history"]) == 2  # no first fit: the DAgger round's 4 // 2 epochs only
    enc = ShapeEncoding.from_config(TINY.model_copy(update={"policy": TINY.policy.model_copy(
        update={"arch": "shape"})}))
    a = load_shape_checkpoint(first, enc).policy.state_dict()
    b = load_shape_checkpoint(second, enc).policy.state_dict()
    fresh = tmp_path / "fresh.pt"  # the same round from a fresh network lands elsewhere
    assert run_cli(capsys, *common, "--out", str(fresh), "--epochs", "4", "--dagger", "1")[0] == 0
    c = load_shape_checkpoint(fresh, enc).policy.state_dict()
    moved = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert 0 < moved < max(float((a[k] - c[k]).abs().max()) for k in a)
    paper = tmp_path / "paper.pt"
    assert run_cli(capsys, *common[:-2], "--arch", "paper", "--epochs", "1", "--out", str(paper))[0] == 0
    for extra, name in ((("--init", str(tmp_path / "none.pt")), "--init"),
                        (("--init", str(paper)), "not a shape policy"),
                        (("--init", str(first), "--arch", "paper"), "--init"),
                        (("--lr", "0"), "--lr")):
        code, _, err = run_cli(capsys, *common, "--out", str(tmp_path / "bad.pt"), *extra)
        assert code == 2 and name in err, err


def test_a_student_continued_from_a_checkpoint_keeps_its_placer_and_is_judged_under_it(capsys, tmp_path):
    """``--init`` of a checkpoint with ``meta.placer`` (chosen on validation when it was shipped): the
    student it becomes decides under that placer as ``dl2:PATH``, and its SL validation is measured under it
    (the JCT ``dl2ray compare`` gives the saved file); without one, nothing is added."""
    import yaml
    from support import run_cli

    from dl2ray.config import load_config
    from dl2ray.evaluation.metrics import censored_avg_jct
    from dl2ray.learn.supervised import simulators
    from dl2ray.policy.network import read_checkpoint_doc, set_checkpoint_placer
    from dl2ray.schedulers.base import make_scheduler
    from dl2ray.seeds import validation
    from dl2ray.sim import run_episode

    cfg_path = _tiny_yaml(tmp_path)  # each scheduler under its own placer, as the shipped configs are
    raw = yaml.safe_load(cfg_path.read_text())
    raw["cluster"]["placement"] = "own"
    cfg_path.write_text(yaml.safe_dump(raw))
    common = ("train", "sl", "--config", str(cfg_path), "--teacher", "drf", "--traces", "2", "--val-traces",
              "1", "--arch", "shape", "--epochs", "2")
    first, plain, packed = tmp_path / "first.pt", tmp_path / "plain.pt", tmp_path / "packed.pt"
    assert run_cli(capsys, *common, "--out", str(first))[0] == 0
    assert run_cli(capsys, *common, "--out", str(plain), "--init", str(first))[0] == 0
    assert "placer" not in read_checkpoint_doc(plain).get("meta", {})
    set_checkpoint_placer(first, "packing")
    assert run_cli(capsys, *common, "--out", str(packed), "--init", str(first))[0] == 0
    assert read_checkpoint_doc(packed)["meta"]["placer"] == "packing"
    cfg = load_config(cfg_path)
    rec = json.loads(packed.with_suffix(".json").read_text())
    want = [censored_avg_jct(run_episode(sim, make_scheduler(f"dl2:{packed}", cfg), seed))
            for sim, seed in simulators(cfg, validation(1), None)]
    assert rec["jct"]["policy_avg_jct"] == pytest.approx(float(np.mean(want)))
    spread = [censored_avg_jct(run_episode(sim, make_scheduler(f"dl2:{packed}", cfg, "load_balancing"), seed))
              for sim, seed in simulators(cfg, validation(1), None)]
    assert spread != want  # the placer matters here, so the record could not match by chance


def test_on_a_shared_cluster_the_student_learns_what_the_queue_layer_asks_it(tmp_path):
    """With ``tenancy:`` the policy decides inside the queue layer, on one queue's jobs at a time
    (:class:`dl2ray.schedulers.queued.Queued`): the recording labels exactly the views the layer gives the
    teacher — several per slot — and validation judges the student inside the same layer, as
    ``make_scheduler`` builds it."""
    from support import CONFIGS

    from dl2ray.config import load_config
    from dl2ray.learn.shape import sl as shape_sl
    from dl2ray.learn.validation import validate
    from dl2ray.policy.shape import ShapeEncoding
    from dl2ray.policy.shape_net import build_shape_policy, save_shape_checkpoint
    from dl2ray.schedulers.base import make_scheduler
    from dl2ray.schedulers.queued import Queued
    from dl2ray.sim import run_episode
    from dl2ray.world import build_simulator

    cfg = load_config(CONFIGS / "testbed-shared.yaml")
    enc = ShapeEncoding.from_config(cfg)
    got = shape_sl.record(cfg, "planner", [3], max_slots=15)

    queued = make_scheduler("planner", cfg)
    assert isinstance(queued, Queued)
    inner, want = queued.inner, []

    class Spy:
        def decide(self, view):
            label = inner.decide(view)
            if view.jobs:
                want.append(shape_sl.teacher_sample(view, enc, label, getattr(inner, "placement", None)))
            return label

    queued.inner = Spy()
    sim = build_simulator(cfg, world=cfg.policy.train_world)  # where SL records (the config's training world)
    view, busy = sim.reset(3), 0
    queued.reset(3)
    while not sim.done and sim.slot < 15:
        busy += bool(view.jobs)
        view = sim.step(queued.decide(view)).view
    assert len(got) == len(want) > busy > 0  # several views per slot: each queue's ask, then its share
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a.x, b.x)
        np.testing.assert_array_equal(a.actions, b.actions)

    net = build_shape_policy(enc, (16,), 8, seed=2)
    assert shape_sl.record_on_student(cfg, "planner", net, [3], max_slots=15)
    path = tmp_path / "s.pt"
    save_shape_checkpoint(path, net, cfg.catalogue.names)
    from dl2ray.evaluation.metrics import censored_avg_jct

    built = make_scheduler(f"dl2:{path}", cfg)
    assert isinstance(built, Queued)
    assert validate(cfg, net, [5]) == censored_avg_jct(run_episode(build_simulator(cfg), built, 5))
