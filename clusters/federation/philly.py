"""``dl2ray federation from-philly CSV --vcs N --out FILE``: Philly virtual clusters as member clusters.

For each of the ``N`` virtual clusters with the most jobs (records with
``num_gpus ≥ 1`` and ``duration > 0``, as :func:`~dl2ray.traces.importers.read_philly`
keeps them) one simulated member over ``--base`` (default ``testbed.yaml``),
with these overrides, every one computed from that VC's records alone:

- **size**: ``nodes = clamp(ceil(G / (gpus_per_node · gpu_scale)), min_nodes, max_nodes)``
  where ``G`` is the 90th percentile over the VC's busy time of the GPUs its
  running jobs held (each job holds ``num_gpus`` from submit to submit +
  duration; queueing is not in the trace, so this is demand, a lower bound of
  the VC's size). ``gpu_scale`` shrinks every VC by the same factor so the
  simulated members stay small enough to train on; their sizes keep their order.
- **arrivals**: Poisson with ``rate = n / span_slots / gpu_scale``: the VC's
  jobs per slot over its span, scaled with its size; at least 0.05;
  ``max_per_slot`` is ``ceil(4 × rate)`` (≥ 1).
- **job mix**: job lengths lognormal with ``sigma`` = standard deviation of
  ``ln(duration)`` (clamped to [0.1, 2]), bounds the 5th and 95th duration
  percentiles over the median (clamped to [0.05, 1] and [1, 20]); requested size
  ``requested_bundles`` = the median GPU count (clamped to [1, 8]).

The rest (catalogue, speed, policy) is the base config's, so every member
shares one encoding. The learner reads ``--learner-config`` (default: the base).
Paths in the written file are relative to its folder.
"""

from __future__ import annotations

import math
import os
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from dl2ray.errors import UserError
from dl2ray.traces.csvfile import CsvRecords
from dl2ray.traces.importers import PHILLY_COLUMNS


@dataclass(frozen=True)
class VcStats:
    """One virtual cluster's records, summarised."""

    vc: str
    jobs: int
    gpu_demand_p90: float  # GPUs held by running jobs, 90th percentile over busy time
    span_s: float
    median_gpus: float
    log_duration_std: float
    dur_p05_over_median: float
    dur_p95_over_median: float


def read_vcs(path: str | Path) -> dict[str, list[tuple[float, float, int]]]:
    """``vc -> [(submit_s, duration_s, gpus)]`` of the kept records (read_philly's filter)."""
    csv = CsvRecords(path, PHILLY_COLUMNS)
    out: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
    for line, row in csv:
        submit = csv.datetime_s(line, row, "timestamp")
        duration = csv.number(line, row, "duration")
        gpus = csv.integer(line, row, "num_gpus")
        if gpus >= 1 and duration > 0:
            out[csv.text(line, row, "cluster")].append((submit, duration, gpus))
    return out


def gpu_demand_p90(jobs: list[tuple[float, float, int]]) -> float:
    """90th percentile of the GPUs running jobs hold, over the time at least one runs (exact sweep)."""
    events = sorted([(s, g) for s, _, g in jobs] + [(s + d, -g) for s, d, g in jobs])
    levels, weights = [], []
    held, last = 0, events[0][0]
    for t, delta in events:
        if t > last and held > 0:
            levels.append(held)
            weights.append(t - last)
        held += delta
        last = t
    order = np.argsort(levels)
    lv, wt = np.asarray(levels, dtype=float)[order], np.asarray(weights)[order]
    cum = np.cumsum(wt) / wt.sum()
    return float(lv[np.searchsorted(cum, 0.9)])


def summarise(vc: str, jobs: list[tuple[float, float, int]]) -> VcStats:
    sub = np.array([j[0] for j in jobs])
    dur = np.array([j[1] for j in jobs])
    gpus = np.array([j[2] for j in jobs])
    med = float(np.median(dur))
    return VcStats(vc, len(jobs), gpu_demand_p90(jobs), float(sub.max() - sub.min()), float(np.median(gpus)),
                   float(np.std(np.log(dur))), float(np.percentile(dur, 5) / med),
                   float(np.percentile(dur, 95) / med))


def member_overrides(st: VcStats, slot_seconds: float, gpus_per_node: float, gpu_scale: float,
                     min_nodes: int, max_nodes: int) -> dict:
    """The config groups a VC's member overrides (rules in the module docstring)."""
    nodes = min(max(math.ceil(st.gpu_demand_p90 / (gpus_per_node * gpu_scale)), min_nodes), max_nodes)
    span_slots = max(st.span_s / slot_seconds, 1.0)
    rate = max(st.jobs / span_slots / gpu_scale, 0.05)
    return {
        "cluster": {"nodes": [{"count": nodes, "cpu": 8, "gpu": gpus_per_node, "mem": 48}]},
        "workload": {
            "arrivals": {"pattern": "poisson", "rate": round(rate, 4),
                         "max_per_slot": max(1, math.ceil(4 * rate))},
            "lengths": {"distribution": "lognormal",
                        "sigma": round(min(max(st.log_duration_std, 0.1), 2.0), 4),
                        "low": round(min(max(st.dur_p05_over_median, 0.05), 1.0), 4),
                        "high": round(min(max(st.dur_p95_over_median, 1.0), 20.0), 4)},
            "requested_bundles": int(min(max(round(st.median_gpus), 1), 8)),
        },
    }


def from_philly(csv: Path, vcs: int, out: Path, base: Path, learner_config: Path | None, name: str,
                gpu_scale: float, min_nodes: int, max_nodes: int, extra_members: list[Path],
                runs: Path) -> dict:
    """Write the federation file (the learner's output in ``runs/NAME``); returns it as a dict."""
    from dl2ray.config import load_config

    if vcs < 1:
        raise UserError(f"--vcs: {vcs}: need at least one virtual cluster")
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,39}", name):
        raise UserError(f"--name: {name!r}: lower-case letters, digits and '-', at most 40 characters")
    if max_nodes < min_nodes:
        raise UserError(f"--max-nodes: {max_nodes} is below --min-nodes {min_nodes}")
    if not csv.exists():
        raise UserError(f"{csv}: no such file")
    base_cfg = load_config(base)
    node = base_cfg.cluster.nodes[0]
    by_vc = read_vcs(csv)
    ranked = sorted(by_vc.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    if vcs > len(ranked):
        raise UserError(f"--vcs: {vcs}: the trace has {len(ranked)} virtual clusters with jobs")
    folder = out.resolve().parent

    def rel(p: Path) -> str:
        return os.path.relpath(p.resolve(), folder)

    members: list[dict[str, Any]] = []
    for vc, jobs in ranked[:vcs]:
        st = summarise(vc, jobs)
        members.append({
            "name": f"philly-{vc.lower()}",
            "backend": {"kind": "sim", "config": rel(base),
                        "overrides": member_overrides(st, base_cfg.sim.slot_seconds, node.gpu, gpu_scale,
                                                      min_nodes, max_nodes)},
            "mode": "learn",
            "source": {"vc": vc, "jobs": st.jobs, "gpu_demand_p90": st.gpu_demand_p90,
                       "median_gpus": st.median_gpus, "span_days": round(st.span_s / 86400, 2)},
        })
    for extra in extra_members:
        load_config(extra)
        members.append({"name": extra.stem.lower().replace("_", "-"),
                        "backend": {"kind": "sim", "config": rel(extra)}, "mode": "learn"})
    doc = {"name": name,
           "learner": {"config": rel(learner_config or base), "out": rel(runs / name)},
           "members": members}
    # "source" documents where a member came from; the loader accepts only the schema's fields
    sources = [{"name": m["name"], **m.pop("source")} for m in members if "source" in m]
    header = (f"# Written by `dl2ray federation from-philly {csv} --vcs {vcs}` (gpu scale {gpu_scale}):\n"
              f"# the {vcs} Philly virtual clusters with the most jobs" +
              (f", plus {', '.join(e.name for e in extra_members)}" if extra_members else "") + ".\n")
    notes = "".join(f"#   {s['name']}: {s['jobs']} jobs, p90 GPU demand {s['gpu_demand_p90']:.0f}, "
                    f"median {s['median_gpus']:g} GPUs, {s['span_days']} days\n" for s in sources)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(header + notes + yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    except OSError as exc:
        raise UserError(f"--out: {out}: cannot write: {exc.strerror or exc}") from None
    return doc
