"""The dl2ray CLI end to end: JSON outputs, files written, and clean user errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support import CONFIGS, REPO, run_cli


def test_simulate_json(capsys):
    code, out, _ = run_cli(capsys, "simulate", "--scheduler", "drf", "--seed", "1", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["scheduler"] == "drf" and doc["completed"] == doc["jobs"] == 30


def test_compare_json_is_one_object_with_ratios(capsys, tmp_path):
    code, out, _ = run_cli(
        capsys, "compare", "--schedulers", "fifo,drf,srtf", "--traces", "2", "--json",
        "--processes", "1", "--out", str(tmp_path / "o"),
    )
    assert code == 0
    doc = json.loads(out)  # the whole of stdout is one JSON object
    names = [r["scheduler"] for r in doc["results"]]
    assert names == ["fifo", "drf", "srtf"]
    for row in doc["results"]:
        for key in ("avg_jct", "avg_jct_ci95", "makespan", "gpu_util", "jobs", "completed"):
            assert key in row
        assert row["completed"] == row["jobs"] == 30
    drf = next(r for r in doc["results"] if r["scheduler"] == "drf")
    assert drf["avg_jct_vs_drf"] == pytest.approx(1.0)
    assert (tmp_path / "o" / "results.json").exists()
    assert (tmp_path / "o" / "jct.parquet").exists()
    assert (tmp_path / "o" / "jct_cdf.png").stat().st_size > 1000


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["simulate", "--config", "nope.yaml"], "cannot read config"),
        (["simulate", "--scheduler", "nosuch"], "unknown scheduler 'nosuch'"),
        (["compare", "--schedulers", " , "], "--schedulers"),
        (["fit-speed", "missing.txt", "--out", "x"], "missing.txt: no such file"),
        (["simulate", "--trace", "missing.parquet"], "missing.parquet"),
    ],
)
def test_user_errors_exit_2_with_a_message(capsys, argv, message):
    code, _, err = run_cli(capsys, *argv)
    assert code == 2
    assert message in err
    assert "Traceback" not in err


def test_bad_config_field_is_named_without_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"jobtypes: {CONFIGS / 'jobtypes.yaml'}\nsim: {{slot_seconds: -3}}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "dl2ray", "simulate", "--config", str(bad)],
        capture_output=True, text=True, cwd=REPO, check=False,
    )
    assert proc.returncode == 2
    assert "sim.slot_seconds" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_fit_speed_writes_surfaces_and_optimus_fit(capsys, tmp_path, measurements_file):
    code, out, _ = run_cli(capsys, "fit-speed", str(measurements_file), "--out", str(tmp_path),
                           "--json")
    assert code == 0
    doc = json.loads(out)
    assert len(doc["models"]) == 8
    assert (tmp_path / "surfaces.json").exists() and (tmp_path / "optimus_fit.json").exists()


def test_fit_speed_rejects_a_malformed_line(capsys, tmp_path):
    bad = tmp_path / "m.txt"
    bad.write_text("('resnet-50', 'dist_sync', 32, 1, 1, [1.0], [1.0], [1.0])\nnot a tuple\n")
    code, _, err = run_cli(capsys, "fit-speed", str(bad), "--out", str(tmp_path))
    assert code == 2 and "m.txt:2" in err


def test_bench_commands_print_json(capsys):
    code, out, _ = run_cli(capsys, "bench", "round", "--scheduler", "drf", "--jobs", "30",
                           "--nodes", "10", "--repeats", "1", "--json")
    assert code == 0 and json.loads(out)["tasks_placed"] > 0
    code, out, _ = run_cli(capsys, "bench", "sim", "--config", str(CONFIGS / "testbed.yaml"),
                           "--repeats", "1", "--json")
    assert code == 0 and json.loads(out)["jobs"] == 30


def test_demo_compares_the_shipped_policy_on_test_traces(capsys, tmp_path):
    model = REPO / "models" / "dl2-testbed.pt"
    code, _, _ = run_cli(capsys, "demo", "--traces", "1", "--out", str(tmp_path / "d"), "--model", str(model))
    assert code == 0
    doc = json.loads((tmp_path / "d" / "results.json").read_text())
    assert doc["seeds"] == [3_000_000]  # the first test seed
    names = [r["scheduler"] for r in doc["results"]]
    assert names == ["fifo", "srtf", "drf", "tetris", "optimus", f"dl2:{model}"]
    assert all(r["completed"] == r["jobs"] for r in doc["results"])


def test_demo_without_the_model_is_a_user_error(capsys, tmp_path):
    code, _, err = run_cli(capsys, "demo", "--out", str(tmp_path / "d"), "--model", str(tmp_path / "no.pt"))
    assert code == 2 and "--model" in err
