"""dl2ray's own trace format: one Parquet file per trace.

Columns (one row per job, in trace order)::

    job_id: int64  job_type: string  arrival_slot: int64  true_epochs: float64  est_epochs: float64
    requested_bundles: int64, null where the trace names no size (schema version 2)
    queue: string  priority: string, null on one pool (schema version 3; docs/tenancy.md)

Schema metadata (UTF-8 strings): ``dl2ray_trace_schema_version`` (``"3"``;
files of version ``"1"``, which have no ``requested_bundles`` column, and ``"2"``,
which have no ``queue``/``priority``, are still read: every job without a requested
size, in no queue),
``source`` (where the trace came from: importer and options, or generator,
config and seed) and ``slot_seconds`` (the slot length, s, that the arrival
slots were computed with). :func:`read_trace` validates everything and raises
:class:`~dl2ray.traces.TraceError` naming the file, the row and the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dl2ray.traces import TraceError
from dl2ray.workload import JobCatalogue, JobSpec, Trace, sort_trace

SCHEMA_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
VERSION_KEY = "dl2ray_trace_schema_version"

SCHEMA_V1 = pa.schema(
    [
        ("job_id", pa.int64()),
        ("job_type", pa.string()),
        ("arrival_slot", pa.int64()),
        ("true_epochs", pa.float64()),
        ("est_epochs", pa.float64()),
    ]
)
SCHEMA_V2 = SCHEMA_V1.append(pa.field("requested_bundles", pa.int64(), nullable=True))
SCHEMA = SCHEMA_V2.append(pa.field("queue", pa.string(), nullable=True)).append(
    pa.field("priority", pa.string(), nullable=True))
NULLABLE = frozenset({"requested_bundles", "queue", "priority"})
_SCHEMAS = {1: SCHEMA_V1, 2: SCHEMA_V2, 3: SCHEMA}


@dataclass(frozen=True, slots=True)
class TraceMeta:
    """Schema metadata of a trace file; ``slot_seconds`` in seconds."""

    schema_version: int
    source: str
    slot_seconds: float


def write_trace(path: str | Path, trace: Trace, *, source: str, slot_seconds: float) -> Path:
    """Write ``trace`` to ``path`` (Parquet); TraceError if it cannot be written."""
    path = Path(path)
    columns = {
        "job_id": [j.job_id for j in trace],
        "job_type": [j.job_type for j in trace],
        "arrival_slot": [j.arrival_slot for j in trace],
        "true_epochs": [j.true_epochs for j in trace],
        "est_epochs": [j.est_epochs for j in trace],
        "requested_bundles": [j.requested_bundles for j in trace],
        "queue": [j.queue for j in trace],
        "priority": [j.priority for j in trace],
    }
    meta = {VERSION_KEY: str(SCHEMA_VERSION), "source": source, "slot_seconds": repr(slot_seconds)}
    table = pa.table(columns, schema=SCHEMA.with_metadata(meta))
    try:
        pq.write_table(table, path)
    except (OSError, pa.ArrowException) as exc:
        raise TraceError(f"{path}: cannot write trace: {exc}") from None
    return path


def _open(path: Path) -> pa.Table:
    try:
        return pq.read_table(path)
    except FileNotFoundError:
        raise TraceError(f"{path}: no such trace file") from None
    except (OSError, pa.ArrowException) as exc:
        raise TraceError(f"{path}: not a readable Parquet trace: {exc}") from None


def _meta(path: Path, schema: pa.Schema) -> TraceMeta:
    raw = {k.decode(): v.decode() for k, v in (schema.metadata or {}).items()}
    version = raw.get(VERSION_KEY)
    if version not in {str(v) for v in READABLE_VERSIONS}:
        want = " or ".join(repr(str(v)) for v in READABLE_VERSIONS)
        raise TraceError(f"{path}: metadata {VERSION_KEY!r} is {version!r}, expected {want}")
    try:
        slot_seconds = float(raw["slot_seconds"])
    except (KeyError, ValueError):
        raise TraceError(
            f"{path}: metadata 'slot_seconds' is {raw.get('slot_seconds')!r}, expected seconds"
        ) from None
    if not (slot_seconds > 0 and np.isfinite(slot_seconds)):
        raise TraceError(f"{path}: metadata 'slot_seconds' must be > 0, got {slot_seconds}")
    return TraceMeta(int(version), raw.get("source", ""), slot_seconds)


def read_trace_meta(path: str | Path) -> TraceMeta:
    """The validated schema metadata of a trace file."""
    path = Path(path)
    try:
        schema = pq.read_schema(path)
    except FileNotFoundError:
        raise TraceError(f"{path}: no such trace file") from None
    except (OSError, pa.ArrowException) as exc:
        raise TraceError(f"{path}: not a readable Parquet trace: {exc}") from None
    return _meta(path, schema)


def _check_columns(path: Path, table: pa.Table, schema: pa.Schema) -> None:
    for field in schema:
        if field.name not in table.column_names:
            raise TraceError(f"{path}: field {field.name!r}: column missing")
        got = table.schema.field(field.name).type
        ok = got == field.type or (field.type == pa.string() and got == pa.large_string())
        if not ok:
            raise TraceError(f"{path}: field {field.name!r}: type {got}, expected {field.type}")
        nulls = table.column(field.name).null_count
        if nulls and field.name not in NULLABLE:
            row = int(np.flatnonzero(table.column(field.name).is_null().to_numpy())[0])
            raise TraceError(f"{path}: row {row}: field {field.name!r}: null value")
    extra = sorted(set(table.column_names) - set(schema.names))
    if extra:
        raise TraceError(f"{path}: unexpected column(s) {extra}")


def _first_bad(path: Path, mask: np.ndarray, field: str, values: np.ndarray, want: str) -> None:
    bad = np.flatnonzero(mask)
    if bad.size:
        row = int(bad[0])
        raise TraceError(f"{path}: row {row}: field {field!r}: {values[row]!r} {want}")


def _check_rows(path: Path, cols: dict[str, np.ndarray], catalogue: JobCatalogue) -> None:
    if len(cols["job_id"]) == 0:
        raise TraceError(f"{path}: the trace has no jobs")
    known = np.isin(cols["job_type"], np.array(catalogue.names, dtype=object))
    _first_bad(path, ~known, "job_type", cols["job_type"], f"is not a job type of {catalogue.names}")
    for field in ("true_epochs", "est_epochs"):
        v = cols[field]
        _first_bad(path, ~(np.isfinite(v) & (v > 0)), field, v, "must be a finite number > 0")
    arrival = cols["arrival_slot"]
    _first_bad(path, arrival < 0, "arrival_slot", arrival, "must be >= 0")
    if "requested_bundles" in cols:
        req = cols["requested_bundles"]
        _first_bad(path, ~np.isnan(req) & (req < 1), "requested_bundles", req,
                   "must be >= 1 (or null)")
    ids = cols["job_id"]
    _, first_index = np.unique(ids, return_index=True)
    dupes = np.ones(len(ids), dtype=bool)
    dupes[first_index] = False
    _first_bad(path, dupes, "job_id", ids, "is a duplicate job id")


def read_trace(path: str | Path, catalogue: JobCatalogue) -> Trace:
    """Read and validate a trace file; the jobs sorted by ``(arrival_slot, job_id)``."""
    path = Path(path)
    table = _open(path)
    meta = _meta(path, table.schema)
    schema = _SCHEMAS[meta.schema_version]
    _check_columns(path, table, schema)
    cols = {name: table.column(name).to_numpy(zero_copy_only=False) for name in schema.names}
    if "requested_bundles" in cols:  # nullable int64 → float64 with NaN for null
        cols["requested_bundles"] = (
            table.column("requested_bundles").cast(pa.float64()).fill_null(np.nan).to_numpy()
        )
    else:
        cols["requested_bundles"] = np.full(len(cols["job_id"]), np.nan)
    for name in ("queue", "priority"):  # nullable strings: None where null
        cols[name] = (np.array(table.column(name).to_pylist(), dtype=object) if name in cols
                      else np.full(len(cols["job_id"]), None, dtype=object))
    _check_rows(path, cols, catalogue)
    jobs = [
        JobSpec(int(i), str(t), int(a), float(tr), float(es), None if np.isnan(r) else int(r),
                queue=q, priority=pc)
        for i, t, a, tr, es, r, q, pc in zip(*(cols[n] for n in SCHEMA.names), strict=True)
    ]
    return sort_trace(jobs)
