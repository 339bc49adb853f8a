"""``dl2ray experiment paper --quick`` end to end on a tiny config: students, online runs, report; resume;
bad input."""

from __future__ import annotations

import json

import pytest
import yaml
from support import run_cli, tiny_shape_config

from dl2ray.studies.paper import PaperResult, PaperSettings, plans, thresholds, time_to_quality

TINY = tiny_shape_config()


@pytest.fixture(scope="module")
def tiny_yaml(tmp_path_factory):
    raw = TINY.model_dump(mode="json")
    raw.pop("base_dir")
    raw["jobtypes"] = str(TINY.resolve(TINY.jobtypes))
    raw["speed"]["surfaces"] = str(TINY.surfaces_dir)
    raw["profile"] = str(TINY.resolve(TINY.profile))  # the planner's and Optimus's profile
    path = tmp_path_factory.mktemp("cfg") / "tiny.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return str(path)


def test_the_runs_are_every_figure_s_and_each_control(tmp_path):
    s = PaperSettings(seeds=(0, 1), teachers=("drf", "srtf"))
    students = {t: str(tmp_path / f"sl-{t}.pt") for t in s.teachers}
    runs = {p.name: p for p in plans(TINY, s, students, tmp_path)}
    assert set(runs) == {"rl-only", "drf@0", "drf@1", "srtf@0", "srtf@1", "drf-zero@0", "srtf-zero@0",
                         "no-actor-critic@0", "no-exploration@0"}
    assert runs["rl-only"].init is None and str(runs["srtf@1"].init).endswith("sl-srtf.pt")
    assert runs["drf-zero@0"].opts.zero_advantage and not runs["drf@0"].opts.zero_advantage
    assert not runs["no-actor-critic@0"].opts.critic and not runs["no-exploration@0"].opts.exploration
    assert {p.opts.algo for p in runs.values()} == {"pg"} and all(p.resume for p in runs.values())


@pytest.mark.slow
def test_quick_paper_writes_the_report_and_a_second_call_reads_the_runs_back(capsys, tmp_path, tiny_yaml):
    out = tmp_path / "paper"
    code, stdout, err = run_cli(capsys, "experiment", "paper", "--quick", "--config", tiny_yaml, "--out",
                                str(out), "--json")
    assert code == 0, err
    doc = json.loads(stdout)
    assert [row["teacher"] for row in doc["fig16"]] == ["drf", "fifo"]
    for row in doc["fig16"]:
        assert row["rl"]["n"] == 1 and row["teacher_jct"] > 0 and row["student_jct"] > 0
    assert {r["variant"] for r in doc["table2"]} == {"full", "no-actor-critic", "no-exploration",
                                                     "zero-advantage", "no-replay"}
    assert {"rl-only", "drf@0", "sl-drf", "drf", "optimus", "planner"} <= set(doc["fig10"]["summary"])
    assert doc["fig10"]["wall"] and all(sec >= 0 for sec, _, _ in doc["fig10"]["wall"])
    # Fig. 18: the single learner and 2 A3C agents (Ray), each with its validations against wall-clock
    assert set(doc["fig18"]["validations"]) == {"1@0", "2@0"}
    assert {row["agents"] for row in doc["fig18"]["rows"]} == {1, 2}
    assert (out / "a3c2@0.best.pt").is_file()
    text = (out / "paper.md").read_text()
    for word in ("Fig. 10", "Fig. 16", "Table 2", "Fig. 18", "41.3", "21.1", "dl2ray experiment paper",
                 "--quick"):
        assert word in text
    assert all((out / f).is_file() for f in ("fig10.png", "fig10-wall.png", "fig16.png", "sl-fifo.pt"))
    first = (out / "drf@0.best.pt").stat().st_mtime_ns
    code, stdout, err = run_cli(capsys, "experiment", "paper", "--quick", "--config", tiny_yaml, "--out",
                                str(out), "--json")
    assert code == 0, err
    assert (out / "drf@0.best.pt").stat().st_mtime_ns == first  # finished runs are read back, not redone
    assert json.loads(stdout)["fig16"] == doc["fig16"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--updates", "0"], "--updates: must be at least 1"),
    (["--seeds", "0"], "--seeds: must be at least 1"),
    (["--workers", "0"], "--workers: must be at least 1"),
    (["--agents", "1"], "--agents: '1': each count at least 2"),
    (["--agents", "two"], "--agents: 'two': comma-separated"),
])
def test_bad_paper_options_exit_2(capsys, tmp_path, argv, message):
    code, _, err = run_cli(capsys, "experiment", "paper", "--quick", *argv, "--out", str(tmp_path / "p"))
    assert code == 2 and message in err and "Traceback" not in err


def _result(curve, learners) -> PaperResult:
    s = PaperSettings(seeds=(0, 1), teachers=("drf",), agents=(2,))
    return PaperResult("c", s, {}, [], curve, [], [1], [2], {}, 0.0, {}, learners)


def test_time_to_quality_is_the_first_validation_at_or_below_each_level():
    curve = [(0, "sl-drf", 20.0), (0, "optimus", 12.0), (0, "planner", 10.0), (0, "drf", 15.0)]
    learners = {  # (update, seconds, validation JCT)
        (1, 0): [(0, 0.0, 20.0), (5, 600.0, 17.0), (10, 1200.0, 11.0)],
        (1, 1): [(0, 0.0, 20.0), (5, 600.0, 19.0), (10, 1200.0, 17.9)],  # never at Optimus's level
        (2, 0): [(0, 0.0, 20.0), (10, 300.0, 12.0), (20, 600.0, 10.5)],
        (2, 1): [(0, 0.0, 20.0), (10, 300.0, 17.5)],
    }
    r = _result(curve, learners)
    assert thresholds(r) == pytest.approx({"0.90× student": 18.0, "Optimus": 12.0, "1.10× planner": 11.0})
    rows = {(row["threshold"], row["agents"]): row for row in time_to_quality(r)}
    student1, student2 = rows[("0.90× student", 1)], rows[("0.90× student", 2)]
    assert student1["reached"] == 2 and student1["minutes"]["values"] == [10.0, 20.0]
    assert student2["minutes"]["values"] == [5.0, 5.0]
    assert student2["updates_per_agent"]["values"] == [5.0, 5.0]  # global update 10 over 2 agents
    assert student2["vs_one"]["values"] == [0.5, 0.25]
    optimus1, optimus2 = rows[("Optimus", 1)], rows[("Optimus", 2)]
    assert optimus1["reached"] == 1 and optimus2["reached"] == 1
    assert optimus2["vs_one"]["values"] == [0.25]  # seed 0 only: seed 1's single learner never got there
    planner2 = rows[("1.10× planner", 2)]
    assert planner2["reached"] == 1 and planner2["vs_one"]["values"] == [0.5]
    assert rows[("1.10× planner", 1)]["updates_per_agent"]["values"] == [10.0]
