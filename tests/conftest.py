"""Shared fixtures: repository paths, small configs, the speed model, the shared data."""

from __future__ import annotations

from pathlib import Path

import pytest

from dl2ray.config import ExperimentConfig, load_config
from dl2ray.speed import SpeedModel, load_surfaces

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
SHARED_DATA = REPO.parent / "shared" / "data"


def small_config(**groups) -> ExperimentConfig:
    """The testbed config with whole groups replaced (dicts are validated)."""
    raw = load_config(CONFIGS / "testbed.yaml").model_dump()
    for key, value in groups.items():
        raw[key] = value if not isinstance(value, dict) else {**raw.get(key, {}), **value}
    raw["base_dir"] = str(CONFIGS)
    return ExperimentConfig.model_validate(raw)


@pytest.fixture(scope="session")
def testbed() -> ExperimentConfig:
    return load_config(CONFIGS / "testbed.yaml")


@pytest.fixture(scope="session")
def speed_model(testbed: ExperimentConfig) -> SpeedModel:
    return SpeedModel(testbed.catalogue, load_surfaces(testbed.surfaces_dir))


@pytest.fixture(scope="session")
def measurements_file() -> Path:
    path = SHARED_DATA / "dl2_speed_measurements.txt"
    if not path.exists():
        pytest.skip(f"shared measurements not present at {path}")
    return path
