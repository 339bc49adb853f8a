"""No scheduler marked deployable can reach the simulator's truth: not through its config, not through
a file, not through the view.

- config: every deployable scheduler is built from :func:`dl2ray.knowledge.hidden.operator_config`, whose
  truth fields raise when read;
- files: an audit hook records every file opened while a scheduler is built and runs a whole trace; no
  deployable scheduler opens anything in the true speed surfaces' folder (the references do — the hook
  sees them, so the check can fail);
- view: a deployable scheduler's decisions on the views of a run are unchanged when everything that is
  truth behind those views changes — the true surfaces file replaced by nonsense and the catalogue's
  analytic constants (model size, compute time, bandwidths) scaled.
"""

from __future__ import annotations

import json
import shutil
import sys
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml
from support import CONFIGS

from dl2ray.config import load_config
from dl2ray.knowledge.hidden import TruthAccessError, operator_config
from dl2ray.schedulers.base import is_reference, make_scheduler, scheduler_names
from dl2ray.world import build_simulator

_OPENED: list[str] | None = None


def _audit(event: str, args: tuple) -> None:
    if _OPENED is not None and event == "open" and isinstance(args[0], str | Path):
        _OPENED.append(str(Path(args[0]).resolve()))


sys.addaudithook(_audit)  # permanent for the process; records only inside `_opened()`


@contextmanager
def _opened():
    global _OPENED
    _OPENED = []
    try:
        yield _OPENED
    finally:
        _OPENED = None


def _small(tmp_path: Path, truth: Path | None = None, jobtypes: Path | None = None):
    """The realistic testbed, 8 jobs; the truth files (surfaces folder, catalogue) optionally elsewhere."""
    raw = yaml.safe_load((CONFIGS / "testbed.yaml").read_text())
    raw["workload"]["num_jobs"] = 8
    raw["profile"] = str(CONFIGS / raw["profile"])
    raw["jobtypes"] = str(jobtypes or CONFIGS / raw["jobtypes"])
    raw["speed"]["surfaces"] = str(truth or CONFIGS / "speed")
    path = tmp_path / f"cfg-{len(list(tmp_path.iterdir()))}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_config(path)


def _shape_checkpoint(cfg, tmp_path: Path) -> str:
    from dl2ray.policy.shape import ShapeEncoding
    from dl2ray.policy.shape_net import build_shape_policy, save_shape_checkpoint

    path = tmp_path / "policy.pt"
    if not path.exists():
        s = cfg.policy.shape
        save_shape_checkpoint(path, build_shape_policy(ShapeEncoding.from_config(cfg), s.embed, s.head, 3),
                              cfg.catalogue.names)
    return f"dl2:{path}"


def _deployable(cfg, tmp_path: Path) -> list[str]:
    """Every registered DL2-mode scheduler that is not a reference and needs no outside service."""
    gang_or_service = {"sif", "dsif", "saf", "lrf", "spf", "fifo-gang", "sched2", "harmony",
                       "harmony-planner", "lb-place", "tetris-place", "lif-linear", "random-place",
                       "pack-place", "serve", "rllib", "dl2"}
    names = [n for n in scheduler_names() if not is_reference(n) and n not in gang_or_service]
    return [*names, "optimus:type", _shape_checkpoint(cfg, tmp_path)]


def test_the_operator_config_hides_every_truth_field(realistic):
    op = operator_config(realistic)
    for read in (lambda: op.speed.surfaces, lambda: op.speed.job_deviation, lambda: op.surfaces_dir,
                 lambda: op.workload.epoch_error * 2, lambda: float(op.workload.epoch_error),
                 lambda: op.workload.epoch_error > 0):
        with pytest.raises(TruthAccessError, match="truth"):
            read()
    assert op.catalogue.names == realistic.catalogue.names and op.profile == realistic.profile
    assert op.cluster == realistic.cluster and op.policy == realistic.policy
    assert op.sim.slot_seconds == realistic.sim.slot_seconds
    gang = operator_config(load_config(CONFIGS / "harmony.yaml"))
    with pytest.raises(TruthAccessError, match=r"gang\.interference"):
        _ = gang.gang.interference.kappa


def test_references_are_registered_as_such():
    references = ("optimus-truth", "oracle", "planner-truth", "planner-truth:optimus-fit",
                  "planner-job-truth", "lif-linear")
    assert all(is_reference(n) for n in references)
    deployable = ("planner", "optimus", "drf", "dl2:x.pt", "lb-place", "pack-place")
    assert not any(is_reference(n) for n in deployable)


def test_lif_linear_fits_on_the_whole_config_and_is_marked_a_reference(monkeypatch):
    """Its fit runs the true simulator (logged placements): a plugin factory that reads the truth gets the
    whole config, not the operator's (which refused to serialise it), and its rows are references."""
    import dl2ray.harmony.linear as linear
    from dl2ray.knowledge.hidden import is_operator_config

    cfg = load_config(CONFIGS / "harmony.yaml")
    seen = []

    def fake_fit(c):
        seen.append(c)
        return np.zeros((len(c.catalogue), len(c.catalogue)))

    monkeypatch.setattr(linear, "fitted_coefficients", fake_fit)
    placer = make_scheduler("lif-linear", cfg)
    assert len(seen) == 1 and not is_operator_config(seen[0]) and seen[0].gang.interference is not None
    assert placer.reference is True and make_scheduler("lb-place", cfg).reference is False


def test_no_deployable_scheduler_opens_a_truth_file(tmp_path):
    cfg = _small(tmp_path)
    truth = str(cfg.surfaces_dir.resolve())
    sim = build_simulator(cfg)
    names = _deployable(cfg, tmp_path)
    for name in [*names, "planner-truth", "optimus-truth"]:
        with _opened() as files:
            sched = make_scheduler(name, cfg)
            view = sim.reset(2_000_001)
            if hasattr(sched, "reset"):
                sched.reset(2_000_001)
            while not sim.done:
                view = sim.step(sched.decide(view)).view
        read_truth = [f for f in files if f.startswith(truth)]
        if is_reference(name):
            assert read_truth, f"{name} (a reference) read no truth file: the audit hook sees nothing"
        else:
            assert not read_truth, f"{name} opened {read_truth}"


def test_decisions_do_not_change_when_the_truth_behind_the_views_does(tmp_path):
    cfg = _small(tmp_path)
    # another truth: the surfaces replaced by nonsense, the analytic constants scaled
    fake = tmp_path / "fake-speed"
    fake.mkdir()
    doc = json.loads((cfg.surfaces_dir / "surfaces.json").read_text())
    rng = np.random.default_rng(0)
    for m in doc["models"].values():
        m["speed"] = (rng.uniform(1, 99, np.shape(m["speed"]))).tolist()
    (fake / "surfaces.json").write_text(json.dumps(doc))
    shutil.copy(cfg.surfaces_dir / "optimus_fit.json", fake / "optimus_fit.json")
    cat = yaml.safe_load(cfg.resolve(cfg.jobtypes).read_text())
    for t in cat["types"]:
        t.update(model_size_mb=t["model_size_mb"] * 3, compute_s=t["compute_s"] * 0.5,
                 bw_inter_mbps=t["bw_inter_mbps"] * 2, bw_intra_mbps=t["bw_intra_mbps"] * 0.25)
    (tmp_path / "jobtypes-other.yaml").write_text(yaml.safe_dump(cat))
    other = _small(tmp_path, truth=fake, jobtypes=tmp_path / "jobtypes-other.yaml")
    assert other.catalogue.types[0].compute_s != cfg.catalogue.types[0].compute_s
    sim = build_simulator(cfg)
    for name in _deployable(cfg, tmp_path):
        a, b = make_scheduler(name, cfg), make_scheduler(name, other)
        view = sim.reset(2_000_002)
        for s in (a, b):
            if hasattr(s, "reset"):
                s.reset(2_000_002)
        while not sim.done:
            mine = a.decide(view)
            theirs = b.decide(replace(view, catalogue=other.catalogue))
            assert dict(mine.tasks) == dict(theirs.tasks), f"{name} decided differently at slot {view.slot}"
            view = sim.step(mine).view
