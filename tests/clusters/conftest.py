"""A tiny config for the A3C tests (3 nodes, 5 jobs, small networks): Ray actors start and learn quickly."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import config_yaml, small_config, tiny_shape_config

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
    return _as_yaml(tiny, tmp_path / "tiny.yaml")


def _as_yaml(cfg: ExperimentConfig, path: Path) -> Path:
    """``cfg`` as a YAML file for the CLI (:func:`support.config_yaml`)."""
    return config_yaml(cfg, path)


@pytest.fixture(scope="session")
def tiny_shape() -> ExperimentConfig:
    """:func:`support.tiny_shape_config`: the shipped architecture on the tiny cluster."""
    return tiny_shape_config()


@pytest.fixture
def tiny_shape_yaml(tiny_shape: ExperimentConfig, tmp_path: Path) -> Path:
    return _as_yaml(tiny_shape, tmp_path / "tiny-shape.yaml")
