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


@pytest.mark.slow
def test_compare_json_is_one_object_with_ratios(capsys, tmp_path):
    code, out, _ = run_cli(
        capsys, "compare", "--schedulers", "fifo,drf,srtf", "--traces", "2", "--json",
        "--processes", "1", "--out", str(tmp_path / "o"),
    )
    assert code == 0
    doc = json.loads(out)  # the whole of stdout is one JSON object
    names = [r["scheduler"] for r in doc["results"]]
    assert names == ["fifo", "drf", "srtf", "optimus-truth", "lower-bound"]  # references by default
    assert [r["reference"] for r in doc["results"]] == [False, False, False, True, True]
    for row in doc["results"]:
        for key in ("avg_jct", "avg_jct_ci95", "makespan", "gpu_util", "jobs", "completed",
                    "unfinished", "censored_avg_jct"):
            assert key in row
        assert row["completed"] == row["jobs"] == 30 and row["unfinished"] == 0
        assert row["censored_avg_jct"] == pytest.approx(row["avg_jct"])
    bound = doc["results"][-1]
    assert bound["gpu_util"] is None  # a bound has no utilisation: null, not NaN
    assert all(bound["avg_jct"] <= r["avg_jct"] for r in doc["results"])
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


@pytest.mark.parametrize("extra", [(), ("--reference",), ("--scheduler", "drf"), ("--gc-freeze", "--sample")])
def test_bench_decide_on_a_generated_view_under_the_deployed_placer(capsys, extra):
    model = REPO / "models" / "dl2-testbed.pt"
    code, out, _ = run_cli(capsys, "bench", "decide", "--config", str(CONFIGS / "testbed.yaml"), "--policy",
                           str(model), "--jobs", "12", "--nodes", "30", "--repeats", "2", *extra, "--json")
    doc = json.loads(out)
    assert code == 0 and (doc["jobs"], doc["nodes"], doc["view"]) == (12, 30, "generated")
    assert doc["path"] == ("heuristic" if "drf" in extra else "reference" if extra[:1] == ("--reference",)
                           else "fused")
    assert doc["placement"] == ("load_balancing" if "drf" in extra else "optimus")  # each one's own placer
    assert doc["gc_frozen"] == ("--gc-freeze" in extra) and doc["tasks_p50"] > 0


@pytest.mark.slow
def test_demo_compares_the_shipped_policy_on_test_traces(capsys, tmp_path):
    model = REPO / "models" / "dl2-testbed.pt"
    code, _, _ = run_cli(capsys, "demo", "--traces", "1", "--out", str(tmp_path / "d"), "--model", str(model))
    assert code == 0
    doc = json.loads((tmp_path / "d" / "results.json").read_text())
    assert doc["seeds"] == [4_000_000]  # the first test seed
    names = [r["scheduler"] for r in doc["results"]]
    assert names == ["fifo", "srtf", "drf", "tetris", "optimus", "planner", f"dl2:{model}", "optimus-truth",
                     "lower-bound"]
    dl2 = next(r for r in doc["results"] if r["scheduler"] == f"dl2:{model}")
    assert set(dl2["paired"]) == {"drf", "planner"}
    assert all(r["completed"] == r["jobs"] for r in doc["results"])


def test_demo_without_the_model_is_a_user_error(capsys, tmp_path):
    code, _, err = run_cli(capsys, "demo", "--out", str(tmp_path / "d"), "--model", str(tmp_path / "no.pt"))
    assert code == 2 and "--model" in err


def _strict_json(text: str) -> dict:
    def no_constants(name):
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=no_constants)


def test_compare_paired_ratios_and_markdown(capsys):
    args = ("compare", "--config", str(CONFIGS / "testbed.yaml"), "--schedulers", "drf,planner",
            "--traces", "2",
            "--seed", "5", "--processes", "1", "--no-references")
    code, out, _ = run_cli(capsys, *args, "--paired", "drf,planner", "--json")
    rows = {r["scheduler"]: r for r in json.loads(out)["results"]}
    assert code == 0 and rows["drf"]["paired"]["drf"]["mean"] == pytest.approx(1.0)
    per = rows["planner"]["paired"]["drf"]["per_trace"]
    assert len(per) == 2 and rows["planner"]["paired"]["drf"]["mean"] == pytest.approx(sum(per) / 2)
    code, out, _ = run_cli(capsys, *args, "--paired", "planner", "--markdown")
    assert code == 0 and out.splitlines()[0].startswith("| scheduler |") and "/ planner (paired)" in out
    assert "| planner | " in out and "1.000 ± 0.000" in out
    code, _, err = run_cli(capsys, *args, "--paired", "optimus")
    assert code == 2 and "--paired" in err and "optimus" in err


def test_compare_without_references_and_with_a_requested_size(capsys):
    code, out, _ = run_cli(capsys, "compare", "--schedulers", "fifo,drf", "--traces", "1",
                           "--json", "--processes", "1", "--no-references", "--requested-bundles", "3")
    assert code == 0
    doc = _strict_json(out)
    assert [r["scheduler"] for r in doc["results"]] == ["fifo", "drf"]
    assert doc["requested_bundles"] == 3


@pytest.fixture
def short_horizon(tmp_path):
    """The testbed with a 4-slot horizon: most jobs cannot finish."""
    path = tmp_path / "short.yaml"
    path.write_text(f"name: short\njobtypes: {CONFIGS / 'jobtypes.yaml'}\n"
                    f"speed: {{surfaces: {CONFIGS / 'speed'}}}\n"
                    "workload: {num_jobs: 6}\nsim: {max_slots: 4}\n")
    return path


def test_unfinished_jobs_warn_count_and_stay_valid_json(capsys, short_horizon):
    code, out, err = run_cli(capsys, "compare", "--config", str(short_horizon), "--schedulers",
                             "fifo-published,drf", "--traces", "2", "--json", "--processes", "1")
    assert code == 0
    doc = _strict_json(out)
    assert doc["max_slots"] == 4
    rows = {r["scheduler"]: r for r in doc["results"]}
    assert rows["drf"]["unfinished"] > 0 and rows["fifo-published"]["unfinished"] > 0
    assert "warning: drf:" in err and "unfinished at sim.max_slots=4" in err
    for row in rows.values():  # censored over all 6 jobs: every one counted, at most 4 slots
        assert 0 < row["censored_avg_jct"] <= 4
    if rows["fifo-published"]["completed"] == 0:
        assert rows["fifo-published"]["avg_jct"] is None
    code, out, err = run_cli(capsys, "compare", "--config", str(short_horizon), "--schedulers",
                             "drf", "--traces", "1", "--processes", "1")
    assert code == 0 and "censored" in out and "warning: drf:" in err


def test_simulate_json_with_nothing_finished_is_valid(capsys, short_horizon):
    code, out, err = run_cli(capsys, "simulate", "--config", str(short_horizon), "--scheduler",
                             "fifo-published", "--json")
    assert code == 0
    doc = _strict_json(out)
    assert doc["unfinished"] > 0 and "warning: fifo-published" in err


@pytest.mark.parametrize(("argv", "message"), [
    (["compare", "--requested-bundles", "0"], "error: --requested-bundles: 0 must be >= 1"),
    (["compare", "--schedulers", "drf,oracle,nosuch"], "error: unknown scheduler 'nosuch'"),
])
def test_bad_compare_options_exit_2_in_one_line(capsys, argv, message):
    code, _, err = run_cli(capsys, *argv)
    assert code == 2 and err.strip() == err.strip().splitlines()[0]
    assert err.startswith(message) and "Traceback" not in err


def test_a_markdown_row_keeps_its_columns_when_a_cell_holds_a_pipe():
    from dl2ray.evaluation.report import markdown_table

    row = {"scheduler": "dl2:m.pt", "placement": "policy(optimus|packing)", "censored_avg_jct": 6.0,
           "censored_avg_jct_ci95": 0.5, "median_jct": 6.0, "p95_jct": 9.0, "queueing_delay": 0.0,
           "gpu_util": 0.2, "completed": 30, "jobs": 30, "paired": {"drf": {"mean": 0.4, "ci95": 0.05}}}
    head, rule, line = markdown_table([row], ["drf"]).splitlines()
    # a Markdown renderer splits a row on every pipe that is not escaped
    cells = [c for c in line.replace("\\|", "").split("|")][1:-1]
    assert len(cells) == head.count("|") - 1 == rule.count("|") - 1
    assert "policy(optimus\\|packing)" in line


def _blas_threads_seen(monkeypatch) -> dict:
    """What :func:`dl2ray.cli.app.run` hands its command: numpy's BLAS threads and the environment's."""
    import os

    from threadpoolctl import threadpool_info

    import dl2ray.cli.app as app

    seen: dict = {}

    def command() -> None:
        seen["blas"] = {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}
        seen["env"] = os.environ.get("OPENBLAS_NUM_THREADS")

    monkeypatch.setattr(app, "main", command)
    app.run()
    return seen


def test_the_dl2ray_command_runs_numpy_blas_on_one_thread(monkeypatch) -> None:
    """In its own process and, through the environment, in every process it starts."""
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "0")  # restored (unset) after the test
    monkeypatch.delenv("OPENBLAS_NUM_THREADS")
    seen = _blas_threads_seen(monkeypatch)
    assert seen["blas"] == {1} and seen["env"] == "1"


def test_the_dl2ray_command_keeps_blas_threads_the_user_set(monkeypatch) -> None:
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    seen = _blas_threads_seen(monkeypatch)
    assert seen["blas"] == {2} and seen["env"] == "2"


def test_a_malformed_blas_thread_count_is_one_line_and_exit_2() -> None:
    import os

    env = {**os.environ, "OPENBLAS_NUM_THREADS": "two"}
    proc = subprocess.run([sys.executable, "-m", "dl2ray", "--help"], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: OPENBLAS_NUM_THREADS='two': a number of threads >= 1"
