"""Shared clusters (issue 40): every scheduler inside the queue layer, against each queue alone on its quota.

For each ``--schedulers`` entry, on the same traces (seeds ``--seed ..``) of a config with ``tenancy:``:

- **shared** — the whole trace on the whole cluster, the scheduler inside the queue layer
  (:mod:`dl2ray.schedulers.queued`): per queue the metrics of :mod:`dl2ray.evaluation.tenancy` (average
  JCT, queueing delay, quota use, borrowed share, violations of a borrowing limit, reclaim latency, shrinks
  and pauses), and the slots run;
- **static partition** — each queue's jobs alone (same ids, arrivals, lengths and noise seed) on a cluster of
  the nodes its nominal quota buys (``min_r floor(nominal_r / node_r)``; homogeneous nodes), the same
  scheduler, no queue layer: the **sharing incentive** of a queue is its shared average JCT over this one
  (≤ 1: sharing did not hurt it), paired per trace, mean ± 95 % half-width.

    .venv/bin/python tests/bench/bench_tenancy.py --config configs/testbed-shared.yaml --seed 2000000 \\
        --traces 5 --schedulers drf,fifo,srtf,tetris,optimus,planner,dl2:models/dl2-testbed.pt

``--alone-queue Q --nodes 13,20,26``: instead, queue Q's jobs alone on clusters of those node counts (no queue
layer), each scheduler: does it gain from more nodes? (a scheduler that loses with more nodes cannot have
a sharing incentive when it borrows; docs/notebook/2026-11-28.md, "Shared clusters").

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from json_out import print_json

from dl2ray.config import ExperimentConfig, load_config
from dl2ray.errors import UserError
from dl2ray.evaluation.metrics import censored_avg_jct, mean_ci95
from dl2ray.evaluation.tenancy import QUEUE_METRICS, queue_metrics
from dl2ray.schedulers.base import make_scheduler
from dl2ray.sim import run_episode
from dl2ray.traces.generate import generate_trace
from dl2ray.workload import Trace
from dl2ray.world import build_simulator


def partition(cfg: ExperimentConfig, queue: str) -> ExperimentConfig:
    """``cfg`` with the nodes queue ``queue``'s nominal quota buys and no tenancy (one node type only)."""
    groups = cfg.cluster.nodes
    if len(groups) != 1:
        raise UserError("cluster.nodes: a static partition needs one node type")
    node = np.array([groups[0].cpu, groups[0].gpu, groups[0].mem])
    nominal = cfg.tenancy.queue(queue).nominal.as_array()  # type: ignore[union-attr]
    count = int(min(np.floor(nominal[r] / node[r] + 1e-9) for r in range(3) if node[r] > 0))
    if count < 1:
        raise UserError(f"tenancy.queues: {queue}'s quota buys no whole node")
    # validated anew, not model_copy'd: ClusterConfig caches its capacity, which a copy would keep
    cluster = type(cfg.cluster).model_validate({**cfg.cluster.model_dump(),
                                                "nodes": [{**groups[0].model_dump(), "count": count}]})
    return cfg.model_copy(update={"cluster": cluster, "tenancy": None})


def merged_trace(files: dict[str, str], cfg: ExperimentConfig) -> Trace:
    """The jobs of every ``queue -> Parquet trace`` file in one trace
    (:func:`dl2ray.traces.merge.merge_queues`: a Philly VC's segment per queue)."""
    from dl2ray.traces.merge import merge_queues
    from dl2ray.traces.parquet import read_trace

    return merge_queues({q: read_trace(f, cfg.catalogue) for q, f in files.items()})


def run(config: str, schedulers: list[str], seeds: list[int], files: dict[str, str] | None = None) -> dict:
    cfg = load_config(config)
    if cfg.tenancy is None:
        raise UserError(f"{config}: has no tenancy: group (docs/tenancy.md)")
    fixed = None
    if files:
        unknown = sorted(set(files) - set(cfg.tenancy.names))
        if unknown:
            raise UserError(f"--trace-queue: {unknown} are not queues of {config} "
                            f"({list(cfg.tenancy.names)})")
        fixed = merged_trace(files, cfg)
    t0 = time.perf_counter()
    rows = []
    for name in schedulers:
        shared: dict[str, list[dict[str, float]]] = {q: [] for q in cfg.tenancy.names}
        alone: dict[str, list[float]] = {q: [] for q in cfg.tenancy.names}
        slots, overall = 0, []
        for seed in seeds:
            trace = fixed if fixed is not None else generate_trace(cfg, seed)
            scheduler = make_scheduler(name, cfg)
            result = run_episode(build_simulator(cfg, trace), scheduler, seed)
            slots += result.slots
            overall.append(censored_avg_jct(result))
            queues = {j.job_id: j.queue or cfg.tenancy.queues[0].name for j in trace}
            per = queue_metrics(result, queues, scheduler.log, cfg.tenancy, cfg.cluster.capacity)
            for q in cfg.tenancy.names:
                shared[q].append(per[q])
                mine = tuple(j for j in trace if queues[j.job_id] == q)
                if not mine:
                    alone[q].append(float("nan"))
                    continue
                part = partition(cfg, q)
                res = run_episode(build_simulator(part, mine), make_scheduler(name, part), seed)
                alone[q].append(censored_avg_jct(res))
        queues_out = {}
        for q in cfg.tenancy.names:
            agg = {k: mean_ci95([r[k] for r in shared[q]]) for k in QUEUE_METRICS}
            ratio = [s["avg_jct"] / a for s, a in zip(shared[q], alone[q], strict=True)
                     if a == a and s["avg_jct"] == s["avg_jct"]]
            queues_out[q] = {**{k: {"mean": m, "ci95": h} for k, (m, h) in agg.items()},
                             "static_partition_avg_jct": dict(zip(("mean", "ci95"), mean_ci95(alone[q]),
                                                                  strict=True)),
                             "sharing_incentive": dict(zip(("mean", "ci95"), mean_ci95(ratio), strict=True))}
        m, h = mean_ci95(overall)
        rows.append({"scheduler": name, "avg_jct": {"mean": m, "ci95": h}, "slots": slots,
                     "violations": sum(r["violations"] for q in shared for r in shared[q]),
                     "queues": queues_out})
        print(f"[bench_tenancy] {name}: done ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    return {"bench": "tenancy", "config": cfg.name, "seeds": seeds, "traces": files or None, "results": rows,
            "wall_s": round(time.perf_counter() - t0, 1)}


def sized(cfg: ExperimentConfig, queue: str, count: int) -> ExperimentConfig:
    """:func:`partition` of ``queue`` with ``count`` nodes instead of the ones its quota buys."""
    part = partition(cfg, queue)
    group = part.cluster.nodes[0]
    cluster = type(part.cluster).model_validate({**part.cluster.model_dump(),
                                                 "nodes": [{**group.model_dump(), "count": count}]})
    return part.model_copy(update={"cluster": cluster})


def run_alone(config: str, schedulers: list[str], seeds: list[int], files: dict[str, str], queue: str,
              counts: list[int]) -> dict:
    """``queue``'s jobs alone on clusters of ``counts`` nodes: avg JCT per scheduler, size and seed."""
    cfg = load_config(config)
    if cfg.tenancy is None or queue not in cfg.tenancy.names:
        raise UserError(f"--alone-queue: {queue!r} is not a queue of {config}")
    trace = merged_trace(files, cfg) if files else generate_trace(cfg, seeds[0])
    mine = tuple(j for j in trace if (j.queue or cfg.tenancy.queues[0].name) == queue)
    t0 = time.perf_counter()
    rows = []
    for name in schedulers:
        for count in counts:
            part = sized(cfg, queue, count)
            jct = [censored_avg_jct(run_episode(build_simulator(part, mine), make_scheduler(name, part),
                                                seed)) for seed in seeds]
            rows.append({"scheduler": name, "nodes": count, "avg_jct": jct})
    return {"bench": "tenancy-alone", "config": cfg.name, "queue": queue, "seeds": seeds, "results": rows,
            "wall_s": round(time.perf_counter() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", "-c", default="configs/testbed-shared.yaml")
    p.add_argument("--schedulers", default="drf,fifo,srtf,tetris,optimus,planner")
    p.add_argument("--seed", type=int, default=2_000_000, help="first trace seed (validation: 2000000)")
    p.add_argument("--traces", type=int, default=5, help="traces (with --trace-queue: noise seeds)")
    p.add_argument("--trace-queue", action="append", default=[], metavar="QUEUE=FILE",
                   help="a Parquet trace whose jobs all arrive in QUEUE (repeat; not generated traces)")
    p.add_argument("--alone-queue", metavar="QUEUE",
                   help="run QUEUE's jobs alone on --nodes clusters instead")
    p.add_argument("--nodes", default="", help="with --alone-queue: node counts, comma-separated")
    a = p.parse_args(argv)
    if a.traces < 1:
        p.error("--traces must be >= 1")
    files = dict(x.split("=", 1) for x in a.trace_queue if "=" in x)
    if len(files) != len(a.trace_queue):
        p.error("--trace-queue: QUEUE=FILE")
    schedulers = [s.strip() for s in a.schedulers.split(",") if s.strip()]
    seeds = list(range(a.seed, a.seed + a.traces))
    if a.alone_queue:
        try:
            counts = [int(x) for x in a.nodes.split(",") if x.strip()]
        except ValueError:
            p.error(f"--nodes: {a.nodes!r}: node counts, comma-separated")
        if not counts or min(counts) < 1:
            p.error("--nodes: give one or more node counts >= 1 with --alone-queue")
        return print_json(p, lambda: run_alone(a.config, schedulers, seeds, files, a.alone_queue, counts))
    return print_json(p, lambda: run(a.config, schedulers, seeds, files))


if __name__ == "__main__":
    raise SystemExit(main())
