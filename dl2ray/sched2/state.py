"""SCHED²'s state, actions and reward (numpy; no torch), from a gang-mode :class:`ClusterView`.

State (a float32 vector of ``N·M + (k+2)·J + 4`` entries; 184 for 15 × 8 GPUs, J = 10, k = 4):

- **GPU state** ``N × M``: per server, the remaining seconds of the job on each GPU, busiest
  first, free GPUs 0 (SCHED²'s remaining-time matrix; GPUs of a server are interchangeable
  here, so sorting removes an arbitrary order). Remaining = remaining mini-batches ×
  compute_s × λ(servers the job spans) — the profiled time, what SCHED² estimates.
- **the first J waiting jobs by arrival**, each ``k + 2`` numbers: its profiled time at
  ``s_min·{1, 2, 4, 8}`` servers (``s_min`` = fewest servers that hold it, capped at N;
  "from concentrated to scattered"), its GPU count / M and its waiting time. Absent jobs: 0.
- **statistics of the other waiting jobs**: count / J, mean GPUs / M, mean ideal time,
  mean waiting time.

All times are divided by ``time_scale`` seconds (3600) and clipped to [0, 24].

Actions ``0..J-1``: start waiting job ``i`` now, placed by gang packing; action ``J`` is ϕ
(start nothing until the next event). Job ``i`` is allowed when it exists and fits now; ϕ only
while some job runs (ours: otherwise, once the last job has arrived, no event would ever come
and a policy that chose ϕ would hold the cluster idle forever).

Reward of starting job ``j``: its execution effectiveness ``E_j = T_ideal / (T_wait + T_actual)``
(wait so far, actual = ideal × λ at the placement it gets); ϕ earns 0.

Architecture ``jobwise`` (:mod:`dl2ray.sched2.jobwise`) adds two numbers per window job, after
its ``k + 2``: its profiled time at the placement gang packing gives it *now* (``T_ideal ·
λ(s_now)``, 0 if it does not fit now) and ``s_now / s_min`` (how scattered that placement is, 0
if it does not fit). Both follow from the GPU matrix and the job's profile; the paper's
``dense`` network leaves them out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dl2ray.gang.sim import gang_place, locality_factor
from dl2ray.sched2.baselines import Profile
from dl2ray.view import ClusterView, JobPlacement, JobView

K_LEVELS = (1, 2, 4, 8)
"""Multiples of the fewest servers a job needs: its profiled locality levels."""
CLIP = 24.0
ARCHS = ("dense", "jobwise")


@dataclass(frozen=True)
class Sched2Shape:
    """Dimensions of the state and action: N servers, M GPUs each, window J."""

    servers: int
    gpus: int
    window: int = 10
    time_scale: float = 3600.0
    arch: str = "dense"
    """``dense``: the paper's Q-network (:mod:`dl2ray.sched2.qnet`); ``jobwise``: one scorer shared
    by every window job (:mod:`dl2ray.sched2.jobwise`), whose jobs carry two more features."""

    @property
    def job_features(self) -> int:
        """Numbers per window job: ``k + 2``, plus 2 for ``jobwise`` (module docstring)."""
        return len(K_LEVELS) + 2 + (2 if self.arch == "jobwise" else 0)

    @property
    def state_dim(self) -> int:
        return self.servers * self.gpus + self.job_features * self.window + 4

    @property
    def actions(self) -> int:
        return self.window + 1

    @property
    def job_dim(self) -> int:
        return self.job_features * self.window + 4

    @staticmethod
    def from_config(cfg, window: int = 10, arch: str = "dense") -> Sched2Shape:
        if arch not in ARCHS:
            from dl2ray.errors import UserError

            raise UserError(f"sched2: unknown architecture {arch!r} (one of {', '.join(ARCHS)})")
        cap = cfg.cluster.capacity
        return Sched2Shape(int(cap.shape[0]), int(cap[:, 1].max()), window, arch=arch)


def masked_greedy(q: np.ndarray, mask: np.ndarray) -> int:
    """``argmax_a q[a]`` over the allowed actions (``mask`` (J+1,) bool; lowest index on ties)."""
    return int(np.argmax(np.where(mask, q, -np.inf)))


def waiting_jobs(view: ClusterView, started: set[int]) -> list[JobView]:
    """Waiting jobs in arrival order (not running, not started in this decision)."""
    return [j for j in view.jobs if j.workers == 0 and j.job_id not in started]


def encode(
    view: ClusterView,
    shape: Sched2Shape,
    profile: Profile,
    free: np.ndarray,
    busy: list[list[float]],
    waiting: list[JobView],
) -> tuple[np.ndarray, np.ndarray, list[JobPlacement | None]]:
    """``(state (state_dim,), mask (J+1,) bool, placement of each window job or None)``.

    ``busy[n]``: remaining seconds of each busy GPU of server ``n``; ``free`` (N, 3).
    """
    n, m, jw, ts = shape.servers, shape.gpus, shape.window, shape.time_scale
    gpu = np.zeros((n, m), np.float32)
    for i, xs in enumerate(busy[:n]):
        xs = sorted(xs, reverse=True)[:m]
        gpu[i, : len(xs)] = np.minimum(np.asarray(xs) / ts, CLIP)
    jobs = np.zeros((jw, shape.job_features), np.float32)
    k = len(K_LEVELS)
    mask = np.zeros(jw + 1, bool)
    mask[jw] = any(busy)  # ϕ waits for the next event: only allowed when a running job will end
    places: list[JobPlacement | None] = []
    gpus_free = int(np.floor(free[:, 1].sum() + 1e-9))
    slot_s = view.slot_seconds
    for i, j in enumerate(waiting[:jw]):
        g = j.fixed_tasks.workers if j.fixed_tasks else 0
        s_min = max(1, math.ceil(g / m))
        ideal = profile.ideal_s(j)
        beta = profile.beta[j.type_index]
        for lvl, mult in enumerate(K_LEVELS):
            s = min(s_min * mult, n, max(g, 1))
            jobs[i, lvl] = min(ideal * locality_factor(beta, s) / ts, CLIP)
        jobs[i, k] = g / m
        jobs[i, k + 1] = min((view.slot - j.arrival_slot) * slot_s / ts, CLIP)
        pl = gang_place(free, j, view.catalogue, view.placement) if g <= gpus_free else None
        places.append(pl)
        mask[i] = pl is not None
        if pl is not None and shape.arch == "jobwise":
            s_now = len(set(pl.worker_nodes))
            jobs[i, k + 2] = min(ideal * locality_factor(beta, s_now) / ts, CLIP)
            jobs[i, k + 3] = s_now / s_min
    rest = waiting[jw:]
    stats = np.zeros(4, np.float32)
    if rest:
        stats[0] = len(rest) / jw
        stats[1] = np.mean([(j.fixed_tasks.workers if j.fixed_tasks else 0) for j in rest]) / m
        stats[2] = min(np.mean([profile.ideal_s(j) for j in rest]) / ts, CLIP)
        stats[3] = min(np.mean([(view.slot - j.arrival_slot) * slot_s for j in rest]) / ts, CLIP)
    state = np.concatenate([gpu.ravel(), jobs.ravel(), stats]).astype(np.float32)
    return state, mask, places


def effectiveness(view: ClusterView, job: JobView, pl: JobPlacement, profile: Profile) -> float:
    """``T_ideal / (T_wait + T_actual)`` of starting ``job`` now at ``pl`` (the action's reward)."""
    ideal = profile.ideal_s(job)
    actual = profile.actual_s(job, pl)
    wait = (view.slot - job.arrival_slot) * view.slot_seconds
    return float(ideal / max(wait + actual, 1e-9))


def busy_gpus(view: ClusterView, profile: Profile, running: list[JobView]) -> list[list[float]]:
    """Per server, the profiled remaining seconds of each busy GPU (all-reduce workers)."""
    busy: list[list[float]] = [[] for _ in range(view.num_nodes)]
    for j in running:
        left = profile.actual_s(j, JobPlacement(j.worker_nodes, j.ps_nodes))
        for node in j.worker_nodes:
            busy[node].append(left)
    return busy
