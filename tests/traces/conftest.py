"""Trace-test fixtures: the sample files and the one checker every trace source passes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from dl2ray.workload import JobCatalogue, Trace

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "tests" / "data" / "traces"


def assert_valid_trace(trace: Trace, catalogue: JobCatalogue) -> None:
    """Ids 0..n-1 in arrival order, sorted arrivals >= 0, known types, positive epochs."""
    assert len(trace) > 0
    assert [j.job_id for j in trace] == list(range(len(trace)))
    slots = [j.arrival_slot for j in trace]
    assert slots == sorted(slots)
    assert slots[0] >= 0
    for job in trace:
        assert job.job_type in catalogue.names
        assert job.true_epochs > 0 and job.est_epochs > 0


@pytest.fixture(scope="session")
def check_trace() -> Callable[[Trace, JobCatalogue], None]:
    return assert_valid_trace


@pytest.fixture(scope="session")
def samples() -> Path:
    return SAMPLES
