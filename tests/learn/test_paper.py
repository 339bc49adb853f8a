"""``dl2ray experiment paper --quick`` end to end on a tiny config: students, online runs, report; resume;
bad input."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import yaml
from support import run_cli, tiny_shape_config

from dl2ray.studies.paper import (
    PaperResult,
    PaperSettings,
    federation_quality,
    plans,
    thresholds,
    time_to_quality,
)

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


def test_a_teacher_with_updates_of_its_own_takes_them_and_only_it(tmp_path):
    s = PaperSettings(updates=60, seeds=(0, 1), teachers=("drf", "fifo"), teacher_updates=(("fifo", 120),))
    students = {t: str(tmp_path / f"sl-{t}.pt") for t in s.teachers}
    runs = {p.name: p for p in plans(TINY, s, students, tmp_path)}
    assert {n for n, p in runs.items() if p.updates == 120} == {"fifo@0", "fifo@1", "fifo-zero@0"}
    assert all(p.updates == 60 for n, p in runs.items() if not n.startswith("fifo"))


def test_a_teacher_with_a_config_of_its_own_learns_with_it_and_only_it(tmp_path):
    s = PaperSettings(seeds=(0, 1), teachers=("drf", "srtf"))
    students = {t: str(tmp_path / f"sl-{t}.pt") for t in s.teachers}
    shape = TINY.policy.shape.model_copy(update={"entropy_weight": 0.1})
    explore = TINY.model_copy(update={"policy": TINY.policy.model_copy(update={"shape": shape})})
    runs = {p.name: p for p in plans(TINY, s, students, tmp_path, {"srtf": explore})}
    assert {n for n, p in runs.items() if p.cfg is explore} == {"srtf@0", "srtf@1", "srtf-zero@0"}
    assert all(p.cfg is TINY for n, p in runs.items() if not n.startswith("srtf"))


def test_a_teacher_config_of_another_cluster_is_refused_naming_the_field():
    from dl2ray.errors import UserError
    from dl2ray.studies.paper import check_teacher_config

    longer_sim = TINY.sim.model_copy(update={"max_slots": TINY.sim.max_slots + 1})
    bigger = TINY.model_copy(update={"sim": longer_sim})
    with pytest.raises(UserError, match=r"--teacher-config x: sim: differs"):
        check_teacher_config(TINY, bigger, "--teacher-config x")
    check_teacher_config(TINY, TINY.model_copy(update={"name": "other"}), "--teacher-config x")
    shape = TINY.policy.shape.model_copy(update={"credit_discount": 0.9})  # the paper's job credit has none
    discounted = TINY.model_copy(update={"policy": TINY.policy.model_copy(update={"shape": shape})})
    with pytest.raises(UserError, match=r"--teacher-config x: policy.shape.credit_discount: 0.9"):
        check_teacher_config(TINY, discounted, "--teacher-config x")


@pytest.mark.slow
def test_quick_paper_writes_the_report_and_a_second_call_reads_the_runs_back(capsys, tmp_path, tiny_yaml):
    out = tmp_path / "paper"
    code, stdout, err = run_cli(capsys, "experiment", "paper", "--quick", "--config", tiny_yaml, "--out",
                                str(out), "--teacher-config", f"fifo={tiny_yaml}", "--json")
    assert code == 0, err
    doc = json.loads(stdout)
    assert doc["settings"]["teacher_configs"] == [["fifo", tiny_yaml]]
    assert [row["teacher"] for row in doc["fig16"]] == ["drf", "fifo"]
    for row in doc["fig16"]:
        assert row["rl"]["n"] == 1 and row["teacher_jct"] > 0 and row["student_jct"] > 0
    assert {r["variant"] for r in doc["table2"]} == {"full", "no-actor-critic", "no-exploration",
                                                     "zero-advantage", "no-replay"}
    assert {"rl-only", "drf@0", "sl-drf", "drf", "optimus", "planner"} <= set(doc["fig10"]["summary"])
    assert doc["fig10"]["wall"] and all(sec >= 0 for sec, _, _ in doc["fig10"]["wall"])
    # Fig. 18: 1 and 2 A3C agents (Ray), each with its validations against wall-clock; a member alone and
    # a federation of 2, each member validated after its one push (own pushes, own slots, seconds, JCT)
    assert set(doc["fig18"]["validations"]) == {"1@0", "2@0"}
    assert {row["agents"] for row in doc["fig18"]["rows"]} == {1, 2}
    assert (out / "a3c1@0.best.pt").is_file() and (out / "a3c2@0.best.pt").is_file()
    # the two agents keep pg's value baseline in the master by default; one agent has none to share
    assert [json.loads((out / f"a3c{n}@0.json").read_text())["options"]["share_baseline"]
            for n in (1, 2)] == [False, True]
    assert doc["settings"]["share_baseline"] is True
    fed = doc["fig18"]["federation_validations"]
    # (the run ends on the learner's update count: a member that starts sooner may push, and validate, more)
    assert set(fed) == {"1@0", "2@0"} and all(len(m) >= 1 for m in fed["2@0"])
    assert all(m[0][0] == 1 and m[0][1] > 0 and m[0][3] > 0 for m in fed["2@0"])
    assert {row["members"] for row in doc["fig18"]["federation"]} == {1, 2}
    # Fig. 15: a student of 4 of the 8 types, then one update per phase with 4, 6, 8 types, each phase from
    # the one before it, every point validated on every type
    fig15 = doc["fig15"]
    assert fig15["types_per_phase"] == [4, 6, 8] and fig15["updates_per_phase"] == 1
    assert [(u, n) for u, n, _ in fig15["rows"]] == [(0, 4), (1, 4), (2, 6), (3, 8)]
    assert [row["update"] for row in fig15["summary"]] == [0, 1, 2, 3]
    assert all(row["ideal"] > 0 and row["unseen"] > 0 for row in fig15["summary"])
    assert (out / "sl-drf-4types.pt").is_file() and (out / "unseen-8types@0.best.pt").is_file()
    phase = json.loads((out / "unseen-6types@0.json").read_text())
    assert phase["init"].endswith("unseen-4types@0.pt")
    text = (out / "paper.md").read_text()
    for word in ("Fig. 10", "Fig. 15", "Fig. 16", "Table 2", "Fig. 18", "41.3", "21.1",
                 "dl2ray experiment paper", "--quick", "--teacher-config", "The FIFO student's runs",
                 "`--share-baseline`, the default"):
        assert word in text
    assert all((out / f).is_file() for f in ("fig10.png", "fig10-wall.png", "fig15.png", "fig16.png",
                                             "sl-fifo.pt"))
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
    (["--federation", "1"], "--federation 1: 0 (none) or at least 2"),
    (["--teacher-config", "fifo"], "--teacher-config 'fifo': TEACHER=CONFIG"),
    (["--teacher-config", "srtf=configs/testbed-online.yaml"], "'srtf' is not a teacher of this run"),
    (["--teacher-config", "fifo=configs/no-such.yaml"], "no-such.yaml"),
    (["--teacher-updates", "fifo"], "--teacher-updates 'fifo': TEACHER=N"),
    (["--teacher-updates", "fifo=many"], "--teacher-updates 'fifo=many': TEACHER=N"),
    (["--teacher-updates", "srtf=120"], "'srtf' is not a teacher of this run"),
    (["--teacher-updates", "fifo=0"], "--teacher-updates 'fifo=0': need at least 1 update"),
    (["--teacher-updates", "fifo=2", "--teacher-updates", "fifo=3"], "fifo given twice"),
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


def test_a_federation_member_s_time_to_quality_is_its_own_slots_at_its_first_validation_there():
    curve = [(0, "sl-drf", 20.0), (0, "optimus", 12.0), (0, "planner", 10.0), (0, "drf", 15.0)]
    federation = {  # per member: (own pushes, own slots, seconds, validation JCT)
        (1, 0): [[(2, 100, 60.0, 19.0), (4, 200, 120.0, 17.0), (6, 300, 180.0, 11.5)]],
        (2, 0): [[(2, 90, 60.0, 17.5), (4, 190, 120.0, 11.8)],  # Optimus's level at 190 slots
                 [(2, 110, 60.0, 16.0), (4, 210, 120.0, 13.0)]],  # at 0.90x the student, never Optimus's
        (1, 1): [[(2, 100, 60.0, 19.5)]],  # never anywhere
        (2, 1): [[(2, 50, 30.0, 17.0)], [(2, 70, 30.0, 19.0)]],
    }
    r = _result(curve, {})
    r.federation = federation
    rows = {(row["threshold"], row["members"]): row for row in federation_quality(r)}
    alone, two = rows[("0.90× student", 1)], rows[("0.90× student", 2)]
    assert alone["reached"] == 1 and alone["slots_per_member"]["values"] == [200.0]
    assert two["reached"] == 2 and two["slots_per_member"]["values"] == [100.0, 50.0]  # mean of members there
    assert two["vs_alone"]["values"] == [0.5]  # seed 1: nothing alone to compare with
    optimus = rows[("Optimus", 2)]
    assert optimus["slots_per_member"]["values"] == [190.0] and optimus["minutes"]["values"] == [2.0]
    assert optimus["vs_alone"]["values"] == [pytest.approx(190 / 300)]
    assert rows[("1.10× planner", 2)]["reached"] == 0 and rows[("1.10× planner", 2)]["vs_alone"] is None
    assert time_to_quality(r) == []  # no A3C runs: no A3C rows


def test_unseen_types_arrive_in_phases_each_from_the_last_weights_of_the_one_before(tmp_path):
    """Fig. 15's plan: half the catalogue first, then more, all of it last (the paper's 4, 6, 8 of 8);
    each phase trains on traces of its types, starts from the phase before it and validates on every type."""
    from dl2ray.learn.records import RLOptions
    from dl2ray.studies.unseen import phase_plans, type_counts, types_config

    assert type_counts(8) == (4, 6, 8) and type_counts(8, 1) == (8,) and type_counts(3) == (2, 3)
    assert type_counts(12, 4) == (6, 8, 10, 12)
    with pytest.raises(ValueError, match="at least 1"):
        type_counts(8, 0)
    four = types_config(TINY, 4)
    assert four.workload.types == TINY.catalogue.names[:4]
    from dl2ray.traces.generate import generate_trace

    assert {j.job_type for j in generate_trace(four, 3)} <= set(TINY.catalogue.names[:4])
    with pytest.raises(ValueError, match="has 8"):
        types_config(TINY, 9)
    student = tmp_path / "sl.pt"
    plan = phase_plans(TINY, student, RLOptions(), 5, 0, tmp_path, (4, 6, 8))
    assert [p.cfg.workload.types for p in plan] == [TINY.catalogue.names[:n] for n in (4, 6, 8)]
    assert [p.init for p in plan] == [student, plan[0].out, plan[1].out]
    assert all(p.val_cfg is TINY and p.updates == 5 and p.resume for p in plan)


def test_the_unseen_curve_joins_the_phases_and_sets_each_arrival_beside_the_ideal_line():
    from dl2ray.learn.records import ValidationRow
    from dl2ray.studies.learning import RunRecord
    from dl2ray.studies.unseen import curve, summary

    def rec(points):
        return RunRecord("r", None, None, "m", "m", [ValidationRow(u, j) for u, j in points], 1.0)

    pts = curve([rec([(0, 10.0), (2, 9.0)]), rec([(0, 9.0), (2, 12.0)]), rec([(0, 12.0), (2, 8.0)])],
                (4, 6, 8), 2)
    assert pts == [(0, 4, 10.0), (2, 4, 9.0), (4, 6, 12.0), (6, 8, 8.0)]
    rows = summary(pts, [(0, 11.0), (3, 8.0), (6, 7.5)], 8.0, (4, 6, 8), 2)
    assert [(r["update"], r["unseen"], r["ideal"]) for r in rows] == [
        (0, 10.0, 11.0), (2, 9.0, 11.0), (4, 12.0, 8.0), (6, 8.0, 7.5)]
    assert rows[-1]["what"] == "end" and rows[-1]["unseen_vs_planner"] == 1.0
    assert rows[1]["what"] == "now 6 types"


def test_a_finished_a3c_run_is_read_back_and_one_stopped_short_is_resumed(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    from dl2ray.studies.scaling import a3c_runs

    calls: list[tuple[int, int, bool]] = []

    shared: list[bool] = []

    def multi(cfg, init, updates, seed, path, opts, agents, logdir, resume, progress):
        calls.append((agents, updates, resume))
        shared.append(opts.share_baseline)
        with SummaryWriter(str(logdir)) as w:
            w.add_scalar("rl/val_avg_jct", 9.0 + agents, updates)
        path.with_suffix(".json").write_text(json.dumps({"updates": updates}))

    def runs():
        return a3c_runs(TINY, tmp_path / "sl.pt", PaperSettings(updates=3).options(), 3, (0,), (1, 2),
                        tmp_path, multi)

    first = runs()
    assert calls == [(1, 3, True), (2, 6, True)]
    assert shared == [False, False]
    assert [(u, j) for u, _, j in first[(2, 0)]] == [(6, 11.0)]
    assert runs() == first and len(calls) == 2  # both done: nothing started again
    (tmp_path / "a3c2@0.json").write_text(json.dumps({"updates": 4}))  # stopped at 4 of 6
    runs()
    assert calls[2:] == [(2, 6, True)]


def test_a3c_runs_share_the_baseline_only_among_two_or_more_agents(tmp_path):
    """``options.share_baseline``: the runs of N ≥ 2 agents keep it; the one-agent run has no master
    baseline to share and learns as the single learner does."""
    from torch.utils.tensorboard import SummaryWriter

    from dl2ray.studies.scaling import a3c_runs

    shared: dict[int, bool] = {}

    def multi(cfg, init, updates, seed, path, opts, agents, logdir, resume, progress):
        shared[agents] = opts.share_baseline
        with SummaryWriter(str(logdir)) as w:
            w.add_scalar("rl/val_avg_jct", 9.0, updates)
        path.with_suffix(".json").write_text(json.dumps({"updates": updates}))

    options = replace(PaperSettings(updates=1).options(), share_baseline=True)
    a3c_runs(TINY, tmp_path / "sl.pt", options, 1, (0,), (1, 2, 4), tmp_path, multi)
    assert shared == {1: False, 2: True, 4: True}
    assert PaperSettings().share_baseline is True  # Fig. 18's default, as `train rl --agents N`'s
