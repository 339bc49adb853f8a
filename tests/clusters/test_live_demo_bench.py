"""``bench live-demo`` is a fair comparison: every scheduler and every repetition gets the same seeded
submission times, and the summary's means and spreads are the runs' by hand. No Ray here (the live
runs are recorded by a stand-in); the one tiny live run is in test_live_auth.py (slow). ``bench live``'s
summary of the pushed readings, by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import run_cli

from clusters.cli.live_bench import arrival_schedule, jct_summary, readings_summary

ROOT = Path(__file__).resolve().parents[2]


def test_the_arrival_schedule_is_seeded_starts_at_zero_and_grows() -> None:
    a = arrival_schedule(6, 10.0, seed=3)
    assert a == arrival_schedule(6, 10.0, seed=3)  # same seed, same offsets
    assert a != arrival_schedule(6, 10.0, seed=4)
    assert a[0] == 0.0 and len(a) == 6 and all(np.diff(a) >= 0)
    gaps = np.diff(arrival_schedule(2000, 10.0, seed=1))
    assert 9.0 < gaps.mean() < 11.0  # exponential gaps with the asked mean
    assert arrival_schedule(3, 0.0, seed=0) == [0.0, 0.0, 0.0]
    assert arrival_schedule(1, 10.0, seed=0) == [0.0]


def _record(scheduler: str, jcts: dict[str, float], offsets: dict[str, float], lag: float = 0.5,
            events: int = 1) -> dict[str, Any]:
    jobs = [{"job": n, "state": "finished", "jct_s": v, "submitted_s": offsets[n] + lag,
             "offset_s": offsets[n], "scaling_events": events} for n, v in jcts.items()]
    return {"scheduler": scheduler, "jobs": jobs, "finished": len(jobs),
            "avg_jct_s": round(float(np.mean(list(jcts.values()))), 2)}


def test_the_summary_is_each_schedulers_mean_and_spread_over_its_runs() -> None:
    off = {"a": 0.0, "b": 5.0}
    runs = [_record("drf", {"a": 10.0, "b": 20.0}, off), _record("dl2", {"a": 8.0, "b": 12.0}, off),
            _record("drf", {"a": 14.0, "b": 24.0}, off, lag=1.5, events=2)]
    s = jct_summary(runs)
    assert list(s) == ["drf", "dl2"]
    drf = s["drf"]
    assert drf["runs"] == 2 and drf["finished"] == "4/4"
    assert drf["avg_jct_s"]["per_run"] == [15.0, 19.0]
    assert drf["avg_jct_s"]["mean"] == 17.0 and drf["avg_jct_s"]["std"] == 2.83  # sqrt((4 + 4) / 1)
    assert drf["job_jct_s"]["a"] == {"n": 2, "mean": 12.0, "std": 2.83, "min": 10.0, "max": 14.0}
    assert drf["scaling_events_per_run"]["mean"] == 3.0  # 2 jobs x 1 event, then 2 x 2
    assert drf["submit_lag_s"]["max"] == 1.5 and drf["submit_lag_s"]["min"] == 0.5
    assert s["dl2"]["avg_jct_s"]["std"] == 0.0 and s["dl2"]["runs"] == 1


def test_an_unfinished_job_is_left_out_of_the_jcts_and_counted() -> None:
    rec = _record("drf", {"a": 10.0, "b": 20.0}, {"a": 0.0, "b": 5.0})
    rec["jobs"][1]["state"], rec["finished"], rec["avg_jct_s"] = "failed", 1, 10.0
    s = jct_summary([rec])["drf"]
    assert s["finished"] == "1/2" and s["all_jct_s"]["n"] == 1 and s["job_jct_s"]["b"]["n"] == 0


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    d = tmp_path / "jobs"
    d.mkdir()
    for name in ("j-one", "j-two", "j-three"):
        text = (ROOT / "examples" / "jobs" / "mlp-small.yaml").read_text()
        (d / f"{name}.yaml").write_text(text.replace("name: mlp-small", f"name: {name}"))
    return d


def test_every_scheduler_and_repetition_gets_the_same_submission_times(monkeypatch, capsys, tmp_path,
                                                                        job_dir) -> None:
    from clusters.cli import demo

    calls: list[dict[str, Any]] = []

    def recorded_run(scheduler, out, jobs, slot_seconds, offsets_s, use_job_submit=True, **_):
        out.mkdir(parents=True, exist_ok=True)  # what a live run leaves: its folder
        calls.append({"scheduler": scheduler, "jobs": [j.name for j in jobs], "offsets": list(offsets_s),
                      "via_ray_job_submit": use_job_submit})
        names = [j.stem for j in jobs]
        offsets = dict(zip(names, offsets_s, strict=True))
        rec = _record(scheduler, {n: 10.0 + len(calls) for n in names}, offsets)
        rec.update(timeline=[], agent={"guardrail_fallbacks": {}})
        return rec

    monkeypatch.setattr(demo, "run_live", recorded_run)
    monkeypatch.setattr(demo, "plot_timeline", lambda rec, path: None)
    code, out, err = run_cli(capsys, "bench", "live-demo", "--schedulers", "drf,fifo", "--repeats", "3",
                             "--jobs", str(job_dir), "--seed", "7", "--out", str(tmp_path / "out"), "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert [c["scheduler"] for c in calls] == ["drf", "fifo"] * 3  # interleaved repetitions
    assert all(c["offsets"] == calls[0]["offsets"] == doc["schedule"]["offsets_s"] for c in calls)
    assert calls[0]["offsets"] == arrival_schedule(3, 10.0, 7)
    assert all(c["jobs"] == ["j-one.yaml", "j-three.yaml", "j-two.yaml"] for c in calls)
    assert not any(c["via_ray_job_submit"] for c in calls)  # straight to the agent, at the offsets
    assert doc["summary"]["drf"]["runs"] == 3 and doc["summary"]["fifo"]["runs"] == 3
    assert doc["summary"]["drf"]["avg_jct_s"]["per_run"] == [11.0, 13.0, 15.0]
    assert json.loads((tmp_path / "out" / "bench.json").read_text())["summary"] == doc["summary"]


def test_bench_live_demo_refuses_bad_input_before_starting_anything(capsys, tmp_path, job_dir) -> None:
    code, _, err = run_cli(capsys, "bench", "live-demo", "--jobs", str(tmp_path / "none"))
    assert code == 2 and "--jobs" in err
    code, _, err = run_cli(capsys, "bench", "live-demo", "--jobs", str(job_dir), "--schedulers", "nope")
    assert code == 2 and "nope" in err
    code, _, err = run_cli(capsys, "bench", "live-demo", "--jobs", str(job_dir), "--repeats", "0")
    assert code == 2 and "repeats" in err.lower()


def test_bench_live_counts_the_readings_in_time_and_their_age() -> None:
    slots = [{"readings_pushed": 3.0, "readings_late": 1.0, "readings_asked": 0.0, "readings_resync": 1.0,
              "reading_age_ms": 200.0},
             {"readings_pushed": 4.0, "readings_late": 0.0, "readings_asked": 0.0, "readings_resync": 0.0,
              "reading_age_ms": 250.0},
             {"readings_pushed": 0.0, "readings_late": 0.0, "readings_asked": 4.0, "readings_resync": 0.0}]
    r = readings_summary(slots)
    assert (r["pushed"], r["late"], r["asked"], r["resync"]) == (7, 1, 4, 1)
    assert r["in_time"] == 0.875  # 7 of the 8 readings of known jobs; asked ones are not pushed readings
    assert r["age"] == {"median_ms": 225.0, "p99_ms": 249.5}  # the two slots with arrived readings
    assert readings_summary([{"view_ms": 1.0}])["in_time"] is None  # the batched read: no pushed readings
