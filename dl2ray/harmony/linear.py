"""Logged placements and the linear interference model of ``lif-linear``.

:func:`log_placements` runs schedulers on gang-mode traces and records, for every job that
trained a whole slot: its type, size, how many foreign tasks of each type share its nodes
(mean over its tasks, and the max) and its *slowdown* ``observed speed / isolated speed``
(isolated: the same placement with nobody else on its nodes — what profiling a job alone
gives; observed: what the slot's progress showed).

:func:`fit_linear` fits ``1 − slowdown_j ≈ Σ_{t'} c_{t,t'} · n_{j,t'}`` per type ``t`` by least
squares (``n``: mean foreign tasks of type ``t'`` per task of ``j``), coefficients clipped at 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from dl2ray.speed import spread_layout


@dataclass(frozen=True)
class Logged:
    """Arrays over logged (job, slot) samples: ``type`` (S,), ``size`` (S, 2) workers/PS,
    ``mean_foreign``/``max_foreign`` (S, L), ``layout`` (S, 3) (:func:`layout_features`),
    ``slowdown`` (S,) in (0, 1] (observed / isolated at the same placement), ``speed`` (S,):
    observed / the speed of the same job with every task on a node of its own and no
    interference (what the reward model predicts), and ``features`` (S, F): the reward model's
    input (:func:`dl2ray.harmony.nets.rm_features`; None where not logged)."""

    type: np.ndarray
    size: np.ndarray
    mean_foreign: np.ndarray
    max_foreign: np.ndarray
    layout: np.ndarray
    slowdown: np.ndarray
    speed: np.ndarray
    features: np.ndarray | None = None

    def take(self, idx) -> Logged:
        return Logged(
            self.type[idx], self.size[idx], self.mean_foreign[idx], self.max_foreign[idx], self.layout[idx],
            self.slowdown[idx], self.speed[idx], None if self.features is None else self.features[idx],
        )

    def __len__(self) -> int:
        return len(self.type)


def layout_features(worker_nodes, ps_nodes) -> np.ndarray:
    """Shape (3,): nodes used / tasks, most tasks on one node / tasks, and the fraction of
    worker-PS pairs that share a node."""
    from collections import Counter

    nodes = (*worker_nodes, *ps_nodes)
    n = max(len(nodes), 1)
    wc, pc = Counter(worker_nodes), Counter(ps_nodes)
    pairs = max(len(worker_nodes) * len(ps_nodes), 1)
    same = sum(wc[x] * pc[x] for x in wc)
    return np.array([len(set(nodes)) / n, max(Counter(nodes).values(), default=0) / n, same / pairs])


def log_placements(cfg, schedulers: list[str], seeds: list[int]) -> Logged:
    """Run every scheduler on every seed's trace and log each (job, full slot) sample."""
    from dl2ray.harmony.nets import max_nodes
    from dl2ray.schedulers.base import make_scheduler
    from dl2ray.world import build_simulator

    L, K = len(cfg.catalogue), max_nodes(cfg)
    rows: list[tuple] = []
    for name in schedulers:
        for seed in seeds:
            sim = build_simulator(cfg)
            sched = make_scheduler(name, cfg)
            view = sim.reset(seed)
            if hasattr(sched, "reset"):
                sched.reset(seed)
            while not sim.done:
                alloc = sched.decide(view)
                step = sim.step(alloc)
                rows += _samples(sim, alloc, step, L, K)
                view = step.view
    t = np.array([r[0] for r in rows], np.int64)
    return Logged(
        t,
        np.array([r[1] for r in rows], np.float64).reshape(-1, 2),
        np.array([r[2] for r in rows]).reshape(-1, L),
        np.array([r[3] for r in rows]).reshape(-1, L),
        np.array([r[4] for r in rows]).reshape(-1, 3),
        np.array([r[5] for r in rows], np.float64),
        np.array([r[6] for r in rows], np.float64),
        np.array([r[7] for r in rows], np.float64).reshape(len(rows), -1),
    )


def _samples(sim, alloc, step, L: int, K: int) -> list[tuple]:
    from dl2ray.harmony.nets import rm_features

    placement = alloc.placement or {}
    counts = np.zeros((len(sim.capacity), L))
    jobs = {**sim.jobs, **sim.finished}
    for j, pl in placement.items():
        ti = jobs[j].type_index
        for node in (*pl.worker_nodes, *pl.ps_nodes):
            counts[node, ti] += 1
    out = []
    slot_s = sim.cfg.sim.slot_seconds
    for j, pl in placement.items():
        if j in step.completed or j not in step.epochs:
            continue
        job = jobs[j]
        iso = sim.rate(job, pl)
        if iso <= 0:
            continue
        nodes = (*pl.worker_nodes, *pl.ps_nodes)
        own = np.zeros(L)
        own[job.type_index] = 1
        foreign = []
        for node in nodes:
            mine = sum(1 for x in nodes if x == node)
            foreign.append(counts[node] - mine * own)
        f = np.array(foreign)
        w, p = len(pl.worker_nodes), len(pl.ps_nodes)
        spread = sim.speed.epochs_per_second(job.type_index, spread_layout(w, p))
        observed = step.epochs[j] / slot_s
        out.append(
            (
                job.type_index,
                (w, p),
                f.mean(0),
                f.max(0),
                layout_features(pl.worker_nodes, pl.ps_nodes),
                observed / iso,
                observed / spread,
                rm_features(job.type_index, pl.worker_nodes, pl.ps_nodes, counts, K),
            )
        )
    return out


def fit_linear(data: Logged, L: int) -> np.ndarray:
    """Coefficients ``c`` (L, L) of the linear model (module docstring)."""
    coef = np.zeros((L, L))
    for t in range(L):
        sel = data.type == t
        if sel.sum() < 3:
            continue
        x, y = data.mean_foreign[sel], 1.0 - data.slowdown[sel]
        sol, *_ = np.linalg.lstsq(x, y, rcond=None)
        coef[t] = np.maximum(sol, 0.0)
    return coef


FIT_SCHEDULERS = ["random-place", "lb-place", "tetris-place"]
FIT_TRACES = 3


@lru_cache(maxsize=4)
def _fit(cfg_json: str) -> np.ndarray:
    from dl2ray.config import ExperimentConfig
    from dl2ray.seeds import training

    cfg = ExperimentConfig.model_validate_json(cfg_json)
    data = log_placements(cfg, FIT_SCHEDULERS, training(FIT_TRACES))
    return fit_linear(data, len(cfg.catalogue))


def fitted_coefficients(cfg) -> np.ndarray:
    """``lif-linear``'s coefficients for ``cfg``: fitted on logs of random, LB and Tetris placements
    of the first 3 training traces (cached per process)."""
    return _fit(cfg.model_dump_json())
