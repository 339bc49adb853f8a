"""Fixtures of the Serve tests: simulator views, a second checkpoint, the app on plain uvicorn."""

from __future__ import annotations

from pathlib import Path

import pytest
from serve_support import SHIPPED, TESTBED, Endpoint, sim_views

from dl2ray.config import ExperimentConfig, load_config
from dl2ray.view import ClusterView


@pytest.fixture(scope="session")
def testbed() -> ExperimentConfig:
    """The config the shipped policy was trained for (``configs/testbed.yaml``: the realistic world, the
    operator's profile); overrides the suite's clairvoyant ``testbed`` inside tests/serve."""
    return load_config(TESTBED)


@pytest.fixture(scope="session")
def views(testbed: ExperimentConfig) -> list[ClusterView]:
    return sim_views(testbed, 0, (2, 5, 9, 14))


@pytest.fixture(scope="session")
def other_checkpoint(testbed: ExperimentConfig, tmp_path_factory) -> Path:
    """Weights other than the shipped ones, for the testbed config: a fresh GlobalPolicy's (seed 7)."""
    from clusters.a3c.global_policy import A3COptions, GlobalPolicyImpl

    gp = GlobalPolicyImpl(testbed, None, 7, None, A3COptions(agents=1, traces=1, val_every=None))
    path = tmp_path_factory.mktemp("ckpt") / "fresh.pt"
    gp.save(str(path))
    return path


@pytest.fixture(scope="module")
def endpoint():
    ep = Endpoint({"config": str(TESTBED), "checkpoint": str(SHIPPED), "reload_every_s": 0})
    yield ep
    ep.close()
