"""Traces for gang mode (:mod:`dl2ray.gang`): Philly all-reduce jobs (SCHED²) and sized synthetic jobs.

``gang.workload: philly`` — a window of ``workload.num_jobs`` consecutive jobs of
the Philly CSV (``timestamp,duration,num_gpus,...``, sorted by submission time).
Which part of the CSV a window comes from depends on the seed's set
(:mod:`dl2ray.seeds`): training seeds the first 60 % of the jobs,
validation seeds the next 20 %, test seeds the last 20 % (other seeds: all), so
test traces never share a job with training or selection traces. From the
window the trace keeps the arrival times (relative to its first job, times
``gang.arrival_scale``); with ``gang.one_gpu_share = p`` every job's
(GPU count, duration) is redrawn from the part's 1-GPU jobs with probability
``p`` and from its multi-GPU jobs otherwise (Philly has 93 % 1-GPU jobs; SCHED²
uses 60/68/75 %). GPU counts are capped at ``gang.max_gpus``, durations clipped to
``[min_duration_s, max_duration_s]``. Types are drawn by ``gang.type_mix``. A job's
epochs are mini-batches: ``duration / compute_s`` of its type (its ideal time is
the Philly duration); estimates are exact (SCHED² profiles jobs).

``gang.workload: synthetic`` — :func:`dl2ray.traces.generate.generate_trace`'s
trace with every job given ``U{min_tasks..max_tasks}`` workers and as many PS
drawn independently (Harmony: sizes fixed by the user).

Every draw uses a generator seeded from ``(seed, purpose)``.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

from dl2ray.config import ConfigError, ExperimentConfig
from dl2ray.workload import JobSpec, Trace, sort_trace

PARTS = {"training": (0.0, 0.6), "validation": (0.6, 0.8), "test": (0.8, 1.0), "spent-test": (0.8, 1.0),
         "none": (0.0, 1.0)}
"""Fraction of the time-sorted CSV each seed set draws its windows from (the spent DL2 test seeds, on
which SCHED²'s and Harmony's recorded results were measured, keep the test part)."""


@lru_cache(maxsize=4)
def load_philly(path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(submit_s, duration_s, gpus)`` of every job with a positive duration, sorted by submission."""
    import csv
    from datetime import datetime

    try:
        fh = open(path, encoding="utf-8")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise ConfigError(f"gang.philly_csv: cannot read {path}: {exc.strerror}") from None
    t, d, g = [], [], []
    with fh:
        for row in csv.DictReader(fh):
            dur = float(row["duration"])
            if dur <= 0:
                continue
            t.append(datetime.strptime(row["timestamp"], "%Y-%m-%d %H:%M:%S").timestamp())
            d.append(dur)
            g.append(int(row["num_gpus"]))
    order = np.argsort(np.asarray(t), kind="stable")
    return np.asarray(t)[order], np.asarray(d)[order], np.asarray(g)[order]


def gang_trace(cfg: ExperimentConfig, seed: int) -> Trace:
    """The gang-mode trace of ``seed`` (see the module docstring)."""
    assert cfg.gang is not None
    if cfg.gang.workload == "synthetic":
        return _synthetic(cfg, seed)
    return _philly(cfg, seed)


def _synthetic(cfg: ExperimentConfig, seed: int) -> Trace:
    from dataclasses import replace

    from dl2ray.traces.generate import generate_trace

    g = cfg.gang
    assert g is not None
    rng = np.random.default_rng([seed, 0x5123])
    base = generate_trace(cfg, seed)
    w = rng.integers(g.min_tasks, g.max_tasks + 1, size=len(base))
    p = rng.integers(g.min_tasks, g.max_tasks + 1, size=len(base))
    return tuple(replace(j, workers=int(a), ps=int(b)) for j, a, b in zip(base, w, p, strict=True))


def _philly(cfg: ExperimentConfig, seed: int) -> Trace:
    from dl2ray.seeds import which

    g = cfg.gang
    assert g is not None
    t, d, gpus = load_philly(str(Path(cfg.resolve(g.philly_csv)).resolve()))
    lo, hi = (int(f * len(t)) for f in PARTS[which(seed)])
    n = cfg.workload.num_jobs
    if hi - lo < n:
        raise ConfigError(f"workload.num_jobs: {n} is more than the {hi - lo} jobs of the CSV part")
    rng = np.random.default_rng([seed, 0x9417])
    start = int(rng.integers(lo, hi - n + 1))
    arrivals = (t[start : start + n] - t[start]) * g.arrival_scale
    dur, gp = d[start : start + n].copy(), gpus[start : start + n].copy()
    if g.one_gpu_share is not None:
        part_d, part_g = d[lo:hi], gpus[lo:hi]
        single, multi = np.flatnonzero(part_g == 1), np.flatnonzero(part_g > 1)
        pick_single = rng.random(n) < g.one_gpu_share
        src = np.where(
            pick_single, single[rng.integers(0, len(single), n)], multi[rng.integers(0, len(multi), n)]
        )
        dur, gp = part_d[src], part_g[src]
    dur = np.clip(dur, g.min_duration_s, g.max_duration_s)
    gp = np.minimum(gp, g.max_gpus)
    names = cfg.catalogue.names
    weights = np.array([g.type_mix.get(name, 0.0 if g.type_mix else 1.0) for name in names])
    if weights.sum() <= 0:
        raise ConfigError("gang.type_mix: no weight on any catalogue type")
    types = rng.choice(len(names), size=n, p=weights / weights.sum())
    slot_s = cfg.sim.slot_seconds
    jobs = []
    for i in range(n):
        jt = cfg.catalogue.types[int(types[i])]
        batches = float(dur[i]) / jt.compute_s
        jobs.append(
            JobSpec(i, jt.name, int(arrivals[i] // slot_s), batches, batches, workers=int(gp[i]), ps=0)
        )
    return sort_trace(jobs)
