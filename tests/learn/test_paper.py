"""``dl2ray experiment paper --quick`` end to end on a tiny config: students, online runs, report; resume;
bad input."""

from __future__ import annotations

import json

import pytest
import yaml
from support import run_cli, tiny_shape_config

from dl2ray.studies.paper import PaperSettings, plans

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
    text = (out / "paper.md").read_text()
    for word in ("Fig. 10", "Fig. 16", "Table 2", "41.3", "21.1", "dl2ray experiment paper", "--quick"):
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
])
def test_bad_paper_options_exit_2(capsys, tmp_path, argv, message):
    code, _, err = run_cli(capsys, "experiment", "paper", "--quick", *argv, "--out", str(tmp_path / "p"))
    assert code == 2 and message in err and "Traceback" not in err
