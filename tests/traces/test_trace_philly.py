"""The real Philly sample (../shared/data/philly_jobs.csv) imports; skipped where absent."""

from __future__ import annotations

from pathlib import Path

import pytest

from dl2ray.traces.importers import ImportOptions, import_trace
from dl2ray.traces.parquet import read_trace, write_trace

# The repository's sibling ../shared/data (never copied into the repository).
PHILLY = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "philly_jobs.csv"


@pytest.fixture(scope="module")
def philly_path():
    if not PHILLY.exists():
        pytest.skip(f"shared Philly sample not present at {PHILLY}")
    return PHILLY


def test_full_file_imports(philly_path, speed_model, check_trace) -> None:
    trace = import_trace("philly", philly_path, speed_model, ImportOptions(seed=0))
    check_trace(trace, speed_model.catalogue)
    assert len(trace) == 82_247  # every row has a GPU and a positive duration


def test_largest_cluster_round_trips(philly_path, speed_model, tmp_path) -> None:
    opts = ImportOptions(cluster="6214e9", max_jobs=200)
    trace = import_trace("philly", philly_path, speed_model, opts)
    assert len(trace) == 200
    assert trace[0].arrival_slot == 0
    path = write_trace(tmp_path / "p.parquet", trace, source="philly", slot_seconds=1200.0)
    assert read_trace(path, speed_model.catalogue) == trace
