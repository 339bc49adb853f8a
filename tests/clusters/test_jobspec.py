"""The job spec: examples load, bad specs are refused naming the field, cluster-dependent checks."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from dl2ray.config import load_config
from dl2ray.errors import UserError
from dl2ray.jobspec import JobSpec, TaskDemand, check_spec, load_jobspec, parse_jobspec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples" / "jobs").rglob("*.yaml"))
TYPES = load_config(ROOT / "configs" / "testbed.yaml").catalogue.names
NODE = np.array([[2.0, 0.0, 8.0]])


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_loads_and_fits_a_two_core_node(path: Path) -> None:
    spec = load_jobspec(path)
    check_spec(spec, TYPES, NODE)
    assert spec.iterations == int(np.ceil(spec.epochs * spec.samples / spec.global_batch))
    assert spec.worker_args()[:2] == ["--model", spec.model]


GOOD = yaml.safe_load((ROOT / "examples" / "jobs" / "mlp-small.yaml").read_text())


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"epochs": 0}, "epochs"),
        ({"name": "Bad_Name"}, "name"),
        ({"model": "resnet"}, "model"),
        ({"worker": {"cpu": -1, "gpu": 0, "mem": 1}}, "worker.cpu"),
        ({"ps": {"cpu": 1, "gpu": 0}}, "ps.mem"),
        ({"workers": {"min": 3, "max": 2}}, "workers"),
        ({"optimizer": {"name": "rmsprop"}}, "optimizer.name"),
        ({"global_batch": 10_000}, "<root>"),
        ({"colour": "blue"}, "colour"),
    ],
)
def test_bad_spec_names_the_field(change: dict, field: str) -> None:
    with pytest.raises(UserError, match=re.escape(f"job.yaml: {field}:")):
        parse_jobspec({**GOOD, **change}, "job.yaml")


def test_unknown_type_and_impossible_demand_are_refused() -> None:
    spec = parse_jobspec(GOOD)
    with pytest.raises(UserError, match="job_type: unknown job type 'nope'"):
        check_spec(spec.model_copy(update={"job_type": "nope"}), TYPES, NODE)
    huge = spec.model_copy(update={"worker": TaskDemand(cpu=4, gpu=0, mem=1)})
    with pytest.raises(UserError, match=r"worker: demand \(cpu 4.*fits on no node"):
        check_spec(huge, TYPES, NODE)
    gpu = spec.model_copy(update={"ps": TaskDemand(cpu=1, gpu=1, mem=1)})
    with pytest.raises(UserError, match="ps: demand"):
        check_spec(gpu, TYPES, NODE)


def test_not_a_mapping_and_unreadable_file(tmp_path: Path) -> None:
    bad = tmp_path / "list.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(UserError, match="<root>: expected a mapping"):
        load_jobspec(bad)
    with pytest.raises(UserError, match="cannot read job spec"):
        load_jobspec(tmp_path / "missing.yaml")


def test_spec_round_trips_through_json() -> None:
    spec = parse_jobspec(GOOD)
    assert JobSpec.model_validate_json(spec.model_dump_json()) == spec
