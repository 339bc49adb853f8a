"""Shared fixtures: configs, the speed model, the shared data (helpers live in support.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import settings

sys.path.insert(0, str(Path(__file__).resolve().parent))  # make `support` importable everywhere

from support import CONFIGS, SHARED_DATA, small_config

from dl2ray.config import ExperimentConfig, load_config
from dl2ray.measurements import load_surfaces
from dl2ray.speed import SpeedModel

__all__ = ["small_config"]

# Tests assert behaviour, never wall-clock time: no hypothesis deadlines
# (a loaded 2-core CI machine made a 200 ms deadline flaky).
settings.register_profile("dl2ray", deadline=None)
settings.load_profile("dl2ray")


@pytest.fixture(scope="session")
def testbed() -> ExperimentConfig:
    """The clairvoyant testbed (every job of a type at its surface, exact lengths): hand-computed tests."""
    return load_config(CONFIGS / "testbed-clairvoyant.yaml")


@pytest.fixture(scope="session")
def realistic() -> ExperimentConfig:
    """The shipped testbed config: the realistic information model and the operator's profile."""
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


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray instance (2 CPUs) for the whole test session; tests marked ``ray`` use it."""
    import os

    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
