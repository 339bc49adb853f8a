"""Gang mode: the non-preemptive, fixed-size sibling of the DL2 simulator (SCHED², Harmony).

Opt-in with a ``gang`` group in the config (:class:`dl2ray.config.GangConfig`);
:func:`dl2ray.world.build_simulator` then builds a :class:`GangSimulator`,
which *is* a :class:`~dl2ray.sim.Simulator` (same ``reset(seed)`` /
``step(allocation)``, same :class:`~dl2ray.view.ClusterView` and
:class:`~dl2ray.view.Allocation`) with these rules on top:

- **fixed size, all or nothing.** Every job has one size
  (``JobView.fixed_tasks``: ``JobSpec.workers``/``ps``; an *all-reduce* job has
  ``ps = 0`` and one GPU per worker). An allocation gives a job exactly that
  size or leaves it out.
- **non-preemptive.** A job that ran in the previous slot must be listed again
  with the same nodes (as a multiset) until it completes.
- **placement.** Without explicit placement, running jobs stay where they are
  and new jobs are placed whole by :func:`gang_place` (all-reduce: the
  SCHED² packing, :func:`gang_packing`; PS jobs: task by task with the
  configured policy, rolled back if the job does not fit).
- **speed.** An all-reduce job of type ``t`` trains ``1 / (compute_s · λ_t(s))``
  mini-batches (= epochs; its catalogue has ``batches_per_epoch: 1``) per second
  on ``s`` servers, with the locality factor
  ``λ_t(s) = 1 + β_t · 2(s−1)/s`` (:func:`locality_factor`, β from
  ``gang.locality``, fitted to SCHED² Fig. 1). A PS job trains at the
  :class:`~dl2ray.speed.SpeedModel` speed of its layout. Both are multiplied by
  the hidden pairwise interference (:func:`pairwise_interference`) and the
  configured variation noise.
- **metrics** (:meth:`GangRunResult.extra_metrics`): waiting time (arrival →
  start), execution time (start → end), execution effectiveness
  ``T_ideal / (T_wait + T_actual)`` and the GPU fragmentation index of SCHED²,
  per server ``1 − (Σ x_i)² / (n · Σ x_i²)`` over the remaining times ``x_i``
  of its ``n`` GPUs (0 for an idle server), averaged over servers and over the
  slots in which any GPU was busy.

The slot loop is the DL2 simulator's (:meth:`~dl2ray.sim.Simulator._progress`); gang mode overrides its
hooks: the slot's draws (pairwise interference, stream noise, no loss noise), which jobs hold resources
and train (listed ones, usage from their placement), training without a scale-change cost, the latest
observation only, and the fragmentation recorded before the slot closes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

import numpy as np

from dl2ray.cluster import make_placer
from dl2ray.config import ExperimentConfig, InterferenceConfig
from dl2ray.sim import AllocationError, RunResult, Simulator, SlotDraws, _Job
from dl2ray.speed import layout_of, stream_variation
from dl2ray.view import Allocation, JobPlacement, JobView, Observation, Tasks
from dl2ray.workload import JobCatalogue, Trace

_EPS = 1e-9


# -- placement ---------------------------------------------------------------------------------


def slots_free(free: np.ndarray, demand: np.ndarray) -> np.ndarray:
    """Shape (N,): how many tasks of ``demand`` (3,) each node's ``free`` (N, 3) still hosts."""
    d = np.asarray(demand, dtype=np.float64)
    ratio = np.where(d > 0, np.floor((free + _EPS) / np.where(d > 0, d, 1.0)), np.inf)
    out = ratio.min(axis=1)
    return np.where(np.isfinite(out), out, 1 << 20).astype(np.int64)


def gang_packing(room: np.ndarray, count: int) -> tuple[int, ...] | None:
    """Nodes for ``count`` tasks given each node's ``room`` (tasks it hosts), SCHED²'s packing.

    The node with the least room that fits all remaining tasks (lowest index on
    ties); if none fits them, all the room of the node with the most room, and
    repeat for the rest. None when the whole cluster has less room than ``count``.
    """
    room = np.asarray(room, dtype=np.int64).copy()
    if count <= 0:
        return ()
    if int(room.sum()) < count:
        return None
    nodes: list[int] = []
    left = count
    while left > 0:
        fits = np.flatnonzero(room >= left)
        if len(fits):
            node = int(fits[np.argmin(room[fits])])
            nodes += [node] * left
            room[node] -= left
            left = 0
        else:
            node = int(np.argmax(room))
            take = int(room[node])
            nodes += [node] * take
            room[node] = 0
            left -= take
    return tuple(sorted(nodes))


def gang_place(free: np.ndarray, job: JobView, catalogue: JobCatalogue, policy: str) -> JobPlacement | None:
    """A placement of the whole of ``job`` (its ``fixed_tasks``) inside ``free`` (N, 3), or None.

    All-reduce jobs (no PS): :func:`gang_packing` over the workers each node
    still hosts. PS jobs: task by task, workers and PS alternating, with
    ``policy``'s placer (load balancing, packing or the Optimus principle).
    """
    size = job.fixed_tasks
    assert size is not None, "gang_place needs a job with fixed_tasks"
    if size.ps == 0:
        nodes = gang_packing(slots_free(free, job.worker_demand), size.workers)
        return None if nodes is None else JobPlacement(nodes, ())
    placer = make_placer(free, free, policy, catalogue)
    for i in range(max(size.workers, size.ps)):
        for role, demand, count in (
            ("worker", job.worker_demand, size.workers),
            ("ps", job.ps_demand, size.ps),
        ):
            if i < count and placer.place(job.job_id, role, demand) is None:
                return None
    pl = (placer.allocation().placement or {})[job.job_id]
    return JobPlacement(tuple(sorted(pl.worker_nodes)), tuple(sorted(pl.ps_nodes)))


def usage_of(capacity: np.ndarray, jobs, placement_of) -> np.ndarray:
    """Shape (N, 3): what ``jobs`` (JobViews) use at ``placement_of(job) -> JobPlacement``."""
    used = np.zeros_like(capacity, dtype=np.float64)
    for j in jobs:
        pl = placement_of(j)
        if pl.worker_nodes:
            np.add.at(used, np.asarray(pl.worker_nodes), j.worker_demand)
        if pl.ps_nodes:
            np.add.at(used, np.asarray(pl.ps_nodes), j.ps_demand)
    return used


def running(view_jobs) -> list[JobView]:
    """The jobs that ran in the previous slot (and so must keep their nodes)."""
    return [j for j in view_jobs if j.workers > 0]


def keep_running(view) -> tuple[dict[int, Tasks], dict[int, JobPlacement], np.ndarray]:
    """Tasks and placement that re-emit every running job of ``view``, and the free capacity left.

    Every gang-mode scheduler starts its decision from this (non-preemption).
    """
    run = running(view.jobs)
    tasks = {j.job_id: Tasks(j.workers, j.ps) for j in run}
    placement = {j.job_id: JobPlacement(j.worker_nodes, j.ps_nodes) for j in run}
    free = view.free - usage_of(view.capacity, run, lambda j: placement[j.job_id])
    return tasks, placement, free


# -- speed ------------------------------------------------------------------------------------


def locality_factor(beta: float, servers: int) -> float:
    """``1 + β·2(s−1)/s``: slowdown of an all-reduce job spanning ``servers`` servers vs one."""
    s = max(int(servers), 1)
    return 1.0 + beta * 2.0 * (s - 1) / s


def pairwise_interference(
    placement: dict[int, JobPlacement], type_of: dict[int, str], cfg: InterferenceConfig
) -> dict[int, float]:
    """Per job: its speed multiplier in (0, 1] under ``cfg`` (see :class:`InterferenceConfig`).

    A task of job ``j`` (type ``t``) on node ``n`` runs at
    ``(1 + Σ_r κ_r u_{t,r} U_{n,r,−j})^(−η)``, where ``U_{n,r,−j}`` sums ``u_{t',r}``
    over the tasks of *other* jobs on ``n``; the job runs at its slowest task.
    Types without a contention vector neither suffer nor cause interference.
    """
    kappa = np.asarray(cfg.kappa, dtype=np.float64)
    if not cfg.contention or not kappa.any():
        return {}
    zero = np.zeros(4)
    u = {j: np.asarray(cfg.contention.get(type_of[j], zero), dtype=np.float64) for j in placement}
    load: dict[int, np.ndarray] = {}
    counts: dict[int, Counter] = {}
    for j, pl in placement.items():
        c = Counter((*pl.worker_nodes, *pl.ps_nodes))
        counts[j] = c
        for node, k in c.items():
            load[node] = load.get(node, zero) + k * u[j]
    out = {}
    for j, c in counts.items():
        if not c:
            continue
        worst = 1.0
        for node, k in c.items():
            foreign = load[node] - k * u[j]
            worst = min(worst, float((1.0 + np.sum(kappa * u[j] * foreign)) ** (-cfg.eta)))
        out[j] = worst
    return out


def fragmentation_index(remaining_by_node: list[list[float]], gpus_per_node: np.ndarray) -> float:
    """SCHED²'s fragmentation: mean over servers of ``1 − (Σx)² / (n·Σx²)``.

    ``remaining_by_node[n]`` lists the remaining seconds of the busy GPUs of
    node ``n`` (its other GPUs are free, ``x = 0``); an idle server counts 0.
    """
    vals = []
    for xs, n in zip(remaining_by_node, gpus_per_node, strict=True):
        if n <= 0:
            continue
        x = np.asarray(xs, dtype=np.float64)
        sq = float(np.sum(x * x))
        vals.append(0.0 if sq <= 0 else 1.0 - float(np.sum(x)) ** 2 / (float(n) * sq))
    return float(np.mean(vals)) if vals else 0.0


# -- the simulator ----------------------------------------------------------------------------


@dataclass
class GangRunResult(RunResult):
    """A :class:`RunResult` with what gang mode measures on top (times in slots).

    ``ideal_seconds[j]``: the job alone at its best locality, no interference
    (all-reduce jobs only); ``fragmentation``: the index per slot in which some
    GPU was busy.
    """

    ideal_seconds: dict[int, float] = field(default_factory=dict)
    fragmentation: list[float] = field(default_factory=list)

    def extra_metrics(self) -> dict[str, float]:
        """``waiting_time``/``execution_time`` (slots, completed jobs), ``effectiveness`` (mean
        ``T_ideal/JCT`` over completed jobs with an ideal time) and ``fragmentation``."""
        nan = float("nan")
        done = list(self.end_time)
        wait = [self.first_run[j] - self.arrival[j] for j in done]
        run = [self.end_time[j] - self.first_run[j] for j in done]
        eff = [
            self.ideal_seconds[j] / max((self.end_time[j] - self.arrival[j]) * self.slot_seconds, _EPS)
            for j in done
            if j in self.ideal_seconds
        ]
        return {
            "waiting_time": float(np.mean(wait)) if wait else nan,
            "execution_time": float(np.mean(run)) if run else nan,
            "effectiveness": float(np.mean(eff)) if eff else nan,
            "fragmentation": float(np.mean(self.fragmentation)) if self.fragmentation else nan,
        }


@dataclass(slots=True)
class GangSlotDraws(SlotDraws):
    """Gang mode's slot factors, plus ``gpu_left``: per node, the remaining seconds (at this slot's speed)
    of the unfinished job of each of its busy GPUs — filled while the jobs train, read by the
    fragmentation index at the end of the slot."""

    gpu_left: list[list[float]] = field(default_factory=list)


class GangSimulator(Simulator):
    """The non-preemptive gang-mode simulator (see the module docstring).

    Without a fixed trace, ``reset(seed)`` draws one with
    :func:`dl2ray.gang.trace.gang_trace` (Philly or synthetic, by ``gang.workload``).
    """

    def __init__(self, cfg: ExperimentConfig, speed, trace=None, record_events: bool = False) -> None:
        if cfg.gang is None:
            raise ValueError("GangSimulator needs a config with a gang group")
        super().__init__(cfg, speed, trace, record_events)
        self.gang = cfg.gang
        self._given_trace = trace
        names = self.catalogue.names
        self._beta = np.array([self.gang.locality.get(n, 0.0) for n in names])
        self._gpus = self.capacity[:, 1]

    def reset(self, seed: int, trace: Trace | None = None):
        from dl2ray.gang.trace import gang_trace

        # The base reset reads the fixed trace; gang mode draws its own when none was given.
        if trace is None:
            trace = self._given_trace if self._given_trace is not None else gang_trace(self.cfg, seed)
        super().reset(seed, trace)
        r = self.result
        self.result = GangRunResult(
            r.slot_seconds,
            r.arrival,
            r.end_time,
            r.first_run,
            r.gpu_util,
            r.cpu_util,
            r.rewards,
            r.slots,
            r.events,
        )
        for spec in self.trace:
            ti = self.catalogue.index(spec.job_type)
            if spec.ps == 0:
                self.result.ideal_seconds[spec.job_id] = spec.true_epochs * self.catalogue.types[ti].compute_s
        return self.view()

    # -- what schedulers see ------------------------------------------------------------------

    def _job_view(self, j: _Job) -> JobView:
        return replace(super()._job_view(j), fixed_tasks=self.size_of(j))

    def size_of(self, j: _Job) -> Tasks:
        if j.spec.workers is None or j.spec.ps is None:
            raise AllocationError(f"job {j.spec.job_id}: gang mode needs JobSpec.workers and .ps")
        return Tasks(j.spec.workers, j.spec.ps)

    # -- validation ---------------------------------------------------------------------------

    def _validate_and_place(self, allocation: Allocation) -> dict[int, JobPlacement]:
        for job_id, t in allocation.tasks.items():
            job = self._check_job(job_id, t)
            if t != self.size_of(job) and t != (0, 0):
                raise AllocationError(
                    f"slot {self.slot}: job {job_id} gets {t.workers} workers / {t.ps} PS; "
                    f"gang mode runs it with exactly {tuple(self.size_of(job))} or not at all"
                )
        placement = super()._validate_and_place(allocation)
        for job_id, job in self.jobs.items():
            if job.workers == 0:
                continue
            pl = placement.get(job_id)
            before = (sorted(job.worker_nodes), sorted(job.ps_nodes))
            if pl is None or (sorted(pl.worker_nodes), sorted(pl.ps_nodes)) != before:
                raise AllocationError(
                    f"slot {self.slot}: job {job_id} is running on {before}; gang mode never "
                    f"preempts, resizes or moves it (got {pl})"
                )
        return placement

    def _place(self, allocation: Allocation) -> dict[int, JobPlacement]:
        """Running jobs stay on their nodes; new ones are placed whole, in the order listed."""
        out: dict[int, JobPlacement] = {}
        free = self.capacity.copy()
        new = []
        for job_id, t in allocation.tasks.items():
            job = self.jobs[job_id]
            if t == (0, 0):
                out[job_id] = JobPlacement((), ())
            elif job.workers > 0:
                out[job_id] = JobPlacement(job.worker_nodes, job.ps_nodes)
                free -= self._usage(job_id, out[job_id])
            else:
                new.append(job_id)
        for job_id in new:
            view = self._job_view(self.jobs[job_id])
            pl = gang_place(free, view, self.catalogue, self.cfg.cluster.default_placement)
            if pl is None:
                raise AllocationError(f"slot {self.slot}: job {job_id}: no room for its whole gang")
            out[job_id] = pl
            free -= self._usage(job_id, pl)
        return out

    def _usage(self, job_id: int, pl: JobPlacement) -> np.ndarray:
        ti = self.jobs[job_id].type_index
        used = np.zeros_like(self.capacity)
        if pl.worker_nodes:
            np.add.at(used, np.asarray(pl.worker_nodes), self._worker_demand[ti])
        if pl.ps_nodes:
            np.add.at(used, np.asarray(pl.ps_nodes), self._ps_demand[ti])
        return used

    # -- progress -----------------------------------------------------------------------------

    def rate(self, job: _Job, pl: JobPlacement) -> float:
        """Epochs per second of ``job`` at ``pl`` without interference or noise (the truth)."""
        if job.spec.ps == 0:
            jt = self.catalogue.types[job.type_index]
            servers = len(set(pl.worker_nodes))
            return 1.0 / (jt.compute_s * locality_factor(self._beta[job.type_index], servers))
        return self.speed.epochs_per_second(job.type_index, layout_of(pl.worker_nodes, pl.ps_nodes))

    # the slot loop is the base simulator's (Simulator._progress); gang mode's differences are its hooks

    def _draw_slot(self, ids: list[int], placement: dict[int, JobPlacement]) -> GangSlotDraws:
        """The hidden pairwise interference of the placed jobs (:func:`pairwise_interference`) and the
        variation noise, one uniform draw per job from ``self.rng`` (:func:`~dl2ray.speed.stream_variation`);
        no loss noise."""
        live = {j: pl for j, pl in placement.items() if pl.worker_nodes or pl.ps_nodes}
        types = {j: self.jobs[j].spec.job_type for j in live}
        interference = pairwise_interference(live, types, self.gang.interference)
        noise = stream_variation(self.rng, self.cfg.speed.variation, len(ids))
        return GangSlotDraws(noise, interference, gpu_left=[[] for _ in range(len(self.capacity))])

    def _deploy(self, job: _Job, t: Tasks, pl: JobPlacement, used: np.ndarray) -> bool:
        """A job left out (``t == (0, 0)``: it is not running, as validation guarantees) holds nothing and
        keeps its empty deployment; any other holds its placement's resources (:meth:`_usage`) and trains."""
        if t == (0, 0):
            return False
        used += self._usage(job.spec.job_id, pl).sum(axis=0)
        job.workers, job.ps = t.workers, t.ps
        job.worker_nodes, job.ps_nodes = pl.worker_nodes, pl.ps_nodes
        return True

    def _train_slot(self, job: _Job, before: tuple, t: Tasks, pl: JobPlacement, draws: SlotDraws,
                    i: int) -> tuple[float, float, float | None]:
        """The whole slot at :meth:`rate` × variation × interference (a gang job never changes its
        deployment, so nothing is lost to one). A job that does not finish lists its remaining seconds at
        this speed once per worker on a GPU in ``draws.gpu_left`` (the fragmentation index's ``x_i``)."""
        assert isinstance(draws, GangSlotDraws)
        slot_s = self.cfg.sim.slot_seconds
        rate = self.rate(job, pl) * draws.variation[i] * draws.interference.get(job.spec.job_id, 1.0)
        epochs = rate * slot_s
        remaining = job.spec.true_epochs - job.done
        if epochs >= remaining - _EPS and rate > 0:
            seconds = remaining / rate
            return remaining, seconds, seconds
        left_s = (remaining - epochs) / rate
        if self._worker_demand[job.type_index][1] > 0:
            for node in pl.worker_nodes:
                draws.gpu_left[node].append(left_s)
        return epochs, slot_s, None

    def _observe(self, job: _Job, t: Tasks, epochs: float, seconds: float, draws: SlotDraws, i: int) -> None:
        """Only the latest observation, with no loss: a gang job runs thousands of slots, and nothing here
        fits curves."""
        job.history = (Observation(self.slot, t.ps, t.workers, epochs, seconds, 0.0),)

    def _end_slot(self, draws: SlotDraws) -> None:
        """The slot's fragmentation index, when some GPU is busy past it."""
        assert isinstance(draws, GangSlotDraws)
        if any(draws.gpu_left):
            assert isinstance(self.result, GangRunResult)
            self.result.fragmentation.append(fragmentation_index(draws.gpu_left, self._gpus))
