"""A tiny config for the A3C tests (3 nodes, 5 jobs, small networks): Ray actors start and learn quickly."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from support import small_config

from dl2ray.config import ExperimentConfig


@pytest.fixture(scope="session")
def tiny() -> ExperimentConfig:
    return small_config(
        cluster={"nodes": [{"count": 3, "cpu": 8, "gpu": 2, "mem": 48}]},
        workload={"num_jobs": 5, "arrivals": {"pattern": "poisson", "rate": 1.0, "max_per_slot": 2}},
        policy={"window": 6, "hidden": [32], "minibatch": 32},
        sim={"max_slots": 150},
    )


@pytest.fixture
def tiny_yaml(tiny: ExperimentConfig, tmp_path: Path) -> Path:
    """The tiny config as a YAML file for the CLI (absolute paths to the job types and speed surfaces)."""
    raw = tiny.model_dump(mode="json")
    raw.pop("base_dir")
    raw["jobtypes"] = str(tiny.resolve(tiny.jobtypes))
    raw["speed"]["surfaces"] = str(tiny.surfaces_dir)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def tiny_shape() -> ExperimentConfig:
    """The tiny cluster with the shipped architecture (the shape policy, small) and the realistic
    information model (per-job deviation, declared-epoch error), so a twin has something to not know."""
    return small_config(
        cluster={"nodes": [{"count": 3, "cpu": 8, "gpu": 2, "mem": 48}]},
        workload={"num_jobs": 6, "arrivals": {"pattern": "poisson", "rate": 1.5, "max_per_slot": 3},
                  "epoch_error": 0.2},
        speed={"job_deviation": 0.2},
        policy={"arch": "shape", "shape": {"embed": [16], "head": 8, "envs": 2, "slots_per_update": 3,
                                           "jobs_per_slot": 2, "samples": 2, "uniform": 1, "horizon": 4}},
        sim={"max_slots": 200},
    )


@pytest.fixture
def tiny_shape_yaml(tiny_shape: ExperimentConfig, tmp_path: Path) -> Path:
    raw = tiny_shape.model_dump(mode="json")
    raw.pop("base_dir")
    raw["jobtypes"] = str(tiny_shape.resolve(tiny_shape.jobtypes))
    raw["speed"]["surfaces"] = str(tiny_shape.surfaces_dir)
    raw["profile"] = str(tiny_shape.resolve(tiny_shape.profile))
    path = tmp_path / "tiny-shape.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path
