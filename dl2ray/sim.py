"""The time-slotted cluster simulator: ``reset(seed)`` / ``step(allocation)``.

Each slot: the scheduler sees a :class:`~dl2ray.view.ClusterView` of the
arrived, uncompleted jobs; its :class:`~dl2ray.view.Allocation` is validated
(caps, capacity, placement) and placed; every job with at least one worker
and one PS trains for the slot at the speed of :class:`~dl2ray.speed.SpeedModel`
(times variation and interference noise, from the simulator's own RNG) minus
the suspension its deployment change costs; a job whose true epochs are
reached completes at a fractional time inside the slot. Then the clock moves
on and the slot's arrivals join.

Reward (the DL2 paper's): ``r_t = Σ_j epochs_j(t) / E_j`` with ``E_j`` the
job's declared (estimated) epochs — what a live cluster knows.

Training loss (what Optimus fits): job ``j`` reports after ``k`` epochs
``l(k) = 1 / (b0·k + 1) + b_inf`` with ``b0 = (1/δ - 1) / true_epochs``, so
its loss gap reaches ``δ`` (``sim.convergence_gap``) of the initial gap exactly
when it completes; reported values carry multiplicative noise
``1 + N(0, sim.loss_noise)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from dl2ray.cluster import make_placer
from dl2ray.config import ExperimentConfig
from dl2ray.errors import UserError
from dl2ray.speed import (
    SpeedModel,
    colocation_factor,
    deviation_divisor,
    job_factors,
    layout_of,
    variation_factors,
)
from dl2ray.view import Allocation, ClusterView, JobPlacement, JobView, Observation, Tasks
from dl2ray.workload import JobSpec, Trace

_EPS = 1e-9
LOSS_FLOOR = 0.1


class AllocationError(UserError, ValueError):
    """An allocation breaks a cap, a capacity or the job set; names the job and node."""


@dataclass(slots=True)
class _Job:
    spec: JobSpec
    type_index: int
    done: float = 0.0
    slots_run: int = 0
    workers: int = 0
    ps: int = 0
    worker_nodes: tuple[int, ...] = ()
    ps_nodes: tuple[int, ...] = ()
    history: tuple[Observation, ...] = ()
    first_run_slot: int | None = None
    end_time: float | None = None  # slots, fractional
    factors: tuple[float, float] | None = None  # compute and communication time factors (job deviation)


_IDLE = Tasks(0, 0)
_NOWHERE = JobPlacement((), ())


@dataclass(slots=True)
class SlotDraws:
    """What one slot's training depends on beyond the jobs, fixed before any job trains; arrays are indexed
    by the job's position in ``Simulator.jobs`` (arrival order), length J.

    ``variation``: shape (J,), speed multipliers; ``interference``: job id → speed multiplier in (0, 1]
    (a job not listed: 1); ``loss``: shape (J,), relative noise of the reported loss (None: the
    simulator reports no loss, gang mode).
    """

    variation: np.ndarray
    interference: dict[int, float]
    loss: np.ndarray | None = None


@dataclass(frozen=True)
class SimSnapshot:
    """A :class:`Simulator`'s mutable state at one moment (see :meth:`Simulator.snapshot`)."""

    rng_state: dict
    pending: tuple[JobSpec, ...]
    jobs: dict[int, _Job]
    finished: dict[int, _Job]
    slot: int
    result: tuple


@dataclass(frozen=True)
class StepResult:
    """What one ``step`` returns: the next view, the slot's reward, whether the run ended."""

    view: ClusterView
    reward: float
    done: bool
    completed: tuple[int, ...]
    epochs: dict[int, float] = field(default_factory=dict)


@dataclass
class RunResult:
    """Everything measured over one run; see :mod:`dl2ray.evaluation.metrics` for summaries.

    Times are in slots (fractional); ``gpu_util``/``cpu_util`` are per slot
    fractions of cluster capacity held by allocated tasks.
    """

    slot_seconds: float
    arrival: dict[int, int]
    end_time: dict[int, float]
    first_run: dict[int, int]
    gpu_util: list[float]
    cpu_util: list[float]
    rewards: list[float]
    slots: int
    events: list[dict] = field(default_factory=list)

    @property
    def jct(self) -> dict[int, float]:
        """Job completion time in slots, for completed jobs."""
        return {j: self.end_time[j] - self.arrival[j] for j in self.end_time}


class Simulator:
    """A deterministic, trace-driven cluster (see the module docstring).

    ``trace`` fixes the jobs; without one, every ``reset(seed)`` generates a
    trace from ``cfg.workload`` with that seed. The seed also drives speed
    variation, interference and loss noise.
    """

    def __init__(
        self,
        cfg: ExperimentConfig,
        speed: SpeedModel,
        trace: Trace | None = None,
        record_events: bool = False,
    ) -> None:
        self.cfg = cfg
        self.catalogue = cfg.catalogue
        self.speed = speed
        self.capacity = cfg.cluster.capacity
        self._fixed_trace = trace
        self.record_events = record_events
        self._worker_demand = self.catalogue.worker_demand
        self._ps_demand = self.catalogue.ps_demand
        for arr in (self._worker_demand, self._ps_demand):
            arr.setflags(write=False)
        self._b0_scale = 1.0 / cfg.sim.convergence_gap - 1.0

    # -- episode ------------------------------------------------------------------------

    def reset(self, seed: int, trace: Trace | None = None) -> ClusterView:
        """Start a run; returns the view of slot 0. ``trace``: replay it (with ``seed``'s noise and per-job
        factors) instead of the simulator's fixed trace or the one ``seed`` generates."""
        self.rng = np.random.default_rng([seed, 0x5EED])
        self._seed = seed
        if trace is None and self._fixed_trace is not None:
            trace = self._fixed_trace
        elif trace is None:
            from dl2ray.traces.generate import generate_trace

            trace = generate_trace(self.cfg, seed)
        self.trace: Trace = trace
        self._pending = list(reversed(trace))  # pop() yields the next arrival
        self.jobs: dict[int, _Job] = {}
        self.finished: dict[int, _Job] = {}
        self.slot = 0
        self.result = RunResult(
            self.cfg.sim.slot_seconds, {j.job_id: j.arrival_slot for j in trace}, {}, {},
            [], [], [], 0,
        )
        self._admit()
        return self.view()

    @property
    def done(self) -> bool:
        return (not self.jobs and not self._pending) or self.slot >= self.cfg.sim.max_slots

    def view(self) -> ClusterView:
        jobs = tuple(self._job_view(j) for j in self.jobs.values())
        return ClusterView(
            slot=self.slot,
            slot_seconds=self.cfg.sim.slot_seconds,
            capacity=self.capacity,
            free=self.capacity,
            jobs=jobs,
            catalogue=self.catalogue,
            placement=self.cfg.cluster.default_placement,
        )

    def step(self, allocation: Allocation) -> StepResult:
        """Apply one slot's allocation; raises AllocationError naming job/node."""
        if self.done:
            raise RuntimeError("step() after the run ended; call reset()")
        placement = self._validate_and_place(allocation)
        epochs, completed, reward = self._progress(allocation, placement)
        self.result.rewards.append(reward)
        self.slot += 1
        self.result.slots = self.slot
        self._admit()
        return StepResult(self.view(), reward, self.done, tuple(completed), epochs)

    def snapshot(self) -> SimSnapshot:
        """Everything a later :meth:`restore` needs to rerun the current slot from here.

        The simulator is deterministic given its state and generator, so a learner
        can try several allocations for the same slot (restore, step, restore, …)
        and compare their outcomes on common random numbers.
        """
        r = self.result
        return SimSnapshot(
            dict(self.rng.bit_generator.state), tuple(self._pending),
            {k: replace(j) for k, j in self.jobs.items()}, dict(self.finished), self.slot,
            (dict(r.end_time), dict(r.first_run), list(r.gpu_util), list(r.cpu_util),
             list(r.rewards), r.slots, len(r.events)),
        )

    def restore(self, snap: SimSnapshot) -> None:
        """Return to the state :meth:`snapshot` saw (the snapshot stays reusable)."""
        self.rng.bit_generator.state = snap.rng_state
        self._pending = list(snap.pending)
        self.jobs = {k: replace(j) for k, j in snap.jobs.items()}
        self.finished = dict(snap.finished)
        self.slot = snap.slot
        r = self.result
        end, first, gpu, cpu, rewards, slots, events = snap.result
        r.end_time, r.first_run = dict(end), dict(first)
        r.gpu_util, r.cpu_util, r.rewards = list(gpu), list(cpu), list(rewards)
        r.slots = slots
        del r.events[events:]

    # -- internals ----------------------------------------------------------------------

    def _admit(self) -> None:
        while self._pending and self._pending[-1].arrival_slot <= self.slot:
            spec = self._pending.pop()
            d = self.cfg.speed.job_deviation
            factors = job_factors(self._seed, spec.job_id, d) if d > 0 else None
            self.jobs[spec.job_id] = _Job(spec, self.catalogue.index(spec.job_type), factors=factors)

    def _job_view(self, j: _Job) -> JobView:
        jt = self.catalogue.types[j.type_index]
        return JobView(
            job_id=j.spec.job_id,
            job_type=jt.name,
            type_index=j.type_index,
            arrival_slot=j.spec.arrival_slot,
            slots_run=j.slots_run,
            est_epochs=j.spec.est_epochs,
            done_epochs=j.done,
            workers=j.workers,
            ps=j.ps,
            worker_nodes=j.worker_nodes,
            ps_nodes=j.ps_nodes,
            worker_demand=self._worker_demand[j.type_index],
            ps_demand=self._ps_demand[j.type_index],
            max_workers=jt.max_workers,
            max_ps=jt.max_ps,
            history=j.history,
            requested_bundles=(j.spec.requested_bundles
                               or self.cfg.workload.requested_bundles),
            queue=j.spec.queue,
            priority=j.spec.priority,
        )

    def _check_job(self, job_id: int, t: Tasks) -> _Job:
        job = self.jobs.get(job_id)
        if job is None:
            state = "completed" if job_id in self.finished else "not arrived or unknown"
            raise AllocationError(f"slot {self.slot}: job {job_id} is {state}")
        jt = self.catalogue.types[job.type_index]
        if t.workers > jt.max_workers or t.ps > jt.max_ps:
            raise AllocationError(
                f"slot {self.slot}: job {job_id} ({jt.name}) gets {t.workers} workers / "
                f"{t.ps} PS, caps are {jt.max_workers} / {jt.max_ps}"
            )
        return job

    def _validate_and_place(self, allocation: Allocation) -> dict[int, JobPlacement]:
        for job_id, t in allocation.tasks.items():
            self._check_job(job_id, t)
        if allocation.placement is None:
            return self._place(allocation)
        placement = dict(allocation.placement)
        n = self.capacity.shape[0]
        usage = np.zeros_like(self.capacity)
        for job_id, t in allocation.tasks.items():
            pl = placement.get(job_id, JobPlacement((), ()))
            if len(pl.worker_nodes) != t.workers or len(pl.ps_nodes) != t.ps:
                raise AllocationError(
                    f"slot {self.slot}: job {job_id}: placement lists {len(pl.worker_nodes)} "
                    f"workers / {len(pl.ps_nodes)} PS for {t.workers} / {t.ps} tasks"
                )
            bad = [x for x in (*pl.worker_nodes, *pl.ps_nodes) if not 0 <= x < n]
            if bad:
                raise AllocationError(f"slot {self.slot}: job {job_id}: no node {bad[0]}")
            ti = self.jobs[job_id].type_index
            if pl.worker_nodes:
                np.add.at(usage, np.asarray(pl.worker_nodes), self._worker_demand[ti])
            if pl.ps_nodes:
                np.add.at(usage, np.asarray(pl.ps_nodes), self._ps_demand[ti])
        over = np.argwhere(usage > self.capacity + _EPS)
        if len(over):
            node, res = (int(x) for x in over[0])
            names = ("cpu", "gpu", "mem")
            jobs_on = sorted(
                j for j, pl in placement.items() if node in (*pl.worker_nodes, *pl.ps_nodes)
            )
            raise AllocationError(
                f"slot {self.slot}: node {node} over {names[res]} capacity "
                f"({usage[node, res]:g} > {self.capacity[node, res]:g}); jobs there: {jobs_on}"
            )
        return {j: placement.get(j, JobPlacement((), ())) for j in allocation.tasks}

    def _place(self, allocation: Allocation) -> dict[int, JobPlacement]:
        """Place counts-only allocations with the configured policy, bundle by bundle."""
        placer = make_placer(
            self.capacity, self.capacity, self.cfg.cluster.default_placement, self.catalogue
        )
        for job_id, t in allocation.tasks.items():
            ti = self.jobs[job_id].type_index
            wd, pd = self._worker_demand[ti], self._ps_demand[ti]
            for i in range(max(t.workers, t.ps)):
                for role, demand, count in (("worker", wd, t.workers), ("ps", pd, t.ps)):
                    if i < count and placer.place(job_id, role, demand) is None:
                        raise AllocationError(
                            f"slot {self.slot}: job {job_id}: no node can host its "
                            f"{role} #{i + 1} ({self.cfg.cluster.default_placement} placement)"
                        )
        placed = placer.allocation().placement or {}
        return {j: placed.get(j, JobPlacement((), ())) for j in allocation.tasks}

    def _interference(self, placement: dict[int, JobPlacement]) -> dict[int, float]:
        """Per placed job: ``1 - s·o``, ``o`` the largest dominant share of one of its nodes that other
        jobs' tasks hold (:func:`dl2ray.speed.colocation_factor`); empty when ``speed.interference`` is 0."""
        s = self.cfg.speed.interference
        if s <= 0:
            return {}
        n = self.capacity.shape[0]
        ids: list[int] = []
        job_of: list[int] = []
        node_of: list[int] = []
        demand: list[np.ndarray] = []
        for j, pl in placement.items():
            ti = self.jobs[j].type_index
            k = len(ids)
            ids.append(j)
            wd, pd = self._worker_demand[ti], self._ps_demand[ti]
            for task_nodes, task_dem in ((pl.worker_nodes, wd), (pl.ps_nodes, pd)):
                job_of += [k] * len(task_nodes)
                node_of += task_nodes
                demand += [task_dem] * len(task_nodes)
        if not node_of:
            return {}
        jobs, nodes, dem = np.asarray(job_of), np.asarray(node_of), np.asarray(demand)
        total = np.zeros((n, 3))
        np.add.at(total, nodes, dem)
        pairs, at = np.unique(jobs * n + nodes, return_inverse=True)  # (job, node) with tasks there
        own = np.zeros((len(pairs), 3))
        np.add.at(own, at.ravel(), dem)
        pair_node = pairs % n
        inv = np.divide(1.0, self.capacity, out=np.zeros_like(self.capacity), where=self.capacity > 0)
        others = ((total[pair_node] - own) * inv[pair_node]).max(axis=1)
        worst = np.zeros(len(ids))
        np.maximum.at(worst, pairs // n, others)
        placed = np.zeros(len(ids), dtype=bool)
        placed[pairs // n] = True
        return {j: colocation_factor(float(worst[k]), s) for k, j in enumerate(ids) if placed[k]}

    def _progress(
        self, allocation: Allocation, placement: dict[int, JobPlacement]
    ) -> tuple[dict[int, float], list[int], float]:
        """Train every job for one slot: ``(epochs per job that trained, completed jobs, reward)``.

        The one slot loop of both simulators. Per job, in arrival order: account its use and record its
        deployment (:meth:`_deploy`, which says whether it trains), train it (:meth:`_train_slot`), count
        its slot, finish it inside the slot when its true epochs are reached, add its epochs and reward,
        keep what it observed (:meth:`_observe`) and log the event; then :meth:`_end_slot` and
        :meth:`_close_slot`. What differs in gang mode (:class:`dl2ray.gang.sim.GangSimulator`) lives in those
        hooks and in :meth:`_draw_slot`, which draws the slot's noise before any job trains.
        """
        slot_s = self.cfg.sim.slot_seconds
        ids = list(self.jobs)
        draws = self._draw_slot(ids, placement)
        used = np.zeros(3)
        epochs_by_job: dict[int, float] = {}
        completed: list[int] = []
        reward = 0.0
        for i, job_id in enumerate(ids):
            job = self.jobs[job_id]
            t = allocation.tasks.get(job_id, _IDLE)
            pl = placement.get(job_id, _NOWHERE)
            before = (job.workers, job.ps, job.worker_nodes, job.ps_nodes)
            if not self._deploy(job, t, pl, used):
                continue
            epochs, seconds, finish = self._train_slot(job, before, t, pl, draws, i)
            if job.first_run_slot is None:
                job.first_run_slot = self.slot
                self.result.first_run[job_id] = self.slot
            job.slots_run += 1
            if finish is not None:
                job.end_time = self.slot + finish / slot_s
                completed.append(job_id)
            job.done += epochs
            epochs_by_job[job_id] = epochs
            reward += epochs / job.spec.est_epochs
            self._observe(job, t, epochs, seconds, draws, i)
            self._record_event(job_id, t, epochs, seconds, finish is not None)
        self._end_slot(draws)
        self._close_slot(used, completed)
        return epochs_by_job, completed, reward

    # -- the slot loop's hooks (gang mode overrides them) -------------------------------------

    def _draw_slot(self, ids: list[int], placement: dict[int, JobPlacement]) -> SlotDraws:
        """The slot's factors for jobs ``ids`` (``self.jobs`` in order) under ``placement``: the hashed
        speed variation (:func:`~dl2ray.speed.variation_factors`), the co-location interference
        (:meth:`_interference`) and the loss noise, one normal draw per job from ``self.rng``."""
        interference = self._interference(placement)
        noise = variation_factors(self._seed, np.asarray(ids, dtype=np.int64), self.slot,
                                  self.cfg.speed.variation)
        loss_noise = self.rng.normal(0.0, self.cfg.sim.loss_noise, size=len(ids))
        return SlotDraws(noise, interference, loss_noise)

    def _deploy(self, job: _Job, t: Tasks, pl: JobPlacement, used: np.ndarray) -> bool:
        """Add what ``job`` holds this slot to ``used`` (cpu, gpu, mem; in place), record ``t``/``pl`` as its
        deployment, and say whether it trains: here every job is recorded (0 tasks when left out), its
        usage is its task counts times the demands, and it trains with at least one worker and one PS."""
        used += t.workers * self._worker_demand[job.type_index]
        used += t.ps * self._ps_demand[job.type_index]
        job.workers, job.ps = t.workers, t.ps
        job.worker_nodes, job.ps_nodes = pl.worker_nodes, pl.ps_nodes
        return t.workers > 0 and t.ps > 0

    def _train_slot(self, job: _Job, before: tuple, t: Tasks, pl: JobPlacement, draws: SlotDraws,
                    i: int) -> tuple[float, float, float | None]:
        """``(epochs, training seconds, finish)`` of ``job`` (job ``i`` of the slot) trained this slot at
        ``t``/``pl``; ``finish``: the second of the slot at which it completes, or None. ``before``: its
        previous ``(workers, ps, worker_nodes, ps_nodes)``; ``job.slots_run`` still counts the slots before
        this one and ``job.done`` the epochs before it. Here: the speed of :meth:`_rate` times variation
        and interference, minus the cost of its deployment change (:meth:`_change`, :func:`_train`)."""
        change = self._change(job, before, t)
        scale = draws.variation[i] * draws.interference.get(job.spec.job_id, 1.0)
        rate = self._rate(job, pl.worker_nodes, pl.ps_nodes) * scale
        old_rate = self._rate(job, before[2], before[3]) * scale if change.ramp > 0 else 0.0
        return _train(self.cfg.sim.slot_seconds, change, old_rate, rate, job.spec.true_epochs - job.done)

    def _observe(self, job: _Job, t: Tasks, epochs: float, seconds: float, draws: SlotDraws, i: int) -> None:
        """Keep what ``job`` (job ``i`` of the slot, ``job.done`` already counting this slot's ``epochs``)
        observed: here its whole history grows by one :class:`~dl2ray.view.Observation` whose loss is
        :meth:`_loss` times ``1 + draws.loss[i]``."""
        loss_noise = draws.loss
        assert loss_noise is not None, "the DL2 simulator draws loss noise every slot"
        job.history = (
            *job.history,
            Observation(self.slot, t.ps, t.workers, epochs, seconds, self._loss(job) * (1.0 + loss_noise[i])),
        )

    def _end_slot(self, draws: SlotDraws) -> None:
        """After every job trained, before :meth:`_close_slot`: nothing here (gang mode records its
        fragmentation)."""

    def _record_event(self, job_id: int, t: Tasks, epochs: float, seconds: float, completed: bool) -> None:
        """One job's slot in the event log (:func:`write_events`), when events are recorded."""
        if self.record_events:
            self.result.events.append({"slot": self.slot, "job_id": job_id, "workers": t.workers, "ps": t.ps,
                                       "epochs": epochs, "seconds": seconds, "completed": completed})

    def _close_slot(self, used: np.ndarray, completed: list[int]) -> None:
        """The slot's utilisation (``used``: cpu, gpu, mem held) and the completed jobs moved to ``finished``
        (both simulators end a slot so)."""
        cap = self.capacity.sum(axis=0)
        self.result.cpu_util.append(float(used[0] / cap[0]))
        self.result.gpu_util.append(float(used[1] / cap[1]) if cap[1] > 0 else 0.0)
        for job_id in completed:
            job = self.jobs.pop(job_id)
            self.finished[job_id] = job
            assert job.end_time is not None
            self.result.end_time[job_id] = job.end_time

    def _rate(self, job: _Job, worker_nodes: tuple[int, ...], ps_nodes: tuple[int, ...]) -> float:
        """Epochs/s of ``job`` on this layout before noise: its type's speed over its own factors."""
        layout = layout_of(worker_nodes, ps_nodes)
        rate = self.speed.epochs_per_second(job.type_index, layout)
        if job.factors is not None:
            rate /= deviation_divisor(self.speed.compute_fraction(job.type_index, layout), job.factors)
        return rate

    def _change(self, job: _Job, before: tuple, now: Tasks) -> Change:
        """What ``job`` pays this slot for moving from ``before`` (its previous workers, PS and nodes) to
        ``now`` under ``sim.change_cost`` (:class:`Change`)."""
        sim = self.cfg.sim
        if sim.change_cost == "none":
            return Change()
        slot_s = sim.slot_seconds
        was_running = before[0] > 0 and before[1] > 0
        changed = job.slots_run > 0 and (now.workers, now.ps) != (before[0], before[1])
        if sim.change_cost == "checkpoint_restart":
            lost = sim.checkpoint_restart_s if changed else 0.0
            return Change(lost=min(lost + (0.0 if was_running else sim.task_start_s), slot_s))
        if not was_running:  # hot: first start or resume, every task starts
            return Change(lost=min(sim.task_start_s + (sim.hot_scaling_s if changed else 0.0), slot_s))
        if not changed:
            return Change()
        grows = now.workers > before[0] or now.ps > before[1]
        ramp = min(sim.task_start_s, slot_s) if grows else 0.0
        return Change(lost=min(sim.hot_scaling_s, slot_s - ramp), ramp=ramp)

    def _loss(self, job: _Job) -> float:
        b0 = self._b0_scale / job.spec.true_epochs
        return 1.0 / (b0 * job.done + 1.0) + LOSS_FLOOR


@dataclass(frozen=True, slots=True)
class Change:
    """A job's cost of its deployment change in one slot (seconds): ``ramp`` seconds at its previous
    deployment's speed while new tasks start (hot scale-up), then ``lost`` seconds of no training (the
    hot-scaling suspension, a restart, or tasks starting from nothing), then the new deployment."""

    lost: float = 0.0
    ramp: float = 0.0


def _train(slot_s: float, change: Change, old_rate: float, rate: float,
           remaining: float) -> tuple[float, float, float | None]:
    """``(epochs, training seconds, finish)`` of one job in one slot: ``change.ramp`` seconds at
    ``old_rate``, ``change.lost`` idle, the rest at ``rate`` (epochs/s); ``finish`` is the second of the
    slot at which ``remaining`` epochs are done, or None when they are not."""
    ramp_epochs = old_rate * change.ramp
    if change.ramp > 0 and ramp_epochs >= remaining - _EPS and old_rate > 0:
        seconds = remaining / old_rate
        return remaining, seconds, seconds
    available = slot_s - change.lost - change.ramp
    epochs = rate * available
    left = remaining - ramp_epochs
    if epochs >= left - _EPS and rate > 0:
        seconds = left / rate
        return remaining, change.ramp + seconds, change.ramp + change.lost + seconds
    return ramp_epochs + epochs, change.ramp + available, None


def run_episode(sim: Simulator, scheduler, seed: int) -> RunResult:
    """Reset, then decide/step until every job completed (or ``max_slots``)."""
    view = sim.reset(seed)
    if hasattr(scheduler, "reset"):
        scheduler.reset(seed)
    while not sim.done:
        view = sim.step(scheduler.decide(view)).view
    return sim.result


def write_events(path: str, result: RunResult) -> None:
    """Per-slot, per-job event log as Parquet (columns of :class:`RunResult.events`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols = ["slot", "job_id", "workers", "ps", "epochs", "seconds", "completed"]
    table = pa.table({c: [e[c] for e in result.events] for c in cols})
    pq.write_table(table, path)
