"""Fixtures of the Kubernetes tests: the emulator, the test kubelet, the backend wired to them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # emulator, kubelet, k8s_support

from emulator import Emulator, node
from k8s_support import Cluster


@pytest.fixture()
def emulator():
    emu = Emulator()
    yield emu
    emu.close()


@pytest.fixture()
def cluster(emulator, tmp_path):
    """Two 2-core nodes, a running test kubelet and a KubernetesBackend (fast timeouts) on the emulator."""
    c = Cluster(
        emulator, tmp_path, [node("node-a", cpu="2", memory="4Gi"), node("node-b", cpu="2", memory="4Gi")]
    )
    yield c
    c.close()
