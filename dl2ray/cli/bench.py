"""``dl2ray bench ...``: benchmarks that print one JSON object (never run as tests).

Results and the commands that produced them are recorded in docs/BENCHMARKS.md.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from dl2ray.config import ExperimentConfig, load_config
from dl2ray.errors import UserError
from dl2ray.evaluation.report import emit
from dl2ray.view import ClusterView, JobView, Observation

app = typer.Typer(no_args_is_help=True, add_completion=False)


@app.command("sim")
def bench_sim(
    config: Annotated[Path, typer.Option("--config", "-c")] = Path("configs/large.yaml"),
    scheduler: str = "drf",
    seed: int = 0,
    repeats: Annotated[int, typer.Option(min=1)] = 3,
    json_out: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Wall seconds and slots/s of one whole trace (median of ``repeats`` runs)."""
    from dl2ray.schedulers.base import make_scheduler
    from dl2ray.sim import run_episode
    from dl2ray.world import build_simulator

    cfg = load_config(config)
    sim = build_simulator(cfg)
    times, slots, jobs = [], 0, 0
    for _ in range(repeats):
        sched = make_scheduler(scheduler, cfg)
        t0 = time.perf_counter()
        result = run_episode(sim, sched, seed)
        times.append(time.perf_counter() - t0)
        slots, jobs = result.slots, len(result.end_time)
    wall = statistics.median(times)
    emit({"bench": "sim", "config": cfg.name, "scheduler": scheduler, "jobs": jobs,
           "slots": slots, "wall_s": round(wall, 4), "slots_per_s": round(slots / wall, 1),
           "repeats": repeats}, json_out)


def synthetic_view(cfg: ExperimentConfig, jobs: int, nodes: int, seed: int) -> ClusterView:
    """A slot of a big cluster: ``nodes`` default nodes, ``jobs`` jobs that each ran
    three slots at (1,1), (1,2) and (2,2) with speeds of the measured model.

    Observations come from the measured speed model, so heuristics that learn from
    history (Optimus) have real fitting work to do.
    """
    from dl2ray.sim import LOSS_FLOOR
    from dl2ray.speed import spread_layout
    from dl2ray.world import speed_model

    rng = np.random.default_rng(seed)
    cat = cfg.catalogue
    speed = speed_model(cfg)
    capacity = np.tile(cfg.cluster.capacity[:1], (nodes, 1))
    capacity.setflags(write=False)
    gap = 1.0 / cfg.sim.convergence_gap - 1.0
    views = []
    for j in range(jobs):
        ti = int(rng.integers(len(cat)))
        jt = cat.types[ti]
        epochs = jt.base_epochs * rng.uniform(0.9, 1.1)
        done, hist = 0.0, []
        for s, (p, w) in enumerate(((1, 1), (1, 2), (2, 2))):
            e = speed.epochs_per_second(ti, spread_layout(w, p)) * cfg.sim.slot_seconds * 0.2
            done += e
            loss = 1.0 / (gap / epochs * done + 1.0) + LOSS_FLOOR
            hist.append(Observation(s, p, w, e, cfg.sim.slot_seconds, loss))
        views.append(JobView(
            job_id=j, job_type=jt.name, type_index=ti, arrival_slot=0, slots_run=3,
            est_epochs=epochs, done_epochs=done, workers=2, ps=2, worker_nodes=(), ps_nodes=(),
            worker_demand=cat.worker_demand[ti], ps_demand=cat.ps_demand[ti],
            max_workers=jt.max_workers, max_ps=jt.max_ps, history=tuple(hist),
        ))
    return ClusterView(3, cfg.sim.slot_seconds, capacity, capacity, tuple(views), cat,
                       cfg.cluster.default_placement)


@app.command("round")
def bench_round(
    scheduler: str = "optimus",
    jobs: Annotated[int, typer.Option(min=1)] = 4000,
    nodes: Annotated[int, typer.Option(min=1)] = 10000,
    config: Annotated[Path | None, typer.Option("--config", "-c")] = None,
    seed: int = 0,
    repeats: Annotated[int, typer.Option(min=1)] = 3,
    json_out: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Seconds for one scheduling decision at scale (median of ``repeats``)."""
    from dl2ray.schedulers.base import make_scheduler

    cfg = load_config(config)
    view = synthetic_view(cfg, jobs, nodes, seed)
    times, tasks = [], 0
    for _ in range(repeats):
        sched = make_scheduler(scheduler, cfg)
        t0 = time.perf_counter()
        alloc = sched.decide(view)
        times.append(time.perf_counter() - t0)
        tasks = sum(t.workers + t.ps for t in alloc.tasks.values())
    if tasks == 0:
        raise UserError("the scheduler allocated nothing; the benchmark would be meaningless")
    emit({"bench": "round", "scheduler": scheduler, "jobs": jobs, "nodes": nodes,
           "tasks_placed": tasks, "seconds": round(statistics.median(times), 4),
           "repeats": repeats}, json_out)


@app.command("decide")
def bench_decide(
    config: Annotated[Path, typer.Option("--config", "-c")] = Path("configs/large.yaml"),
    policy: Annotated[Path | None, typer.Option(help="checkpoint (default: a fresh network)")] = None,
    scheduler: Annotated[str | None, typer.Option(
        help="time this registered scheduler instead of a DL2 policy (e.g. planner)")] = None,
    jobs: Annotated[int, typer.Option(min=1, help="jobs in the view (one window of J by default)")] = 40,
    nodes: Annotated[int | None, typer.Option(
        min=1, help="a generated view of JOBS jobs on NODES nodes of the config's first node kind "
                    "(default: the config's own cluster run with DRF)")] = None,
    placement: Annotated[str, typer.Option(
        help="the placer decided under: own (the scheduler's, as deployed) or a policy name")] = "own",
    sample: Annotated[bool, typer.Option("--sample/--greedy", help="sample, or argmax")] = False,
    compiled: Annotated[bool, typer.Option(
        "--compiled/--step-by-step", help="the compiled loop, or the step-by-step reference")] = True,
    reference: Annotated[bool, typer.Option(
        "--reference", help="a shape policy's reference path (job_features, numpy logits, decide_shapes), "
                            "not the fused one it deploys")] = False,
    seed: int = 0,
    repeats: Annotated[int, typer.Option(min=1)] = 200,
    arch: Annotated[str | None, typer.Option(
        help="paper or shape (default: the checkpoint's, else policy.arch)")] = None,
    gc_freeze: Annotated[bool, typer.Option(
        "--gc-freeze/--no-gc-freeze",
        help="move what exists before the timed runs (config, policy, view, torch) out of Python's "
             "collector, as a server does after start")] = False,
    json_out: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Milliseconds for one whole slot's decision (the DL2 policy's, or ``--scheduler``'s).

    The view: the config's cluster run with DRF until at least ``jobs`` jobs are
    present, cut to the first ``jobs`` of them; with ``--nodes``, a generated view
    (``synthetic_view``: every job ran three slots). The decision runs under the placer a
    deployment gives the scheduler (``--placement own``: a checkpoint's ``meta.placer``).
    Times include everything from the view to the Allocation (features, network, masks,
    placement, the placer's final layout). The first 5 runs (numba loads or compiles in the
    first) are dropped. ``cpu_*_ms``: the process's CPU time for the same runs (what a loaded
    machine does not inflate, unlike the wall-clock ``p50_ms``/``p99_ms``); ``load_avg``: the
    1-minute load average before and after. For the shape architecture ``inferences`` = jobs decided.
    """
    emit(measure_decide(load_config(config), policy, scheduler, jobs, nodes, placement, sample, compiled,
                        reference, seed, repeats, arch, gc_freeze), json_out)


def measure_decide(cfg: ExperimentConfig, policy: Path | None = None, scheduler: str | None = None,
                   jobs: int = 40, nodes: int | None = None, placement: str = "own", sample: bool = False,
                   compiled: bool = True, reference: bool = False, seed: int = 0, repeats: int = 200,
                   arch: str | None = None, gc_freeze: bool = False) -> dict:
    """``bench decide``'s document (its options, its docstring); also for the size sweep of
    ``tests/bench/bench_decide_scale.py``."""
    import gc
    import os

    from dl2ray.policy.shape_net import checkpoint_arch

    if scheduler is not None:
        decide, arch, path = _heuristic_decider(cfg, scheduler, placement), "heuristic", "heuristic"
    else:
        arch = arch or (checkpoint_arch(policy) if policy is not None else cfg.policy.arch)
        if arch not in ("paper", "shape"):
            raise UserError(f"--arch: {arch!r}: known: paper, shape")
        if arch == "shape":
            decide, path = _shape_decider(cfg, policy, seed, placement, reference)
        else:
            decide = _paper_decider(cfg, policy, seed, compiled)
            path = "compiled" if compiled else "step-by-step"
    view = busy_view(cfg, jobs, seed) if nodes is None else synthetic_view(cfg, jobs, nodes, seed)
    rng = np.random.default_rng(seed)
    if gc_freeze:  # a full collection otherwise walks every object of the process (torch's too)
        gc.collect()
        gc.freeze()
    load0 = os.getloadavg()[0]
    times, cpu, steps, tasks = [], [], [], []
    for _ in range(repeats + 5):  # the first few warm caches and are dropped
        t0, c0 = time.perf_counter(), time.process_time()
        alloc, inferences = decide(view, None if not sample else rng)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        steps.append(inferences)
        tasks.append(sum(t.workers + t.ps for t in alloc.tasks.values()))
    ms, cpu_ms = np.array(times[5:]) * 1e3, np.array(cpu[5:]) * 1e3
    per = ms / np.maximum(np.array(steps[5:]), 1)
    return {"bench": "decide", "config": cfg.name, "jobs": jobs, "nodes": view.num_nodes,
            "view": "busy" if nodes is None else "generated", "arch": arch,
            "policy": scheduler or (str(policy) if policy else "fresh"),
            "placement": _placed_as(decide, view), "mode": "sample" if sample else "greedy", "path": path,
            "p50_ms": round(float(np.percentile(ms, 50)), 3),
            "p99_ms": round(float(np.percentile(ms, 99)), 3),
            "cpu_p50_ms": round(float(np.percentile(cpu_ms, 50)), 3),
            "cpu_p99_ms": round(float(np.percentile(cpu_ms, 99)), 3),
            "inferences_p50": float(np.median(steps[5:])), "tasks_p50": float(np.median(tasks[5:])),
            "per_inference_ms_p50": round(float(np.median(per)), 4), "repeats": repeats,
            "gc_frozen": gc_freeze, "load_avg": [round(load0, 2), round(os.getloadavg()[0], 2)]}


def _placed_as(decide, view: ClusterView) -> str:
    """The placer a decider runs under (its ``placement`` attribute), else the view's."""
    return str(getattr(decide, "placement", None) or view.placement)


def _heuristic_decider(cfg, name: str, placement: str):
    """``decide(view, rng) -> (allocation, jobs)`` of a registered scheduler, built as a deployment does."""
    from dl2ray.schedulers.base import make_scheduler

    sched = make_scheduler(name, cfg, placement)

    def decide(view, rng):
        return sched.decide(view), len(view.jobs)

    decide.placement = sched.placement  # type: ignore[attr-defined]
    return decide


def _paper_decider(cfg, policy: Path | None, seed: int, compiled: bool):
    """``decide(view, rng) -> (allocation, inferences)`` of the paper's policy."""
    from dl2ray.policy.decision import decide_slot
    from dl2ray.policy.encoding import Encoding
    from dl2ray.policy.network import NumpyPolicy, build_networks, load_checkpoint

    enc = Encoding.from_config(cfg)
    if policy is None:
        net = build_networks(enc, cfg.policy.hidden, seed)[0]
    else:
        net = load_checkpoint(policy, expect=enc, catalogue=cfg.catalogue.names).policy
    numpy_policy = NumpyPolicy.from_torch(net)

    def decide(view, rng):
        dec = decide_slot(view, numpy_policy, enc, greedy=rng is None, rng=rng, fast=compiled)
        return dec.allocation, dec.inferences

    return decide


def _shape_decider(cfg, policy: Path | None, seed: int, placement: str, reference: bool):
    """``(decide(view, rng) -> (allocation, jobs decided), path)`` of the shape policy: the scheduler a
    deployment builds (``dl2:PATH`` under ``placement``) on its fused path, or (``reference``) the same
    policy through job_features, numpy logits and decide_shapes."""
    import dataclasses

    from dl2ray.policy.shape import ShapeEncoding, job_features
    from dl2ray.policy.shape_decode import decide_shapes
    from dl2ray.policy.shape_net import NumpyShapePolicy, build_shape_policy
    from dl2ray.schedulers.base import make_scheduler
    from dl2ray.schedulers.dl2 import DL2Scheduler
    from dl2ray.schedulers.placed import with_placement

    sched: Any
    if policy is None:
        s = cfg.policy.shape
        fresh = NumpyShapePolicy(build_shape_policy(ShapeEncoding.from_config(cfg), s.embed, s.head, seed))
        sched = with_placement(DL2Scheduler.from_policy(fresh), placement)
    else:
        sched = make_scheduler(f"dl2:{policy}", cfg, placement)  # a Placed wrapper
    inner, placed_as = sched.inner, sched.placement
    enc = inner.enc  # a checkpoint decodes as it says (its placement), as dl2:PATH does

    def decide(view, rng):
        if view.placement != placed_as:
            view = dataclasses.replace(view, placement=placed_as)
        if reference:
            x, g = job_features(view, enc)
            return decide_shapes(view, enc, inner.policy.logits(x, g), rng).allocation, len(view.jobs)
        return inner._fused.decide(view, rng).allocation, len(view.jobs)

    decide.placement = placed_as  # type: ignore[attr-defined]
    return decide, "reference" if reference else "fused"


def busy_view(cfg, jobs: int, seed: int):
    """The config's cluster run with DRF until ``jobs`` jobs are present, cut to the first ``jobs``."""
    from dl2ray.schedulers.drf import DRF
    from dl2ray.world import build_simulator

    sim, drf = build_simulator(cfg), DRF()
    view = sim.reset(seed)
    while len(view.jobs) < jobs and not sim.done:
        view = sim.step(drf.decide(view)).view
    if len(view.jobs) < jobs:
        raise UserError(f"the trace never has {jobs} jobs at once; lower --jobs")
    return ClusterView(view.slot, view.slot_seconds, view.capacity, view.free, view.jobs[:jobs],
                       view.catalogue, view.placement)
