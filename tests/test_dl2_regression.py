"""The DL2 path is unchanged by the opt-in simulator extensions (gang mode, SCHED², Harmony).

``data/regression/testbed_seed3000000_jct.json`` holds the per-job completion
times (slots) of DRF, Optimus and the paper-architecture ``models/dl2-testbed-paper.pt`` (shipped as
``models/dl2-testbed.pt`` until the shape policy replaced it) on the
testbed config's first test trace (seed 3,000,000), recorded from commit
35cb3e5, before any of those extensions existed. Every later run must give the
same numbers. Since issue 21 that world is ``configs/testbed-clairvoyant.yaml`` and the per-type Optimus
of then is ``optimus:type`` (``optimus`` now fits each job's speed, as its paper does); since issue 36 every
scheduler places as its own paper does and the placement factor is calibrated, so the recorded world is that
config with every scheduler under ``load_balancing`` and the published ``analytic`` placement factor.
"""

from __future__ import annotations

import json

import pytest
from support import CONFIGS, REPO

from dl2ray.config import load_config
from dl2ray.evaluation.comparison import RunSpec, run_one

RECORDED = json.loads((REPO / "tests/data/regression/testbed_seed3000000_jct.json").read_text())


@pytest.mark.parametrize("scheduler", sorted(RECORDED))
def test_dl2_path_jcts_identical_to_recorded(scheduler):
    cfg = load_config(CONFIGS / "testbed-clairvoyant.yaml")
    cfg = cfg.model_copy(update={
        "cluster": cfg.cluster.model_copy(update={"placement": "load_balancing"}),
        "speed": cfg.speed.model_copy(update={"placement_model": "analytic"})})
    spec = "optimus:type" if scheduler == "optimus" else scheduler.replace("models/", f"{REPO}/models/")
    outcome = run_one(cfg, RunSpec(spec, 3_000_000), None)
    got = {str(k): v for k, v in sorted(outcome.jct.items())}
    assert got.keys() == RECORDED[scheduler].keys()
    for job, jct in RECORDED[scheduler].items():
        assert got[job] == pytest.approx(jct, rel=1e-12, abs=1e-12), f"{scheduler}: job {job}"
