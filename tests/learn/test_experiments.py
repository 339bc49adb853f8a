"""The paper's learning experiments on a tiny config: training curve, ablation, OfflineRL, bad input."""

from __future__ import annotations

import csv
import json
from dataclasses import replace

import numpy as np
import pytest
import yaml
from support import run_cli, small_config

from dl2ray import seeds
from dl2ray.errors import UserError
from dl2ray.learn.records import RLOptions
from dl2ray.learn.sl import SLRun, run_sl
from dl2ray.learn.validation import heuristic_jct, validate
from dl2ray.policy.encoding import Encoding
from dl2ray.policy.network import load_checkpoint
from dl2ray.studies import learning as ex

TINY = small_config(
    cluster={"nodes": [{"count": 3, "cpu": 8, "gpu": 2, "mem": 48}]},
    workload={"num_jobs": 5, "arrivals": {"pattern": "poisson", "rate": 1.0, "max_per_slot": 2}},
    policy={"window": 6, "hidden": [32], "minibatch": 32, "replay_size": 256,
            "sl_traces": 2, "sl_val_traces": 1, "sl_epochs": 2, "sl_max_slots": 50,
            "improve": {"envs": 2, "slots_per_update": 2, "alternatives": 2, "horizon": 3}},
    sim={"max_slots": 150},  # a random-init greedy policy may never run a job
)
OPTS = RLOptions(traces=2, val_traces=1, val_every=1)
VAL = seeds.validation(1)


@pytest.fixture(scope="module")
def sl_ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("sl") / "sl.pt"
    run_sl(TINY, SLRun("drf", traces=2, val_traces=1, epochs=2, seed=0, max_slots=50), out=path)
    return path


@pytest.fixture(scope="module")
def tiny_yaml(tmp_path_factory):
    raw = TINY.model_dump(mode="json")
    raw.pop("base_dir")
    raw["jobtypes"] = str(TINY.resolve(TINY.jobtypes))
    raw["speed"]["surfaces"] = str(TINY.surfaces_dir)
    path = tmp_path_factory.mktemp("cfg") / "tiny.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return str(path)


def _csv(path):
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_training_curve_four_runs_on_the_same_validation_traces(sl_ckpt, tmp_path):
    curve = ex.training_curve(TINY, sl_ckpt, "drf", 2, 0, OPTS, tmp_path, workers=1)
    ex.write_curve_csv(curve, tmp_path / "c.csv")
    rows = _csv(tmp_path / "c.csv")
    per_run = {r: [(int(x["update"]), float(x["avg_jct"])) for x in rows if x["run"] == r]
               for r in {x["run"] for x in rows}}
    assert set(per_run) == {"sl-only", "rl-only", "sl+rl", "teacher"}
    assert all([u for u, _ in pts] == [0, 1, 2] for pts in per_run.values())
    assert curve.val_seeds == VAL
    # the flat lines: SL checkpoint and teacher, once each, on the validation traces
    sl_jct, drf_jct = per_run["sl-only"][0][1], per_run["teacher"][0][1]
    assert {j for _, j in per_run["sl-only"]} == {sl_jct} and {j for _, j in per_run["teacher"]} == {drf_jct}
    assert drf_jct == pytest.approx(heuristic_jct(TINY, "drf", VAL))
    assert per_run["sl+rl"][0][1] == pytest.approx(sl_jct)  # update 0 of SL+RL is the SL policy
    assert [(r.name, r.train_speed, r.val_speed) for r in curve.records] == [
        ("rl-only", "measured", "measured"), ("sl+rl", "measured", "measured")]
    summary = curve.summary()
    assert summary["teacher"]["below_teacher_at"] is None
    assert summary["sl-only"]["first"] == summary["sl-only"]["final"] == pytest.approx(sl_jct)


def test_cli_training_curve_trains_sl_first(capsys, tmp_path, tiny_yaml):
    out = tmp_path / "curve"
    code, stdout, err = run_cli(capsys, "experiment", "training-curve", "--config", tiny_yaml,
                                "--teacher", "drf", "--updates", "2", "--val-every", "1", "--val-traces", "1",
                                "--traces", "2", "--seed", "3", "--workers", "1", "--out", str(out), "--json")
    assert code == 0, err
    doc = json.loads(stdout)
    assert set(doc["runs"]) == {"sl-only", "rl-only", "sl+rl", "teacher"} and doc["teacher"] == "drf"
    assert (out / "sl.pt").is_file() and doc["sl_init"] == str(out / "sl.pt")
    assert {r["run"] for r in _csv(out / "training_curve.csv")} == set(doc["runs"])
    assert (out / "training_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((out / "training_curve.json").read_text()) == doc
    for run in ("rl-only", "sl+rl"):
        assert json.loads((out / f"{run}.json").read_text())["seed"] == 3


def test_cli_ablation_variants_control_and_warm_start(capsys, sl_ckpt, tmp_path, tiny_yaml):
    out = tmp_path / "abl"
    code, stdout, err = run_cli(capsys, "experiment", "ablation", "--config", tiny_yaml,
                                "--init", str(sl_ckpt), "--updates", "1", "--val-traces", "1",
                                "--traces", "2", "--test-traces", "1", "--workers", "1",
                                "--out", str(out), "--json")
    assert code == 0, err
    doc = json.loads(stdout)
    assert doc["test_seeds"] == seeds.test(1) and doc["reference"] == "full"
    rows = _csv(out / "ablation.csv")
    names = ["full", "no-actor-critic", "no-exploration", "no-replay", "zero-advantage"]
    assert [r["run"] for r in rows] == [*names, "warm-start"]
    assert float(rows[0]["slowdown"]) == 1.0
    full_jct = float(rows[0]["test_avg_jct"])
    for r in rows[:-1]:
        opts = json.loads((out / f"{r['run']}.json").read_text())["options"]
        assert (opts["critic"], opts["exploration"], opts["replay"], opts["zero_advantage"]) == (
            r["run"] != "no-actor-critic", r["run"] != "no-exploration", r["run"] != "no-replay",
            r["run"] == "zero-advantage")
        assert float(r["slowdown"]) == pytest.approx(float(r["test_avg_jct"]) / full_jct)
        assert (out / f"{r['run']}.best.pt").is_file() and r["checkpoint"] == str(out / f"{r['run']}.best.pt")
        assert 0 <= float(r["test_completed"]) <= float(r["test_jobs"]) == TINY.workload.num_jobs
    assert rows[-1]["checkpoint"] == str(sl_ckpt)
    variants = {v["variant"]: v for v in doc["variants"]}
    assert set(variants) == {*names, "warm-start"}
    assert variants["warm-start"]["vs_warm_start"] == 1.0


def test_ablation_variant_subset_always_runs_full(sl_ckpt, tmp_path):
    report = ex.ablation(TINY, sl_ckpt, 1, 0, OPTS, 1, tmp_path, workers=1, variants=["zero-advantage"])
    assert [r["run"] for r in report.rows] == ["full", "zero-advantage", "warm-start"]
    with pytest.raises(UserError, match="unknown"):
        ex.ablation(TINY, sl_ckpt, 1, 0, OPTS, 1, tmp_path, workers=1, variants=["no-such"])


def test_ablation_resume_reads_finished_runs_back_and_refuses_another_run(sl_ckpt, tmp_path):
    first = ex.ablation(TINY, sl_ckpt, 2, 0, OPTS, 1, tmp_path, workers=1, variants=["zero-advantage"])
    stamp = {p.name: p.stat().st_mtime_ns for p in tmp_path.glob("*.pt")}
    again = ex.ablation(TINY, sl_ckpt, 2, 0, OPTS, 1, tmp_path, workers=1, variants=["zero-advantage"],
                        resume=True)
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.glob("*.pt")} == stamp  # nothing retrained
    assert [r["test_avg_jct"] for r in again.rows] == [r["test_avg_jct"] for r in first.rows]
    assert [r["best_update"] for r in again.rows] == [r["best_update"] for r in first.rows]
    # one more update continues each run from its checkpoint
    more = ex.ablation(TINY, sl_ckpt, 3, 0, OPTS, 1, tmp_path, workers=1, variants=["zero-advantage"],
                       resume=True)
    assert json.loads((tmp_path / "full.json").read_text())["updates"] == 3
    assert len(more.rows) == 3
    # another seed or other options in the same folder: refused, naming what differs
    with pytest.raises(UserError, match=r"--resume: .*full.pt was trained with options="):
        ex.ablation(TINY, sl_ckpt, 2, 0, replace(OPTS, val_every=2), 1, tmp_path, workers=1,
                    variants=["zero-advantage"], resume=True)


def test_ablation_over_seeds_with_the_improve_algorithm(sl_ckpt, tmp_path):
    opts = replace(OPTS, algo="improve")
    report = ex.ablation(TINY, sl_ckpt, 1, 5, opts, 1, tmp_path, workers=1, seeds=2)
    assert [r["run"] for r in report.rows] == [
        "full@5", "zero-advantage@5", "full@6", "zero-advantage@6", "warm-start"]
    assert [r.get("seed") for r in report.rows[:4]] == [5, 5, 6, 6]
    assert all(r["algo"] == "improve" for r in report.rows[:4])
    per = {v["variant"]: v for v in ex.by_variant(report)}
    full = [r["test_avg_jct"] for r in report.rows if r["run"].startswith("full@")]
    assert per["full"]["runs"] == 2 and per["full"]["mean"] == pytest.approx(np.mean(full))
    assert per["full"]["std"] == pytest.approx(np.std(full, ddof=1))
    assert per["full"]["vs_warm_start"] == pytest.approx(np.mean(full) / report.rows[-1]["test_avg_jct"])


def test_offline_rl_trains_on_analytic_and_validates_on_measured(sl_ckpt, tmp_path):
    analytic = ex.with_speed_model(TINY, "analytic")
    assert (analytic.speed.model, TINY.speed.model) == ("analytic", "measured")
    report = ex.offline_rl(TINY, sl_ckpt, 1, 0, OPTS, 1, tmp_path, workers=1)
    assert [(r["run"], r["train_speed"], r["val_speed"]) for r in report.rows] == [
        ("online-rl", "measured", "measured"), ("offline-rl", "analytic", "measured")]
    online = report.rows[0]
    assert online["slowdown"] == 1.0 and report.test_seeds == seeds.test(1)
    docs = {r: json.loads((tmp_path / f"{r}.json").read_text()) for r in ("online-rl", "offline-rl")}
    assert docs["online-rl"]["config"]["speed"]["model"] == "measured"
    assert docs["offline-rl"]["config"]["speed"]["model"] == "analytic"  # the training simulator
    # ... validated on the measured simulator: update 0 (the SL policy) and DRF's baseline as online's
    sl_policy = load_checkpoint(sl_ckpt, expect=Encoding.from_config(TINY)).policy
    measured = validate(TINY, sl_policy, VAL)
    for doc in docs.values():
        assert doc["validation"][0]["avg_jct"] == pytest.approx(measured)
        assert doc["baseline_avg_jct"] == pytest.approx(heuristic_jct(TINY, "drf", VAL))
    assert validate(analytic, sl_policy, VAL) != pytest.approx(measured)  # the two simulators differ here


def test_offline_rl_refuses_an_analytic_config(sl_ckpt, tmp_path):
    with pytest.raises(UserError, match=r"speed\.model"):
        ex.offline_rl(ex.with_speed_model(TINY, "analytic"), sl_ckpt, 1, 0, OPTS, 1, tmp_path, workers=1)


@pytest.mark.slow
def test_cli_offline_rl_in_a_process_pool(capsys, sl_ckpt, tmp_path, tiny_yaml):
    """Two spawned training workers, then test episodes in compare's forked workers (which hang if
    this process's torch has run a multi-threaded OpenMP region; the command keeps it at one thread)."""
    out = tmp_path / "off"
    code, stdout, err = run_cli(capsys, "experiment", "offline-rl", "--config", tiny_yaml,
                                "--init", str(sl_ckpt), "--updates", "1", "--val-traces", "1",
                                "--traces", "2", "--test-traces", "2", "--workers", "2",
                                "--out", str(out), "--json")
    assert code == 0, err
    doc = json.loads(stdout)
    assert doc["test_seeds"] == seeds.test(2) and doc["reference"] == "online-rl"
    rows = _csv(out / "offline_rl.csv")
    assert [(r["run"], r["train_speed"], r["val_speed"]) for r in rows] == [
        ("online-rl", "measured", "measured"), ("offline-rl", "analytic", "measured")]
    assert float(rows[0]["slowdown"]) == 1.0


@pytest.mark.parametrize(("argv", "option"), [
    (["training-curve", "--sl-init", "{tmp}/missing.pt"], "--sl-init"),
    (["training-curve", "--out", "{tmp}/afile"], "--out"),
    (["training-curve", "--teacher", "nosuch"], "--teacher"),
    (["training-curve", "--updates", "0"], "--updates"),
    (["training-curve", "--workers", "0"], "--workers"),
    (["ablation", "--init", "{tmp}/missing.pt"], "--init"),
    (["ablation", "--init", "{sl}", "--updates", "0"], "--updates"),
    (["ablation", "--init", "{sl}", "--rl-opt", "critic=false"], "--rl-opt"),
    (["offline-rl", "--init", "{sl}", "--rl-opt", "bogus=1"], "--rl-opt"),
    (["offline-rl", "--init", "{sl}", "--rl-opt", "critic_warmup=abc"], "--rl-opt"),
    (["offline-rl", "--init", "{sl}", "--test-traces", "0"], "--test-traces"),
])
def test_cli_bad_input_is_one_line_naming_the_option(capsys, tmp_path, tiny_yaml, sl_ckpt, argv, option):
    (tmp_path / "afile").write_text("x")
    defaults = {"--out": str(tmp_path / "o"), "--updates": "1"}
    argv = [a.format(tmp=tmp_path, sl=sl_ckpt) for a in argv]
    extra = [x for k, v in defaults.items() if k not in argv for x in (k, v)]
    code, stdout, err = run_cli(capsys, "experiment", *argv, *extra, "--config", tiny_yaml)
    assert code == 2 and stdout == ""
    assert len(err.strip().splitlines()) == 1 and option in err, err
    assert not (tmp_path / "o" / "training_curve.csv").exists()


def _children(pid: int) -> list[int]:
    """Live processes whose parent is ``pid`` (from /proc)."""
    from pathlib import Path

    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


@pytest.mark.slow
def test_sigterm_stops_an_experiment_and_its_workers(sl_ckpt, tiny_yaml, tmp_path):
    import signal
    import subprocess
    import sys
    import time

    from support import wait_for

    cmd = [sys.executable, "-m", "dl2ray", "experiment", "ablation", "--config", tiny_yaml, "--init",
           str(sl_ckpt), "--updates", "100000", "--out", str(tmp_path / "abl"), "--workers", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # two training workers (and multiprocessing's resource tracker) once the pool is up
        children = wait_for("the pool's workers", lambda: c if len(c := _children(proc.pid)) >= 3 else None)
        time.sleep(2.0)  # the workers are training now
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) != 0
        wait_for("every child of the experiment to be gone",
                 lambda: not any(_alive(c) for c in children))
    finally:
        if proc.poll() is None:
            proc.kill()


def _alive(pid: int) -> bool:
    from pathlib import Path

    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
