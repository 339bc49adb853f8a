"""Placement belongs to the scheduler: every baseline decides under its own paper's placer (issue 36)."""

from __future__ import annotations

import json

import pytest
from support import CONFIGS, run_cli

from dl2ray.config import load_config
from dl2ray.errors import UserError
from dl2ray.schedulers.base import make_scheduler
from dl2ray.schedulers.placed import Placed, with_placement
from dl2ray.schedulers.planner import Planner
from dl2ray.world import build_simulator

OWN = {
    "fifo": "load_balancing", "fifo-published": "load_balancing",
    "srtf": "load_balancing", "srtf-published": "load_balancing",
    "drf": "load_balancing", "drf-static": "load_balancing",
    "tetris": "tetris", "tetris-published": "tetris",
    "optimus": "optimus", "optimus:type": "optimus", "optimus-truth": "optimus",
    "planner": Planner.placement, "planner-truth": Planner.placement,
}
"""Each built-in scheduler's own placement (docs/schedulers.md, "Placement")."""


def _placers_seen(sched, cfg, slots: int = 4) -> set[str]:
    """The ``view.placement`` of every view the scheduler inside ``sched`` was given over ``slots`` slots."""
    seen: set[str] = set()
    inner = sched.inner
    decide = inner.decide

    def spy(view):
        seen.add(view.placement)
        return decide(view)

    inner.decide = spy
    sim = build_simulator(cfg)
    view = sim.reset(2_000_000)
    if hasattr(sched, "reset"):
        sched.reset(2_000_000)
    for _ in range(slots):
        view = sim.step(sched.decide(view)).view
    return seen


@pytest.mark.parametrize("name", sorted(OWN))
def test_every_scheduler_decides_under_its_own_placement(realistic, name):
    """``--placement own`` (the shipped configs' default): the views each scheduler decides on name its
    paper's placer — no baseline runs with a placement weaker than its paper defines."""
    assert realistic.cluster.placement == "own"
    sched = make_scheduler(name, realistic)
    assert isinstance(sched, Placed) and sched.placement == OWN[name]
    assert _placers_seen(sched, realistic) == {OWN[name]}


@pytest.mark.parametrize("forced", ["load_balancing", "packing", "optimus", "tetris"])
def test_a_forced_placement_reaches_every_scheduler(realistic, forced):
    cfg = realistic.model_copy(update={"cluster": realistic.cluster.model_copy(update={"placement": forced})})
    for name in ("drf", "tetris", "optimus", "planner"):
        sched = make_scheduler(name, cfg)
        assert sched.placement == forced
        assert _placers_seen(sched, cfg, slots=2) == {forced}


def test_a_dl2_checkpoint_places_as_its_meta_says(realistic, tmp_path):
    import shutil

    from dl2ray.policy.network import read_checkpoint_doc, set_checkpoint_placer

    src = CONFIGS.parent / "models" / "dl2-testbed.pt"
    copy = tmp_path / "p.pt"
    shutil.copy(src, copy)
    before = read_checkpoint_doc(copy)
    set_checkpoint_placer(copy, "packing")
    after = read_checkpoint_doc(copy)
    assert after["meta"]["placer"] == "packing"
    assert all((after["policy"][k] == before["policy"][k]).all() for k in before["policy"])  # same weights
    sched = make_scheduler(f"dl2:{copy}", realistic)
    assert sched.placement == "packing"
    assert _placers_seen(sched, realistic, slots=2) == {"packing"}
    with pytest.raises(ValueError, match="placer"):
        set_checkpoint_placer(copy, "spread")


def test_wrapping_is_not_nested_and_unknown_placements_are_refused(realistic):
    sched = make_scheduler("optimus", realistic)
    again = with_placement(sched, "packing")
    assert again.inner is sched.inner and again.placement == "packing"
    assert with_placement(again, "own").placement == "optimus"
    with pytest.raises(UserError, match="unknown placement 'spread'"):
        make_scheduler("drf", realistic, "spread")


def test_old_oracle_name_builds_optimus_truth_and_warns(realistic):
    with pytest.warns(FutureWarning, match="optimus-truth"):
        sched = make_scheduler("oracle", realistic)
    assert sched.name == "optimus-truth" and sched.reference


def test_compare_json_names_the_placement_of_every_row(capsys):
    cfg = str(CONFIGS / "testbed.yaml")
    code, out, _ = run_cli(capsys, "compare", "--config", cfg, "--schedulers", "drf,tetris,optimus",
                           "--traces", "1", "--seed", "2000000", "--processes", "1", "--json")
    assert code == 0
    doc = json.loads(out)
    placements = {r["scheduler"]: r["placement"] for r in doc["results"]}
    assert doc["placement"] == "own"
    assert placements == {"drf": "load_balancing", "tetris": "tetris", "optimus": "optimus",
                          "optimus-truth": "optimus", "lower-bound": "best"}
    code, out, _ = run_cli(capsys, "compare", "--config", cfg, "--schedulers", "drf,optimus", "--traces", "1",
                           "--seed", "2000000", "--processes", "1", "--no-references", "--placement",
                           "packing", "--json")
    assert code == 0
    assert {r["placement"] for r in json.loads(out)["results"]} == {"packing"}


def test_an_unknown_placement_on_the_cli_is_one_line_and_exit_2(capsys):
    code, _, err = run_cli(capsys, "compare", "--schedulers", "drf", "--traces", "1", "--placement", "spread")
    assert code == 2
    assert "--placement: unknown placement 'spread'" in err
    assert "Traceback" not in err


def test_the_shipped_dl2_configs_let_every_scheduler_place_as_its_own():
    for name in ("testbed", "testbed-busy", "large", "large-busy", "testbed-philly"):
        assert load_config(CONFIGS / f"{name}.yaml").cluster.placement == "own"
