"""dl2ray's Parquet trace format: round trip and rejection of bad files."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dl2ray.traces import TraceError
from dl2ray.traces.describe import describe_trace
from dl2ray.traces.parquet import SCHEMA, read_trace, read_trace_meta, write_trace
from dl2ray.workload import JobSpec

TRACE = (
    JobSpec(0, "vgg-16", 0, 4000.0, 3900.5),
    JobSpec(1, "dssm", 0, 12700.0, 12700.0),
    JobSpec(2, "wlm", 3, 11800.25, 12000.0, requested_bundles=4),
    JobSpec(3, "vgg-16", 7, 100.0, 110.0, requested_bundles=1, queue="prod", priority="high"),
)


def test_round_trip(tmp_path: Path, testbed) -> None:
    path = write_trace(tmp_path / "t.parquet", TRACE, source="unit test", slot_seconds=600.0)
    assert read_trace(path, testbed.catalogue) == TRACE
    meta = read_trace_meta(path)
    assert (meta.schema_version, meta.source, meta.slot_seconds) == (3, "unit test", 600.0)
    table = pq.read_table(path)
    assert table.schema.remove_metadata() == SCHEMA
    assert table.schema.metadata[b"dl2ray_trace_schema_version"] == b"3"
    assert table.column("requested_bundles").to_pylist() == [None, None, 4, 1]
    assert table.column("queue").to_pylist() == [None, None, None, "prod"]


def write_table(path: Path, columns: dict, metadata: dict | None = None) -> Path:
    meta = {"dl2ray_trace_schema_version": "1", "source": "t", "slot_seconds": "1200.0"}
    meta.update(metadata or {})
    pq.write_table(pa.table(columns).replace_schema_metadata(meta), path)
    return path


def good_columns() -> dict:
    return {
        "job_id": pa.array([0, 1, 2], pa.int64()),
        "job_type": pa.array(["vgg-16", "dssm", "wlm"], pa.string()),
        "arrival_slot": pa.array([0, 1, 2], pa.int64()),
        "true_epochs": pa.array([1.0, 2.0, 3.0], pa.float64()),
        "est_epochs": pa.array([1.0, 2.0, 3.0], pa.float64()),
    }


def test_hand_written_file_reads(tmp_path: Path, testbed) -> None:
    trace = read_trace(write_table(tmp_path / "t.parquet", good_columns()), testbed.catalogue)
    assert [j.job_type for j in trace] == ["vgg-16", "dssm", "wlm"]


def test_version_1_files_still_read_without_requested_sizes(tmp_path: Path, testbed) -> None:
    path = write_table(tmp_path / "v1.parquet", good_columns())  # version "1", no such column
    assert read_trace_meta(path).schema_version == 1
    assert [j.requested_bundles for j in read_trace(path, testbed.catalogue)] == [None] * 3


def v2(requested: list) -> tuple[dict, dict]:
    return ({"requested_bundles": pa.array(requested, pa.int64())},
            {"dl2ray_trace_schema_version": "2"})


def test_version_2_file_with_nulls_reads(tmp_path: Path, testbed) -> None:
    change, meta = v2([2, None, 5])
    path = write_table(tmp_path / "v2.parquet", {**good_columns(), **change}, meta)
    assert [j.requested_bundles for j in read_trace(path, testbed.catalogue)] == [2, None, 5]
    assert [j.queue for j in read_trace(path, testbed.catalogue)] == [None] * 3  # no queues before v3


def test_version_3_file_names_each_jobs_queue_and_priority(tmp_path: Path, testbed) -> None:
    cols = {**good_columns(), **v2([2, None, 5])[0], "queue": pa.array(["a", None, "b"], pa.string()),
            "priority": pa.array([None, "high", None], pa.string())}
    path = write_table(tmp_path / "v3.parquet", cols, {"dl2ray_trace_schema_version": "3"})
    trace = read_trace(path, testbed.catalogue)
    assert [(j.queue, j.priority) for j in trace] == [("a", None), (None, "high"), ("b", None)]


BAD = [
    ({"job_type": pa.array(["vgg-16", "gpt-5", "wlm"])}, None, r"row 1: field 'job_type'"),
    ({"true_epochs": pa.array([1.0, 0.0, 3.0])}, None, r"row 1: field 'true_epochs'"),
    ({"est_epochs": pa.array([1.0, 2.0, float("nan")])}, None, r"row 2: field 'est_epochs'"),
    ({"arrival_slot": pa.array([0, -1, 2], pa.int64())}, None, r"row 1: field 'arrival_slot'"),
    ({"job_id": pa.array([0, 1, 0], pa.int64())}, None, r"row 2: field 'job_id'.*duplicate"),
    ({"job_id": pa.array([0, None, 2], pa.int64())}, None, r"row 1: field 'job_id': null"),
    ({"arrival_slot": pa.array([0.0, 1.0, 2.0])}, None, r"field 'arrival_slot': type double"),
    ({"extra": pa.array([1, 2, 3])}, None, r"unexpected column"),
    ({}, {"dl2ray_trace_schema_version": "4"}, r"'dl2ray_trace_schema_version' is '4'"),
    (v2([1, 2, 3])[0], {"dl2ray_trace_schema_version": "3"}, r"field 'queue': column missing"),
    ({}, {"dl2ray_trace_schema_version": "2"}, r"field 'requested_bundles': column missing"),
    (*v2([1, 0, 2]), r"row 1: field 'requested_bundles'.*>= 1"),
    ({"requested_bundles": pa.array([1, 2, 3])}, None, r"unexpected column"),  # not in version 1
    ({}, {"slot_seconds": "soon"}, r"'slot_seconds'"),
]


@pytest.mark.parametrize("change, metadata, message", BAD)
def test_bad_file_is_rejected(tmp_path: Path, testbed, change, metadata, message) -> None:
    path = write_table(tmp_path / "bad.parquet", {**good_columns(), **change}, metadata)
    with pytest.raises(TraceError, match=message) as err:
        read_trace(path, testbed.catalogue)
    assert str(path) in str(err.value)


def test_missing_column_and_missing_version(tmp_path: Path, testbed) -> None:
    cols = good_columns()
    del cols["est_epochs"]
    with pytest.raises(TraceError, match="field 'est_epochs': column missing"):
        read_trace(write_table(tmp_path / "a.parquet", cols), testbed.catalogue)
    path = tmp_path / "b.parquet"
    pq.write_table(pa.table(good_columns()), path)
    with pytest.raises(TraceError, match="is None, expected '1' or '2'"):
        read_trace(path, testbed.catalogue)


def test_not_parquet_and_missing(tmp_path: Path, testbed) -> None:
    text = tmp_path / "t.parquet"
    text.write_text("timestamp,duration\n")
    with pytest.raises(TraceError, match="not a readable Parquet trace"):
        read_trace(text, testbed.catalogue)
    with pytest.raises(TraceError, match="no such trace file"):
        read_trace(tmp_path / "nope.parquet", testbed.catalogue)
    with pytest.raises(TraceError, match="cannot write trace"):
        write_trace(tmp_path / "no" / "dir" / "t.parquet", TRACE, source="x", slot_seconds=1.0)


def test_describe_by_hand() -> None:
    d = describe_trace(TRACE, slot_seconds=1800.0)
    assert d["jobs"] == 4
    assert (d["first_arrival_slot"], d["last_arrival_slot"], d["span_slots"]) == (0, 7, 8)
    assert d["span_hours"] == 4.0
    assert d["arrivals_per_slot"] == 0.5
    assert d["max_arrivals_per_slot"] == 2
    # true epochs sorted: 100, 4000, 11800.25, 12700; p50 = (4000 + 11800.25) / 2
    assert d["true_epochs"]["p50"] == pytest.approx(7900.125)
    assert d["true_epochs"]["p10"] == pytest.approx(100 + 0.3 * 3900)
    assert d["true_epochs"]["max"] == 12700.0
    assert d["types"] == {"dssm": 1, "vgg-16": 2, "wlm": 1}
    errors = [abs(3900.5 / 4000 - 1), 0.0, abs(12000 / 11800.25 - 1), 0.1]
    assert d["mean_abs_estimate_error"] == pytest.approx(sum(errors) / 4)
