"""Shipping a run: slim checkpoint, run records, model card with test-set results (and how the run was
trained: one process or A3C agents on Ray); bad input exits 2."""

from __future__ import annotations

import json

import pytest
from support import run_cli, small_config

from dl2ray import seeds
from dl2ray.learn.records import RLOptions
from dl2ray.learn.ship import HEURISTICS, _rl_rows, replace_test_section, reproduce, retest, ship
from dl2ray.learn.sl import SLRun, run_sl
from dl2ray.learn.train import train_rl
from dl2ray.policy.network import load_checkpoint, set_checkpoint_placer

TINY = small_config(  # each scheduler under its own placement (the clairvoyant base config pins one)
    cluster={"nodes": [{"count": 3, "cpu": 8, "gpu": 2, "mem": 48}], "placement": "own"},
    workload={"num_jobs": 5, "arrivals": {"pattern": "poisson", "rate": 1.0, "max_per_slot": 2}},
    policy={"window": 6, "hidden": [32], "minibatch": 32, "replay_size": 256},
    sim={"max_slots": 150},
)


def _run(tmp_path):
    sl = tmp_path / "sl.pt"
    run_sl(TINY, SLRun("drf", traces=2, val_traces=1, epochs=2, seed=0, max_slots=50), out=sl)
    out = tmp_path / "rl.pt"
    train_rl(TINY, sl, 2, 0, out, RLOptions(traces=2, val_traces=1, val_every=1, checkpoint_every=1))
    return out


@pytest.mark.slow
def test_ship_writes_checkpoint_record_and_card(tmp_path):
    run = _run(tmp_path)
    # two processes after torch ran in this one: compare must spawn, not fork (OpenMP deadlock)
    shipped = ship(TINY, "tiny.yaml", run, "dl2-tiny", tmp_path / "models", test_traces=2, processes=2)
    ckpt = load_checkpoint(shipped.checkpoint, catalogue=TINY.catalogue.names)
    assert ckpt.extra["kind"] == "shipped" and "optimizer" not in ckpt.extra
    rec = json.loads(shipped.record.read_text())
    assert rec["test_seeds"] == seeds.test(2)
    assert rec["sl"]["teacher"] == "drf" and rec["rl"]["updates"] == 2
    names = [r["scheduler"] for r in rec["test_results"]]
    assert names == [*HEURISTICS, "planner-truth", "optimus-truth", "dl2 (dl2-tiny)", "lower-bound"]
    card = shipped.card.read_text()
    for name in names:
        refs = ("planner-truth", "optimus-truth", "lower-bound")
        ref = " *(reference, not deployable)*" if name in refs else ""
        assert f"| {name}{ref} |" in card
    assert "## What it knows" in card and "/ planner" in card
    assert "teacher `drf`" in card and "2 updates" in card and "algorithm `paper`" in card
    assert f"dl2ray train rl --config tiny.yaml --init {tmp_path / 'sl.pt'} --updates 2" in card
    assert "| placement |" in card

    # re-measured under another placement: the test section is rewritten, the hand-written ones stay
    shipped.card.write_text(card + "\n## Notes\n\nwritten by hand\n")
    set_checkpoint_placer(shipped.checkpoint, "packing")
    again = retest(TINY, "dl2-tiny", tmp_path / "models", processes=2)
    rec = json.loads(again.record.read_text())
    assert [r["censored_avg_jct"] for r in rec["previous_test_results"]] == \
        [r["censored_avg_jct"] for r in shipped.results]
    dl2 = next(r for r in rec["test_results"] if r["scheduler"] == "dl2 (dl2-tiny)")
    assert dl2["placement"] == "packing"
    text = again.card.read_text()
    assert text.count("## Test traces") == 1 and "## Notes\n\nwritten by hand" in text
    assert "| dl2 (dl2-tiny) | see above | packing |" in text


def test_replacing_a_cards_test_section_keeps_the_rest():
    card = "# m\n\n## Training\n\nt\n\n## Test traces (old)\n\n| old |\n\n## Reproduce\n\nr\n"
    out = replace_test_section(card, ["## Test traces (new)", "", "| new |"])
    assert out == "# m\n\n## Training\n\nt\n\n## Test traces (new)\n\n| new |\n\n## Reproduce\n\nr\n"
    assert replace_test_section("# m\n", ["## Test traces (x)"]) == "# m\n\n## Test traces (x)\n"


def test_retest_cli_rejects_bad_input(tmp_path, capsys):
    code, _, err = run_cli(capsys, "train", "retest", "--name", "nope", "--models", str(tmp_path))
    assert code == 2 and "no such shipped checkpoint" in err
    (tmp_path / "m.pt").write_bytes(b"")
    code, _, err = run_cli(capsys, "train", "retest", "--name", "m", "--models", str(tmp_path), "--placer",
                           "spread", "--config", "configs/testbed.yaml")
    assert code == 2 and "--placer: 'spread'" in err


def test_ship_cli_rejects_bad_input(tmp_path, capsys):
    code, _, err = run_cli(capsys, "train", "ship", "--run", str(tmp_path / "none.pt"), "--name", "m",
                           "--models", str(tmp_path))
    assert code == 2 and "--run" in err and "none.best.pt" in err
    code, _, err = run_cli(capsys, "train", "ship", "--run", str(tmp_path / "none.pt"), "--name", "../x")
    assert code == 2 and "--name" in err
    code, _, err = run_cli(capsys, "train", "ship", "--run", str(tmp_path / "none.pt"), "--name", "m",
                           "--trace", str(tmp_path / "missing.parquet"))
    assert code == 2 and "--trace" in err and "no such trace file" in err
    code, _, err = run_cli(capsys, "train", "rl", "--updates", "1", "--out", str(tmp_path / "x.pt"),
                           "--algo", "magic")
    assert code == 2 and "--algo" in err and "improve" in err and len(err.strip().splitlines()) == 1


def test_ship_an_sl_checkpoint_on_a_fixed_trace(tmp_path):
    from dl2ray.traces.generate import generate_trace
    from dl2ray.traces.parquet import write_trace

    sl = tmp_path / "sl.pt"
    run_sl(TINY, SLRun("drf", traces=2, val_traces=1, epochs=1, seed=0, max_slots=50), out=sl)
    trace = write_trace(tmp_path / "t.parquet", generate_trace(TINY, 99), source="test", slot_seconds=1200.0)
    shipped = ship(TINY, "tiny.yaml", sl, "dl2-sl", tmp_path / "models", test_traces=1, processes=1,
                   trace_path=trace)
    rec = json.loads(shipped.record.read_text())
    assert rec["rl"] is None and rec["sl"]["teacher"] == "drf" and rec["test_trace"] == str(trace)
    card = shipped.card.read_text()
    assert "RL | none" in card and f"the fixed trace `{trace}`" in card
    assert f"--run {sl} --name dl2-sl --test-traces 1 --trace {trace}" in card
    assert f"dl2ray train sl --config tiny.yaml --teacher drf --out {sl}" in card

SHAPE = {"arch": "shape", "shape": {"slots_per_update": 16, "jobs_per_slot": 6}}


def _record(options: dict) -> dict:
    return {"kind": "rl", "seed": 1, "updates": 10, "init": "runs/sl.pt", "options": options,
            "config": {"policy": SHAPE}, "best": {"update": 5, "avg_jct": 11.5}, "val_seeds": [1, 2]}


def test_an_a3c_run_is_reproduced_with_its_agents_and_twin() -> None:
    rl = _record({"agents": 2, "traces": 100, "val_traces": 5, "val_every": 5, "twin": "observed"})
    cmds = reproduce("m", "configs/testbed.yaml", "runs/a3c.pt", rl, None, 10)
    assert ("dl2ray train rl --config configs/testbed.yaml --init runs/sl.pt --algo counterfactual "
            "--agents 2 --twin observed --updates 10") in cmds[0]
    assert "A3C: 2 agent(s) as Ray actors" in _rl_rows(rl, rl["options"], SHAPE, rl["best"])[0]


def test_a_single_process_run_keeps_its_command() -> None:
    rl = _record({"algo": "counterfactual", "traces": 100, "val_traces": 5, "val_every": 5})
    cmds = reproduce("m", "configs/testbed.yaml", "runs/rl.pt", rl, None, 10)
    assert "--algo counterfactual --updates 10" in cmds[0] and "--agents" not in cmds[0]
    assert "one process" in _rl_rows(rl, rl["options"], SHAPE, rl["best"])[0]


def test_an_sl_run_from_a_student_is_reproduced_with_its_init_rounds_and_rate() -> None:
    from dl2ray.learn.ship import _sl_schedule

    run = {"teacher": "planner", "traces": 16, "val_traces": 1, "epochs": 10, "seed": 0, "arch": "shape",
           "dagger": 1, "init": "runs/sl.pt", "lr": 0.001, "train_files": [], "val_files": []}
    cmds = reproduce("m", "configs/testbed-philly.yaml", "runs/dagger.pt", None, {"run": run}, 3)
    assert "--arch shape --dagger 1 --init runs/sl.pt --lr 0.001 --teacher planner" in cmds[0]
    assert _sl_schedule(run) == "from `runs/sl.pt`, then 1 DAgger round(s) of 5 epochs (lr 0.001)"
    fresh = {**run, "dagger": 0, "init": None, "lr": None}
    assert _sl_schedule(fresh) == "10 epochs"
    assert "--init" not in reproduce("m", "c.yaml", "runs/sl.pt", None, {"run": fresh}, 3)[0]


def test_a_model_shipped_under_a_named_placer_is_reproduced_with_it() -> None:
    rl = _record({"algo": "counterfactual", "traces": 100, "val_traces": 5, "val_every": 5})
    ship_cmd = reproduce("m", "configs/testbed.yaml", "runs/rl.pt", rl, None, 10, placer="optimus")[-1]
    assert ship_cmd.endswith("--test-traces 10 --placer optimus")
    assert "--placer" not in reproduce("m", "configs/testbed.yaml", "runs/rl.pt", rl, None, 10)[-1]


def test_docs_results_shipped_table_is_the_records_own(capsys) -> None:
    """docs/results.md's "The shipped policies" table is `dl2ray train shipped`'s output on models/: a
    retest or a new ship that changes a record makes this fail until the page is regenerated."""
    from pathlib import Path

    from dl2ray.learn.ship import shipped_markdown, shipped_rows

    root = Path(__file__).resolve().parents[2]
    page = (root / "docs" / "results.md").read_text(encoding="utf-8")
    block = page.split("<!-- shipped:begin -->\n", 1)[1].split("<!-- shipped:end -->", 1)[0]
    rows = shipped_rows(root / "models")
    assert block == shipped_markdown(rows), "regenerate it: dl2ray train shipped"
    assert {r["name"] for r in rows} >= {"dl2-testbed", "dl2-testbed-busy", "dl2-large", "dl2-philly"}
    code, out, err = run_cli(capsys, "train", "shipped", "--models", str(root / "models"))
    assert code == 0 and out == block, err
    code, out, err = run_cli(capsys, "train", "shipped", "--models", str(root / "nope"))
    assert code == 2 and "--models" in err and "Traceback" not in err
