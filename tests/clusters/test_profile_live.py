"""The live profile (``dl2ray profile --live``): real elastic MXNet jobs hot-scaled through the points.

The arithmetic (rate, unit, averaging, bounds) is checked by hand; one real
job is profiled through the CLI at two points; the exit paths (normal, error,
Ctrl-C, SIGTERM, a killed profiler) must leave no process of the job behind.
No test asserts a speed's value: only that it was measured, where and by whom.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from support import CONFIGS, REPO, run_cli, terminal_signals

from clusters.profile_live import (
    LiveJob,
    PointResult,
    Window,
    average_by_type,
    group_pids,
    iteration_rate,
    load_specs,
    plan_points,
    profile_from,
    type_speed,
)
from dl2ray.config import load_config
from dl2ray.errors import UserError
from dl2ray.jobspec import load_jobspec
from dl2ray.knowledge.profile import ProfileError, load_profile

TINY = REPO / "tests" / "data" / "jobs" / "mlp-tiny.yaml"
TESTBED = CONFIGS / "testbed.yaml"


@pytest.fixture(scope="module")
def catalogue():
    return load_config(TESTBED).catalogue


def _result(job: str, job_type: str, ps: int, workers: int, bps: float) -> PointResult:
    return PointResult(job, job_type, ps, workers, 10, 1.0, 10.0, 160.0, 0.8, bps, 150.0, members=())


# -- by hand --------------------------------------------------------------------------------------------


def test_the_rate_is_the_least_squares_slope_through_the_version_changes():
    # 4 iterations/s, the middle change seen 0.1 s late: every change weighs, not only the two ends
    seen = np.array([[10.0, 0], [10.6, 2], [11.0, 4]])
    t, v = np.array([0.0, 0.6, 1.0]), np.array([0.0, 2.0, 4.0])
    by_hand = ((t - t.mean()) * (v - v.mean())).sum() / ((t - t.mean()) ** 2).sum()  # 2.0 / 0.50667
    assert iteration_rate(seen) == pytest.approx(by_hand) == pytest.approx(3.947, abs=1e-3)
    assert iteration_rate(np.array([[0.0, 5], [0.5, 7], [1.0, 9], [1.5, 11]])) == pytest.approx(4.0)


def test_the_type_speed_gives_the_jobs_seconds_per_epoch(catalogue):
    spec = load_jobspec(TINY)  # 128 samples per epoch, global batch 16
    jt = catalogue.get(spec.job_type)
    speed = type_speed(jt, spec, 4.0)  # 4 iterations/s = 64 samples/s = 2 s per epoch
    assert speed == pytest.approx(jt.batches_per_epoch * 4.0 * 16 / 128)
    assert jt.batches_per_epoch / speed == pytest.approx(2.0)


def test_jobs_of_one_type_average_their_common_points(catalogue):
    results = [_result("a", "vgg-16", 1, 1, 10.0), _result("b", "vgg-16", 1, 1, 20.0),
               _result("b", "vgg-16", 1, 2, 30.0), _result("c", "dssm", 1, 1, 5.0)]
    averaged = average_by_type(catalogue, results)
    got = {t: {(m.ps, m.workers): m.speed for m in ms} for t, ms in averaged.items()}
    assert got == {"vgg-16": {(1, 1): 15.0, (1, 2): 30.0}, "dssm": {(1, 1): 5.0}}


def test_a_profile_of_some_types_lacks_the_others_and_records_its_source(tmp_path, catalogue):
    specs = plan_points(load_specs([TINY], catalogue), ((1, 1), (1, 2)), explicit=True)
    results = [_result("mlp-tiny", "resnext-110", 1, 1, 100.0),
               _result("mlp-tiny", "resnext-110", 1, 2, 180.0)]
    prof = profile_from(catalogue, specs, Window(iterations=8), results, "optimus", {"config": "testbed"})
    assert set(prof.types) == {"resnext-110"}
    assert prof.source["live"] is True and prof.source["window"]["iterations"] == 8
    [spec] = prof.source["specs"]
    assert spec["name"] == "mlp-tiny" and spec["points"] == [[1, 1], [1, 2]]
    with pytest.raises(ProfileError, match="resnet-50"):
        prof.covers(catalogue)


def test_points_are_clipped_to_each_spec_and_ordered_by_workers(catalogue):
    small = load_jobspec(REPO / "examples" / "jobs" / "mlp-small.yaml")  # ps 1-2, workers 1-4
    tiny = load_jobspec(TINY)  # ps 1, workers 1-2
    specs = [(Path("s.yaml"), small, catalogue.get(small.job_type)),
             (Path("t.yaml"), tiny, catalogue.get(tiny.job_type))]
    planned = plan_points(specs, ((2, 2), (1, 1), (1, 4), (2, 1), (1, 2)), explicit=True)
    assert planned[0].points == ((1, 1), (2, 1), (1, 2), (2, 2), (1, 4))
    assert planned[1].points == ((1, 1), (1, 2))
    with pytest.raises(UserError, match=r"--points: 8x8 lies outside every job's bounds"):
        plan_points(specs, ((1, 1), (8, 8)), explicit=True)
    assert plan_points(specs, ((1, 1), (8, 8)), explicit=False)[1].points == ((1, 1),)
    with pytest.raises(UserError, match=r"t.yaml: ps_count/workers: .* exclude every point"):
        plan_points(specs, ((2, 2), (2, 4)), explicit=False)


# -- bad input: exit 2, one line, nothing started -------------------------------------------------------


def _bad_specs(tmp_path: Path) -> dict[str, Path]:
    text = TINY.read_text()
    malformed = tmp_path / "malformed.yaml"
    malformed.write_text(text.replace("global_batch: 16", "global_batch: 0"))
    untyped = tmp_path / "untyped.yaml"
    untyped.write_text(text.replace("job_type: resnext-110", "job_type: alexnet"))
    bounds = tmp_path / "bounds.yaml"
    bounds.write_text(text.replace("workers: {min: 1, max: 2}", "workers: {min: 3, max: 2}"))
    return {"malformed": malformed, "untyped": untyped, "bounds": bounds}


@pytest.mark.parametrize("case, extra, needle", [
    ("missing", [], "nope.yaml: cannot read job spec"),
    ("malformed", [], "malformed.yaml: global_batch"),
    ("bounds", [], "bounds.yaml: workers"),
    ("untyped", [], "untyped.yaml: job_type: unknown job type 'alexnet'"),
    ("tiny", ["--points", "1x1,2x2"], "--points: 2x2 lies outside every job's bounds"),
    ("tiny", ["--window-iterations", "5", "--window-seconds", "2"], "--window-iterations/--window-seconds"),
    ("tiny", ["--window-iterations", "1"], "--window-iterations: 1 must be >= 2"),
    ("tiny", ["--noise", "0.1"], "--noise/--runs/--seed"),
    ("tiny", ["--fit", "spline"], "--fit: 'spline'"),
])
def test_bad_live_input_exits_2_naming_the_field_before_starting_anything(tmp_path, capsys, case, extra,
                                                                          needle):
    paths = {**_bad_specs(tmp_path), "missing": tmp_path / "nope.yaml", "tiny": TINY}
    out = tmp_path / "p.json"
    code, _, err = run_cli(capsys, "profile", "--live", str(paths[case]), "--config", str(TESTBED),
                           "--out", str(out), *extra)
    assert code == 2 and needle in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "launcher pid" not in err and not out.exists()


def test_window_options_need_live(tmp_path, capsys):
    code, _, err = run_cli(capsys, "profile", "--config", str(TESTBED), "--out", str(tmp_path / "p.json"),
                           "--window-seconds", "3")
    assert code == 2 and "only with --live" in err


# -- a real job ----------------------------------------------------------------------------------------


def _pgids(err: str) -> list[int]:
    return [int(g) for g in re.findall(r"process group (\d+)", err)]


@pytest.mark.slow
def test_a_live_profile_of_a_real_job_at_two_points(tmp_path, capsys):
    out = tmp_path / "live.json"
    code, stdout, err = run_cli(capsys, "profile", "--live", str(TINY), "--config", str(TESTBED),
                                "--points", "1x1,1x2", "--window-iterations", "8", "--warmup-iterations", "2",
                                "--out", str(out), "--json")
    assert code == 0, err
    report = json.loads(stdout)
    assert report["measured_types"] == ["resnext-110"] and "resnet-50" in report["missing_types"]

    prof = load_profile(out)
    tp = prof.types["resnext-110"]
    assert [(p, w) for p, w, _ in tp.points] == [(1, 1), (1, 2)]
    assert all(v > 0 for _, _, v in tp.points) and (tp.speed > 0).all()
    assert prof.source["live"] is True and prof.source["machine"]["cpus"] == os.cpu_count()
    with pytest.raises(ProfileError, match="resnet-50"):
        prof.covers(load_config(TESTBED).catalogue)

    for m in prof.source["measurements"]:
        roles = [x["role"] for x in m["members"]]
        # measured at its size: the plan's members at the window's end, every worker past the window's start
        assert (roles.count("ps"), roles.count("worker")) == (m["ps"], m["workers"])
        assert all(x["version"] > m["start_version"] for x in m["members"] if x["role"] == "worker")
        assert m["iterations"] >= 8 and m["samples_per_s"] > 0
    two = next(m for m in prof.source["measurements"] if m["workers"] == 2)
    one = next(m for m in prof.source["measurements"] if m["workers"] == 1)
    assert len({x["pid"] for x in two["members"] if x["role"] == "worker"}) == 2
    assert {x["id"] for x in one["members"] if x["role"] == "worker"} < {x["id"] for x in two["members"]}

    # nothing left: neither the job's process group nor any member seen
    [pgid] = _pgids(err)
    assert group_pids(pgid) == []
    pids = {x["pid"] for m in prof.source["measurements"] for x in m["members"]}
    assert not [p for p in pids if Path(f"/proc/{p}").exists() and "Z" not in _state(p)]


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def _wait_members(pgid: int, n: int = 3, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while len(group_pids(pgid)) < n:
        assert time.monotonic() < deadline, "the job's launcher never spawned its members"
        time.sleep(0.05)


def _wait_gone(pgid: int, timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (left := group_pids(pgid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@pytest.mark.slow
def test_an_error_inside_the_job_kills_its_process_group(tmp_path):
    spec = load_jobspec(TINY)
    with pytest.raises(RuntimeError, match="boom"), LiveJob(spec, (1, 1), tmp_path) as job:
        pgid = job.pgid
        _wait_members(pgid)  # launcher, PS, worker
        raise RuntimeError("boom")
    assert group_pids(pgid) == []


def _start_profile(tmp_path: Path, until: str = "process group") -> tuple[subprocess.Popen, int]:
    """``dl2ray profile --live`` in a subprocess, returned once its job's launcher spawned its members
    (and, with ``until``, once a progress line containing it was printed)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "dl2ray", "profile", "--live", str(TINY), "--config", str(TESTBED),
         "--points", "1x1,1x2", "--out", str(tmp_path / "p.json")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO,
        env={**os.environ, "TMPDIR": str(tmp_path)},  # the job's working directory goes there
        preexec_fn=terminal_signals)
    assert proc.stderr is not None
    pgid = None
    for line in proc.stderr:
        pgid = pgid or next(iter(_pgids(line)), None)
        if pgid is not None and until in line:
            _wait_members(pgid)
            return proc, pgid
    raise AssertionError(f"dl2ray profile --live exited with {proc.wait()} before starting its job")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_or_sigterm_leaves_no_process(tmp_path, sig):
    proc, pgid = _start_profile(tmp_path)
    try:
        proc.send_signal(sig)
        assert proc.wait(timeout=60) != 0
        assert group_pids(pgid) == []
        assert not (tmp_path / "p.json").exists() and not list(tmp_path.glob("dl2ray-live-*"))
    finally:
        proc.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)


@pytest.mark.slow
def test_a_killed_profiler_takes_its_job_down(tmp_path):
    """SIGKILL runs no cleanup: the launcher's parent-death signal ends it, and it ends its members.

    (Killed while members are still starting, a member the launcher had not recorded yet exits on its
    own registration timeout instead; the test kills a training job.)"""
    proc, pgid = _start_profile(tmp_path, until="training at")
    try:
        proc.kill()
        proc.wait()
        assert _wait_gone(pgid, timeout_s=90) == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
