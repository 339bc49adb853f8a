"""Real-trace importers: cluster job logs → DL jobs of the catalogue.

Each format reader yields :class:`RawJob` records (submit time, duration, GPU
count) after its filter; :func:`to_trace` then maps every record to a job with
one documented, seeded rule:

1. Records are sorted by submit time (ties: file order); ``skip`` drops the
   first S of them (a later segment of the same cluster) and ``max_jobs``
   keeps the first N of the rest. Job ids are 0..N-1 in that order.
2. ``arrival_slot = floor((submit_s - first_submit_s) × time_scale × a / slot_seconds)``
   with ``a = 1``, or with ``target_load`` set ``a = L₁ / target_load``, where
   ``L₁`` is the offered load (:func:`offered_load`) of the records at
   ``a = 1``: arrivals are compressed (a < 1) or stretched (a > 1) until the
   offered load on ``cluster_total`` is ``target_load``; durations are
   untouched.
3. The job type is drawn uniformly from ``types`` (default: the catalogue)
   with the first child of ``SeedSequence(seed)``.
4. ``true_epochs = nominal_bps(type, g', g') × duration_s × time_scale /
   batches_per_epoch`` with ``g' = clamp(g, 1, min(max_workers, max_ps))``:
   with g' PS and g' workers (one PS per worker) at the measured speed the
   job would run for the record's (scaled) duration.
5. ``est_epochs = true × (1 + U(-e, e))`` with the second child stream.
6. ``requested_bundles = g'``: the user asked for one worker (and one PS) per
   GPU of the record, within the type's caps.

Formats (CSV with a header; see ``docs/traces.md``):

- ``philly``: ``timestamp,duration,num_gpus,gpu_time,cluster``; keeps
  ``num_gpus ≥ 1`` and ``duration > 0``; ``cluster`` filters the virtual cluster.
- ``alibaba-gpu-2023``: ``name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,
  qos,pod_phase,creation_time,deletion_time,scheduled_time``; keeps
  ``num_gpu ≥ 1`` with ``deletion_time - scheduled_time > 0``, skipping pods
  whose ``scheduled_time`` or ``deletion_time`` is empty or 0; submit =
  ``creation_time``.
- ``helios``: ``job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,
  start_time,end_time,duration,queue``; keeps ``gpu_num ≥ 1`` and
  ``duration > 0``; ``cluster`` filters ``vc``; ``submit_time`` in seconds
  or as ``YYYY-MM-DD HH:MM:SS``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from dl2ray.speed import SpeedModel
from dl2ray.tenancy import QueueSpec, Resources, TenancyConfig
from dl2ray.traces import TraceError
from dl2ray.traces.csvfile import CsvRecords
from dl2ray.traces.generate import build_jobs, estimate_epochs
from dl2ray.workload import JobType, Trace


@dataclass(frozen=True, slots=True)
class RawJob:
    """One kept record: submit time (s, any origin), run time (s), GPUs, file line, and the virtual cluster it
    ran in (Philly's ``cluster``, Helios' ``vc``; None where the format has none)."""

    submit_s: float
    duration_s: float
    gpus: int
    line: int
    group: str | None = None


@dataclass(frozen=True, slots=True)
class ImportOptions:
    """How records become jobs (see the module docstring for the rule).

    ``slot_seconds``: slot length, s. ``time_scale``: multiplies every time of
    the trace (0.1 = ten times faster). ``max_jobs``: keep the first N after
    filtering (None = all), after dropping the first ``skip``. ``cluster``: virtual
    cluster to keep (None = all).
    ``seed``: seeds job types and estimate errors. ``epoch_error``: e in
    [0, 1). ``types``: job-type names to draw from (None = whole catalogue).
    ``target_load``: offered load to compress arrivals to (None = keep the
    trace's gaps), on a cluster of total capacity ``cluster_total`` (cpu, gpu,
    mem), which it needs.
    """

    slot_seconds: float = 1200.0
    time_scale: float = 1.0
    max_jobs: int | None = None
    skip: int = 0
    cluster: str | None = None
    seed: int = 0
    epoch_error: float = 0.0
    types: tuple[str, ...] | None = None
    target_load: float | None = None
    cluster_total: tuple[float, float, float] | None = None
    queues: bool = False
    """Each job in the queue of its virtual cluster (docs/tenancy.md; :func:`vc_tenancy` sizes the queues)."""

    def __post_init__(self) -> None:
        checks = [
            ("slot-seconds", self.slot_seconds > 0 and math.isfinite(self.slot_seconds), "> 0"),
            ("time-scale", self.time_scale > 0 and math.isfinite(self.time_scale), "> 0"),
            ("max-jobs", self.max_jobs is None or self.max_jobs >= 1, ">= 1"),
            ("skip", self.skip >= 0, ">= 0"),
            ("seed", self.seed >= 0, ">= 0"),
            ("epoch-error", 0.0 <= self.epoch_error < 1.0, "in [0, 1)"),
            ("types", self.types is None or len(self.types) > 0, "non-empty"),
            ("target-load", self.target_load is None
             or (self.target_load > 0 and math.isfinite(self.target_load)), "> 0"),
        ]
        for name, ok, want in checks:
            if not ok:
                raise TraceError(f"--{name}: {getattr(self, name.replace('-', '_'))} must be {want}")


# -- format readers ---------------------------------------------------------------------

PHILLY_COLUMNS = ("timestamp", "duration", "num_gpus", "gpu_time", "cluster")
ALIBABA_COLUMNS = (
    "name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec",
    "qos", "pod_phase", "creation_time", "deletion_time", "scheduled_time",
)  # fmt: skip
HELIOS_COLUMNS = (
    "job_id", "user", "vc", "gpu_num", "cpu_num", "node_num",
    "state", "submit_time", "start_time", "end_time", "duration", "queue",
)  # fmt: skip


def read_philly(path: str | Path, cluster: str | None) -> list[RawJob]:
    """Philly jobs with ``num_gpus ≥ 1`` and ``duration > 0`` (s), optionally one cluster."""
    csv = CsvRecords(path, PHILLY_COLUMNS)
    out: list[RawJob] = []
    for line, row in csv:
        submit = csv.datetime_s(line, row, "timestamp")
        duration = csv.number(line, row, "duration")
        gpus = csv.integer(line, row, "num_gpus")
        csv.number(line, row, "gpu_time")
        vc = csv.text(line, row, "cluster")
        if cluster is not None and vc != cluster:
            continue
        if gpus >= 1 and duration > 0:
            out.append(RawJob(submit, duration, gpus, line, vc))
    return out


def read_alibaba_gpu_2023(path: str | Path, cluster: str | None) -> list[RawJob]:
    """GPU pods (``num_gpu ≥ 1``) that were scheduled and ran for a positive time (s)."""
    if cluster is not None:
        raise TraceError("--cluster: the alibaba-gpu-2023 format has no cluster column")
    csv = CsvRecords(path, ALIBABA_COLUMNS)
    out: list[RawJob] = []
    for line, row in csv:
        gpus = csv.integer(line, row, "num_gpu")
        created = csv.number(line, row, "creation_time")
        scheduled = csv.number(line, row, "scheduled_time", empty=0.0)
        deleted = csv.number(line, row, "deletion_time", empty=0.0)
        if gpus >= 1 and scheduled > 0 and deleted > 0 and deleted - scheduled > 0:
            out.append(RawJob(created, deleted - scheduled, gpus, line))
    return out


def read_helios(path: str | Path, cluster: str | None) -> list[RawJob]:
    """Helios jobs with ``gpu_num ≥ 1`` and ``duration > 0`` (s), optionally one ``vc``."""
    csv = CsvRecords(path, HELIOS_COLUMNS)
    out: list[RawJob] = []
    for line, row in csv:
        gpus = csv.integer(line, row, "gpu_num")
        submit = csv.time_s(line, row, "submit_time")
        duration = csv.number(line, row, "duration")
        vc = csv.text(line, row, "vc")
        if cluster is not None and vc != cluster:
            continue
        if gpus >= 1 and duration > 0:
            out.append(RawJob(submit, duration, gpus, line, vc))
    return out


Reader = Callable[[str | Path, str | None], list[RawJob]]

FORMATS: dict[str, Reader] = {
    "philly": read_philly,
    "alibaba-gpu-2023": read_alibaba_gpu_2023,
    "helios": read_helios,
}


# -- the mapping rule -------------------------------------------------------------------


def one_ps_per_worker_gpus(jt: JobType, gpus: int) -> int:
    """``g' = clamp(g, 1, min(max_workers, max_ps))``."""
    return max(1, min(gpus, jt.max_workers, jt.max_ps))


def record_epochs(speed: SpeedModel, type_index: int, job: RawJob, time_scale: float) -> float:
    """Epochs the job trains so that with g' PS and g' workers it runs ``duration × time_scale`` s."""
    jt = speed.catalogue.types[type_index]
    g = one_ps_per_worker_gpus(jt, job.gpus)
    bps = speed.nominal_batches_per_second(type_index, ps=g, workers=g)
    return bps * job.duration_s * time_scale / jt.batches_per_epoch


def bundle_share(jt: JobType, bundles: int, total: np.ndarray) -> float:
    """Dominant share of ``bundles`` × (1 worker + 1 PS) of ``jt`` in a cluster of ``total`` (cpu, gpu, mem).
    """
    used = bundles * (jt.worker.as_array() + jt.ps.as_array())
    mask = np.asarray(total) > 0
    return float(np.max(used[mask] / np.asarray(total)[mask]))


def offered_load(shares: np.ndarray, durations_s: np.ndarray, span_s: float) -> float:
    """``Σ_j share_j × duration_j / span``: the mean fraction of the cluster the jobs ask for.

    ``shares`` (shape (n,)): each job's dominant share at its requested size
    (:func:`bundle_share`); ``durations_s`` (n,): its run time at that size, s;
    ``span_s``: first to last submission, s. On nodes of 8 cores and 2 GPUs a
    bundle's dominant share is its GPU share, so for GPU jobs this is GPU-time
    asked for / (cluster GPUs × span); CPU-only jobs count by their CPU share.
    """
    if not span_s > 0:
        raise TraceError("--target-load: every kept job was submitted at the same time; "
                         "there is no arrival span to compress")
    return float(np.sum(shares * durations_s) / span_s)


def trace_offered_load(trace: Trace, speed: SpeedModel, total: np.ndarray, slot_seconds: float,
                       default_bundles: int) -> float | None:
    """:func:`offered_load` of a stored trace on a cluster of ``total`` (cpu, gpu, mem), or None.

    A job's size is its requested size (``default_bundles`` if it has none), cut
    to its caps; its duration is its true epochs at the measured speed of that
    size with one PS per worker (the inverse of rule 4); the span is from the
    first to the last arrival slot. None when every job arrives in one slot.
    """
    cat = speed.catalogue
    shares, durations = [], []
    for job in trace:
        t = cat.index(job.job_type)
        jt = cat.types[t]
        g = one_ps_per_worker_gpus(jt, job.requested_bundles or default_bundles)
        bps = speed.nominal_batches_per_second(t, g, g)
        shares.append(bundle_share(jt, g, total))
        durations.append(job.true_epochs * jt.batches_per_epoch / bps)
    span = (max(j.arrival_slot for j in trace) - min(j.arrival_slot for j in trace)) * slot_seconds
    if span <= 0:
        return None
    return offered_load(np.array(shares), np.array(durations), span)


def to_trace(records: list[RawJob], speed: SpeedModel, options: ImportOptions) -> Trace:
    """Map kept records to jobs (rule in the module docstring); TraceError if none are left."""
    if not records:
        raise TraceError("no jobs left after filtering")
    ordered = sorted(records, key=lambda r: (r.submit_s, r.line))
    if options.skip >= len(ordered):
        raise TraceError(f"--skip: {options.skip} skips all {len(ordered)} jobs left after filtering")
    end = None if options.max_jobs is None else options.skip + options.max_jobs
    kept = ordered[options.skip:end]
    catalogue = speed.catalogue
    names = options.types if options.types is not None else catalogue.names
    for name in names:
        if name not in catalogue.names:
            raise TraceError(f"types: unknown job type {name!r}; known: {list(catalogue.names)}")
    rng_type, rng_error = (
        np.random.default_rng(s) for s in np.random.SeedSequence(options.seed).spawn(2)
    )
    type_idx = rng_type.integers(0, len(names), size=len(kept))
    first = kept[0].submit_s
    scale = options.time_scale
    cat_idx = [catalogue.index(names[int(t)]) for t in type_idx]
    bundles = np.array([
        one_ps_per_worker_gpus(catalogue.types[c], r.gpus) for c, r in zip(cat_idx, kept, strict=True)
    ])
    arrival_scale = scale * _load_factor(kept, cat_idx, bundles, catalogue, options)
    slots = np.array(
        [math.floor((r.submit_s - first) * arrival_scale / options.slot_seconds) for r in kept]
    )
    true_epochs = np.array(
        [record_epochs(speed, c, r, scale) for c, r in zip(cat_idx, kept, strict=True)]
    )
    est_epochs = estimate_epochs(true_epochs, options.epoch_error, rng_error)
    trace = build_jobs(names, slots, type_idx, true_epochs, est_epochs, bundles)
    if not options.queues:
        return trace
    if any(r.group is None for r in kept):
        raise TraceError("--queues: this format names no virtual cluster per job")
    return tuple(replace(j, queue=kept[j.job_id].group) for j in trace)  # ids follow ``kept``'s order


def vc_tenancy(records: list[RawJob], total: np.ndarray) -> TenancyConfig:
    """One queue per virtual cluster of ``records``, its nominal quota the cluster's ``total`` (cpu, gpu,
    mem) times its share of the records' GPU time (rounded down to 0.1), its ``share`` its part of the jobs
    (how a Philly VC's size becomes a queue's quota; docs/tenancy.md)."""
    gpu_time: dict[str, float] = {}
    jobs: dict[str, int] = {}
    for r in records:
        key = r.group or "default"
        gpu_time[key] = gpu_time.get(key, 0.0) + r.gpus * r.duration_s
        jobs[key] = jobs.get(key, 0) + 1
    whole = sum(gpu_time.values())
    queues = []
    for name in sorted(gpu_time):
        q = np.floor(np.asarray(total, dtype=np.float64) * gpu_time[name] / whole * 10) / 10
        queues.append(QueueSpec(name=name, nominal=Resources(cpu=q[0], gpu=q[1], mem=q[2]),
                                share=jobs[name] / len(records)))
    return TenancyConfig(queues=tuple(queues))


def _load_factor(kept: list[RawJob], cat_idx: list[int], bundles: np.ndarray, catalogue,
                 options: ImportOptions) -> float:
    """``a`` of rule 2: 1 without a target load, else ``L₁ / target_load``."""
    if options.target_load is None:
        return 1.0
    if options.cluster_total is None:
        raise TraceError("--target-load needs the cluster it loads (--config)")
    total = np.asarray(options.cluster_total, dtype=np.float64)
    shares = np.array([bundle_share(catalogue.types[c], int(b), total)
                       for c, b in zip(cat_idx, bundles, strict=True)])
    durations = np.array([r.duration_s for r in kept]) * options.time_scale
    span = (kept[-1].submit_s - kept[0].submit_s) * options.time_scale
    return offered_load(shares, durations, span) / options.target_load


def import_trace(fmt: str, path: str | Path, speed: SpeedModel, options: ImportOptions) -> Trace:
    """Read ``path`` in format ``fmt`` (a key of :data:`FORMATS`) and map it to a trace."""
    try:
        reader = FORMATS[fmt]
    except KeyError:
        raise TraceError(f"--format: unknown format {fmt!r}; known: {sorted(FORMATS)}") from None
    records = reader(path, options.cluster)
    if not records:
        where = "" if options.cluster is None else f" in cluster {options.cluster!r}"
        raise TraceError(f"{path}: no jobs left after filtering{where}")
    return to_trace(records, speed, options)
