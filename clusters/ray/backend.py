"""The live Ray backend: a :class:`~dl2ray.view.ClusterView` from live state, an Allocation as scale calls.

Every job is a host actor (:mod:`clusters.ray.job`) named ``dl2ray-job-<name>``
in the ``dl2ray`` namespace; its PS and workers are member actors with the
job's per-task demand as Ray resources. The backend keeps nothing the cluster
cannot tell it again (a :class:`~clusters.agent.backend.LiveBackend`):

* :meth:`RayBackend.snapshot` reads the alive Ray nodes (capacity: ``CPU``,
  ``GPU``, ``memory`` in GB) and lists the job hosts, each at most every
  ``nodes_ttl_s`` / ``hosts_ttl_s`` seconds (:class:`~clusters.ray.config.Reads`;
  a job submitted through this backend is read at once), then reads the jobs
  without asking their hosts: every host follows the backend's slot clock,
  closes its own slot ``lead_s`` seconds before each slot starts and pushes its
  brief reading to the GCS, and the snapshot reads all readings with one
  multi-get (:mod:`clusters.ray.readings`, where the choice of the GCS is
  argued). A job whose reading for this slot has not arrived keeps its last
  reading (the host's latest, whatever its slot), marked busy, so its members
  still count and nothing is asked of it this slot; its host is then asked
  directly without waiting (``resync_slots``; the answer is read at a later
  snapshot, a host that does not answer makes the listing be read again, so a
  dead one leaves the view). A job never read yet (new, or every job after an
  agent restart) has no last reading, and one whose reading does not continue
  what the backend knows (it missed more than the reading's last observations:
  a backend that did not read for that long) no usable one: its host's
  :meth:`~clusters.ray.job.JobHostImpl.slot_status` (which closes the job's
  previous slot and hands the host the slot clock) is issued with the others'
  and awaited, in one ``ray.wait`` (up to ``view_wait_s``; for a job never read
  as long as it takes, 30 s at most). With
  ``push`` off every host is asked so each slot, waiting ``view_wait_s``.
  Readings and answers are brief (no events; only the observations the backend
  has not read yet, the spec only in a first read); each becomes a typed
  :class:`RayJob`; the view has every arrived, unfinished job with its current
  members and their nodes. A paused job holds one PS (its parameters and
  optimizer state): that PS is subtracted from ``free`` and the job shows 0
  workers and 0 PS. :meth:`RayBackend.view_parts` says what the last snapshot
  spent where and how many readings were in time.
* :meth:`RayBackend.apply` turns the allocation into per-job
  :meth:`~clusters.ray.job.JobHostImpl.scale_to` calls, deltas only:
  scale-downs and pauses first (they free resources; each reply says which
  members the job still holds), then scale-ups and resumes, each new member on
  the allocation's node for it when that node has room, else where the view's
  placement policy puts it (:mod:`clusters.agent.placement`; running members
  never move); a job's increase that fits nowhere is cut to what fits. A job
  busy with an earlier operation is left for the next slot. No host is read
  twice in a slot.

Job ids in the view are ``crc32(name)`` (:func:`~clusters.agent.views.job_id_of`):
stable across agent restarts without any stored counter. Slot ``k`` starts at
``epoch + k · slot_seconds``.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray

from clusters.agent.placement import MemberPlacer, final_target
from clusters.agent.plan import Changes
from clusters.agent.reports import ApplyReport, Nodes, ScaleAction
from clusters.agent.views import job_id_of, live_job_view
from clusters.ray.config import Reads
from clusters.ray.job import JOB_PREFIX, JobHost, host_name
from clusters.ray.messages import TERMINAL, HostStatus, MemberRow, PushedReading, ScaleReply
from clusters.ray.readings import get_readings
from clusters.ray.record import SlotClock, delete_record
from clusters.runtime import NAMESPACE
from dl2ray.errors import UserError
from dl2ray.jobspec import JobSpec, check_spec
from dl2ray.view import Allocation, ClusterView, JobView, Observation, Tasks
from dl2ray.workload import JobCatalogue

GB = float(1 << 30)


def ray_nodes() -> Nodes:
    """The alive Ray nodes, sorted by id: (cpu, gpu, mem GB) of each."""
    alive = sorted((n for n in ray.nodes() if n.get("Alive")), key=lambda n: n["NodeID"])
    cap = np.array([[n["Resources"].get("CPU", 0.0), n["Resources"].get("GPU", 0.0),
                     n["Resources"].get("memory", 0.0) / GB] for n in alive], dtype=np.float64)
    return Nodes([n["NodeID"] for n in alive], cap.reshape(-1, 3))


def list_hosts(known: dict[str, Any] | None = None) -> dict[str, Any]:
    """Job name → host actor handle, for every job host alive in the ``dl2ray`` namespace (one listing; a
    lookup only for names not in ``known``, whose handles are reused)."""
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if a.get("namespace") == NAMESPACE and a["name"].startswith(JOB_PREFIX)]
    known = known or {}
    out = {}
    for n in names:
        job = n[len(JOB_PREFIX):]
        if job in known:
            out[job] = known[job]
            continue
        try:
            out[job] = ray.get_actor(n, namespace=NAMESPACE)
        except ValueError:
            continue  # killed between the listing and the lookup
    return out


@dataclass(frozen=True)
class Member:
    """One member actor of a job: its role (``ps``/``worker``), the node it runs (or is to run) on, and its
    state in the coordinator's eyes (``member``: in the current plan; ``standby``, ``starting``, ...)."""

    role: str
    node: str | None
    state: str


@dataclass
class RayJob:
    """One job as its host reported it at the start of the slot (its ``status()``).

    ``state``: pending → running ⇄ paused → finished | failed | cancelled; ``members``: every member actor
    alive, in the plan or not; ``busy``: a scale operation is running.
    """

    name: str
    state: str
    spec: JobSpec
    submitted_at: float
    epochs_done: float
    members: list[Member]
    history: tuple[Observation, ...]
    busy: bool

    @property
    def job_id(self) -> int:
        return job_id_of(self.name)

    @classmethod
    def from_status(cls, st: HostStatus, known: RayJob | None = None) -> RayJob:
        """From a host's status; a brief one (``history_from`` > 0, or no ``spec``: a pushed reading)
        continues ``known``'s spec and history (``known.history`` must hold ``history_from`` observations)."""
        new = tuple(h.observation() for h in st.history)
        start = st.history_from or 0
        if known is not None and (start > 0 or st.spec is None):
            assert st.history_len is not None
            spec, history = known.spec, (known.history[:start] + new)[: st.history_len]
        else:
            assert st.spec is not None, "a first read carries the spec"
            spec, history = st.spec, new
        return cls(st.name, st.state, spec, st.submitted_at, st.epochs_done, members_of(st.members), history,
                   st.busy)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    def plan(self) -> tuple[int, int]:
        """``(ps, workers)`` of the running plan; (0, 0) unless running."""
        if self.state != "running":
            return 0, 0
        plan = [m for m in self.members if m.state == "member"]
        return sum(m.role == "ps" for m in plan), sum(m.role == "worker" for m in plan)

    def demand(self, role: str) -> np.ndarray:
        """Shape (3,): (cpu, gpu, mem GB) of one task of ``role``."""
        return (self.spec.ps if role == "ps" else self.spec.worker).as_array()


def members_of(rows: tuple[MemberRow, ...]) -> list[Member]:
    return [Member(m.role, m.node, m.state) for m in rows]


class RayBackend:
    """The live backend (module docstring). Needs a connected Ray driver (or runs inside an actor)."""

    def __init__(self, catalogue: JobCatalogue, slot_seconds: float, epoch: float,
                 placement: str = "load_balancing", heartbeat_timeout_s: float = 5.0,
                 register_timeout_s: float = 60.0, apply_wait_s: float | None = None,
                 orphan_timeout_s: float = 120.0, view_wait_s: float | None = None,
                 reads: Reads | None = None) -> None:
        self.catalogue, self.slot_seconds, self.epoch = catalogue, slot_seconds, epoch
        self.placement = placement
        self.heartbeat_timeout_s, self.register_timeout_s = heartbeat_timeout_s, register_timeout_s
        self.orphan_timeout_s = orphan_timeout_s
        self.apply_wait_s = apply_wait_s if apply_wait_s is not None else max(slot_seconds, 1.0)
        self.view_wait_s = view_wait_s if view_wait_s is not None else max(slot_seconds / 2, 1.0)
        self.jobs: dict[str, RayJob] = {}  # as read by the last snapshot (and updated by its apply)
        self._handles: dict[str, Any] = {}  # job → host handle, reused across slots
        self.nodes = Nodes.empty()
        self._pending: dict[str, Any] = {}  # job → ref of a scale call still running
        self._parts: dict[str, float] = {}  # the last snapshot's parts (view_parts)
        self.reads = reads or Reads()
        self.lead_s = min(self.reads.lead_s, slot_seconds / 2)
        self._hosts_at = self._nodes_at = -math.inf  # monotonic times of the last listing and node read
        self._read_at: dict[str, int] = {}  # job → the last slot it had its reading for (pushed or asked)
        self._resync: dict[str, Any] = {}  # job → ref of a direct read issued without waiting (late job)
        self._answered: dict[str, HostStatus] = {}  # job → its host's last status() answer (statuses)

    # ---- the world ------------------------------------------------------------

    def slot_now(self) -> int:
        return max(math.floor((time.time() - self.epoch) / self.slot_seconds), 0)

    def slot_start(self, slot: int) -> float:
        return self.epoch + slot * self.slot_seconds

    def hosts(self, max_age_s: float = 0.0) -> dict[str, Any]:
        """Job name → host handle, listed again unless the last listing is younger than ``max_age_s``."""
        now = time.monotonic()
        if now - self._hosts_at >= max_age_s:
            self._handles = list_hosts(self._handles)
            self._hosts_at = now
        return dict(self._handles)

    def _clock(self) -> SlotClock | None:
        """The slot clock hosts push their readings at (``slot_status``'s ``clock``); None: no pushes."""
        if not self.reads.push:
            return None
        return SlotClock(epoch=self.epoch, slot_seconds=self.slot_seconds, lead_s=self.lead_s)

    def statuses(self, hosts: dict[str, Any] | None = None,
                 timeout_s: float = 30.0) -> dict[str, dict[str, Any]]:
        """Job → its host's ``status()`` now (:meth:`~clusters.ray.messages.HostStatus.to_dict`, the JSON
        of ``dl2ray jobs status``), with ``answering: True``. A listed host that does not answer within
        ``timeout_s`` (ending its members, restarting, a loaded machine) keeps its job in the listing: its
        last answer, with ``answering: False`` (a host never answered yet is left out until it does). A
        host no longer listed (removed) is no job any more."""
        hosts = self.hosts() if hosts is None else hosts
        answers = _gather({name: h.status.remote() for name, h in hosts.items()}, timeout_s)
        for name in list(self._answered):
            if name not in hosts:
                del self._answered[name]
        out = {}
        for name in hosts:
            if name in answers:
                self._answered[name] = answers[name]
                out[name] = {**answers[name].to_dict(), "answering": True}
            elif name in self._answered:
                out[name] = {**self._answered[name].to_dict(), "answering": False}
        return out

    def adopt(self) -> int:
        return sum(1 for st in self.statuses().values() if st["state"] not in TERMINAL)

    def close(self) -> None:
        """Nothing to release: scale calls still running finish in their hosts."""

    # ---- submit / cancel -------------------------------------------------------

    def submit(self, spec: JobSpec) -> dict[str, Any]:
        """Register a job (refused with :class:`UserError` naming the field); returns its first status."""
        check_spec(spec, self.catalogue.names, ray_nodes().capacity)
        if spec.name in self.hosts():
            raise UserError(f"name: a job named {spec.name!r} already exists "
                            f"(dl2ray jobs status {spec.name})")
        delete_record(spec.name)  # a record without a host is stale (a host removed without its record)
        host = JobHost.options(name=host_name(spec.name), namespace=NAMESPACE, lifetime="detached").remote(
            spec.model_dump_json(), job_id_of(spec.name), time.time(), self.heartbeat_timeout_s,
            self.register_timeout_s, self.orphan_timeout_s)
        self._handles[spec.name] = host  # read at the next snapshot, whatever the listing's age
        status: HostStatus = ray.get(host.status.remote())
        return status.to_dict()

    def cancel(self, name: str) -> dict[str, Any]:
        host = self.hosts().get(name)
        if host is None:
            raise UserError(f"no job named {name!r}")
        reply: ScaleReply = ray.get(host.cancel.remote())
        return reply.model_dump(include={"ok", "reason"})

    def remove(self, name: str) -> None:
        """End a job's host actor (after cancel or finish): the job disappears from the cluster."""
        host = self.hosts().get(name)
        if host is not None:
            ray.get(host.cancel.remote())
            ray.kill(host)  # no restart
        self._handles.pop(name, None)
        delete_record(name)

    # ---- the slot ---------------------------------------------------------------

    def snapshot(self) -> ClusterView:
        t0 = time.perf_counter()
        self._forget_returned_calls()
        slot = self.slot_now()
        if time.monotonic() - self._nodes_at >= self.reads.nodes_ttl_s or not self.nodes.names:
            self.nodes = ray_nodes()
            self._nodes_at = time.monotonic()
        t1 = time.perf_counter()
        hosts = self.hosts(self.reads.hosts_ttl_s)
        t2 = time.perf_counter()
        counts: Counter[str] = Counter()
        ages: list[float] = []
        self.jobs = self._read_jobs(slot, hosts, counts, ages)
        t3 = time.perf_counter()
        self._parts = {"view_nodes_ms": (t1 - t0) * 1e3, "view_hosts_ms": (t2 - t1) * 1e3,
                       "view_read_ms": (t3 - t2) * 1e3,
                       **{f"readings_{k}": float(counts[k]) for k in ("pushed", "late", "asked", "resync")}}
        if ages:
            self._parts["reading_age_ms"] = statistics.median(ages)
        index = self.nodes.index()
        free = self.nodes.capacity.copy()
        views = []
        for job in sorted(self.jobs.values(), key=lambda j: j.submitted_at):
            if job.terminal:
                continue
            if job.state == "paused":
                for m in job.members:
                    if m.role == "ps" and m.node in index:
                        free[index[m.node]] -= job.demand("ps")
            views.append(self._job_view(job, index))
        np.maximum(free, 0.0, out=free)
        view = ClusterView(slot, self.slot_seconds, self.nodes.capacity, free, tuple(views), self.catalogue,
                           self.placement)
        self._parts["view_build_ms"] = (time.perf_counter() - t3) * 1e3
        return view

    def view_parts(self) -> dict[str, float]:
        """The last snapshot's parts, milliseconds: ``view_nodes_ms`` (``ray.nodes()``, or nothing within
        ``nodes_ttl_s``), ``view_hosts_ms`` (the host listing, likewise), ``view_read_ms`` (reading the
        jobs), ``view_build_ms`` (the view built from them). Counts of jobs: ``readings_pushed`` (their
        reading for this slot had arrived), ``readings_late`` (it had not: last reading, left alone),
        ``readings_asked`` (read directly and waited for: never read before, no usable reading, or ``push``
        off), ``readings_resync`` (asked without waiting); ``reading_age_ms``: the median age of the
        arrived readings (push to read)."""
        return dict(self._parts)

    def _read_jobs(self, slot: int, hosts: dict[str, Any], counts: Counter[str],
                   ages: list[float]) -> dict[str, RayJob]:
        """Every job's reading for ``slot`` (module docstring): the pushed ones in one GCS read; a job never
        read (or every job, with ``push`` off) asked directly, in one batched wait."""
        answers = self._returned_resyncs()
        if any(st is None for st in answers.values()):
            hosts = self.hosts()  # a host did not answer: listed again, a dead one leaves the view now
        pushed = get_readings([n for n in hosts if n in self.jobs]) if self.reads.push else {}
        asked = {name: self._ask(h, name, slot) for name, h in hosts.items() if self._must_ask(name, pushed)}
        self._await(asked)
        jobs = {}
        now = time.time()
        for name in hosts:
            known = self.jobs.get(name)
            job: RayJob | None
            if name in asked:
                job = self._answer(name, asked[name], known, slot)
                if job is not None:
                    counts["asked" if job is not known else "late"] += 1
            else:
                assert known is not None
                reading = pushed.get(name)
                job, fresh = self._pushed(known, reading, answers.get(name), slot)
                if fresh and reading is not None:
                    counts["pushed"] += 1
                    ages.append((now - reading.pushed_at) * 1e3)
                else:
                    counts["late"] += 1
                    counts["resync"] += self._resync_if_due(name, hosts[name], job, slot)
            if job is not None:
                jobs[name] = job
        return jobs

    def _must_ask(self, name: str, pushed: dict[str, PushedReading]) -> bool:
        """Ask the host and wait: a job never read, one whose reading does not continue what the backend
        knows (it missed more than the readings' last observations, or the host follows another clock),
        every job with ``push`` off."""
        known, reading = self.jobs.get(name), pushed.get(name)
        if known is None or not self.reads.push:
            return True
        return reading is not None and not self._fits(reading, known)

    def _ask(self, host: Any, name: str, slot: int) -> Any:
        known = self.jobs.get(name)
        return host.slot_status.remote(slot, len(known.history) if known else 0, self._clock())

    def _await(self, asked: dict[str, Any]) -> None:
        if asked:
            ray.wait(list(asked.values()), num_returns=len(asked), timeout=self.view_wait_s)
        first = [ref for name, ref in asked.items() if name not in self.jobs]
        if first:  # a job never read has no last reading to stand in: wait for it as long as for a reply
            ray.wait(first, num_returns=len(first), timeout=30.0)

    def _answer(self, name: str, ref: Any, known: RayJob | None, slot: int) -> RayJob | None:
        """A direct read's answer; ``known`` marked busy if it did not come in time; None: no job."""
        if not ray.wait([ref], timeout=0)[0]:
            if known is not None:  # restarting or overloaded: its last reading, left alone this slot
                known.busy = True
            return known
        try:
            job = RayJob.from_status(ray.get(ref), known)
        except ray.exceptions.RayError:
            self._handles.pop(name, None)  # ended: no job any more
            return None
        self._read_at[name] = slot
        return job

    def _pushed(self, known: RayJob, reading: PushedReading | None, answer: HostStatus | None,
                slot: int) -> tuple[RayJob, bool]:
        """``known`` brought up to date by a late direct read's ``answer``, then by the pushed ``reading``
        (the host's latest knowledge, whatever its slot); fresh (True) if the reading is this slot's, else
        busy: left alone this slot."""
        job = known
        if answer is not None:
            job = RayJob.from_status(answer, job)
        if reading is not None and self._fits(reading, job):  # (it may not after the answer)
            job = RayJob.from_status(reading, job)
            if reading.slot >= slot:
                self._read_at[job.name] = slot
                return job, True
        job.busy = True
        return job, False

    def _fits(self, reading: PushedReading, known: RayJob) -> bool:
        """A reading at this backend's slots that continues what it knows of the job's history."""
        return (reading.epoch == self.epoch and reading.slot_seconds == self.slot_seconds
                and (reading.history_from or 0) <= len(known.history))

    def _resync_if_due(self, name: str, host: Any, job: RayJob, slot: int) -> bool:
        """Ask a late job's host directly, without waiting (the answer is read at a later snapshot), once
        its reading has been missing ``resync_slots`` slots; the call also hands it the slot clock again."""
        missing = slot - self._read_at.get(name, slot)
        if job.terminal or name in self._resync or missing < self.reads.resync_slots:
            return False
        self._resync[name] = self._ask(host, name, slot)
        return True

    def _returned_resyncs(self) -> dict[str, HostStatus | None]:
        """The direct reads of late jobs that have returned: job → answer (None: the host did not answer)."""
        out: dict[str, HostStatus | None] = {}
        for name, ref in list(self._resync.items()):
            if not ray.wait([ref], timeout=0)[0]:
                continue
            del self._resync[name]
            try:
                out[name] = ray.get(ref)
            except ray.exceptions.RayError:
                out[name] = None
        return {n: st for n, st in out.items() if n in self.jobs}

    def _job_view(self, job: RayJob, index: dict[str, int]) -> JobView:
        plan = [m for m in job.members if m.state == "member"] if job.state == "running" else []
        nodes = {r: [index.get(m.node or "", 0) for m in plan if m.role == r] for r in ("ps", "worker")}
        arrival = max(int((job.submitted_at - self.epoch) // self.slot_seconds), 0)
        return live_job_view(job.name, job.spec, self.catalogue, arrival, job.epochs_done, nodes["ps"],
                             nodes["worker"], job.history)

    def apply(self, allocation: Allocation) -> ApplyReport:
        """Deltas of ``allocation`` against the last snapshot, as scale calls (module docstring)."""
        report = ApplyReport(self.slot_now())
        changes: Changes[RayJob] = Changes(report)
        for job in self.jobs.values():
            if job.terminal or (job.state == "pending" and job.job_id not in allocation.tasks):
                continue
            t = allocation.tasks.get(job.job_id, Tasks(0, 0))
            target = (t.ps, t.workers) if t.ps > 0 and t.workers > 0 else (0, 0)
            before = job.plan()
            if target == before:
                continue
            changes.add(job, job.name, before, target, busy=job.busy or job.name in self._pending)
        self._run([(a, [], []) for _, a in changes.downs], report)
        if not changes.ups:
            return report
        placer = MemberPlacer(self.nodes.capacity, self._usage(), self.placement, self.catalogue)
        placed = []
        for job, action in changes.ups:
            nodes = self._place(placer, action, job, allocation)
            if nodes is not None:
                placed.append((action, *nodes))
        self._run(placed, report)
        return report

    def _usage(self) -> np.ndarray:
        """Per-node resources held now by every member actor: as the snapshot read them, with each finished
        scale-down's reply in place of its job's members."""
        index = self.nodes.index()
        usage = np.zeros_like(self.nodes.capacity)
        for job in self.jobs.values():
            for m in job.members:
                if m.node in index:
                    usage[index[m.node]] += job.demand(m.role)
        return usage

    def _place(self, placer: MemberPlacer, action: ScaleAction, job: RayJob,
               allocation: Allocation) -> tuple[list[str], list[str]] | None:
        """Nodes for the new members of one job (:mod:`clusters.agent.placement`), the action's target cut
        to what fits; None when the job cannot grow this slot."""
        running = job.state == "running"
        have = {"ps": job.plan()[0], "worker": job.plan()[1]}
        if not running and job.state == "paused":
            have["ps"] = 1  # the PS that kept the job's state
        want = {"ps": action.target[0], "worker": action.target[1]}
        demand = {r: job.demand(r) for r in ("ps", "worker")}
        new = placer.place(job.job_id, have, want, (allocation.placement or {}).get(job.job_id), demand)
        if have["ps"] + len(new.ps) == 0 or have["worker"] + len(new.worker) == 0:
            placer.give_back(new, demand)  # cannot run without both
            return None
        action.target = final_target(have, want, new)
        if action.target == action.before or 0 in action.target:
            return None
        return [self.nodes.names[n] for n in new.ps], [self.nodes.names[n] for n in new.worker]

    def _run(self, todo: list[tuple[ScaleAction, list[str], list[str]]], report: ApplyReport) -> None:
        """Issue the scale calls together, wait up to ``apply_wait_s``; late ones finish in the background."""
        if not todo:
            return
        refs = {}
        hosts = self.hosts()
        for action, ps_nodes, worker_nodes in todo:
            host = hosts.get(action.job)
            if host is None:
                continue
            ps, workers = action.target
            refs[action.job] = (action, host.scale_to.remote(ps, workers, ps_nodes, worker_nodes))
            report.actions.append(action)
        if not refs:
            return
        ray.wait([r for _, r in refs.values()], num_returns=len(refs), timeout=self.apply_wait_s)
        for name, (action, ref) in refs.items():
            ready, _ = ray.wait([ref], timeout=0)
            if not ready:
                self._pending[name] = ref
                action.reason = "in progress"
                continue
            self._finish(action, ref)

    def _finish(self, action: ScaleAction, ref: Any) -> None:
        try:
            res: ScaleReply = ray.get(ref)
        except ray.exceptions.RayError as exc:
            action.ok, action.reason = False, type(exc).__name__
            return
        action.ok, action.reason = res.ok, res.reason
        action.seconds = res.seconds or 0.0
        if res.members is not None and action.job in self.jobs:
            self.jobs[action.job].members = members_of(res.members)

    def _forget_returned_calls(self) -> None:
        """Forget scale calls of earlier slots that have returned (their result is in the job's actions)."""
        for name, ref in list(self._pending.items()):
            if ray.wait([ref], timeout=0)[0]:
                del self._pending[name]


def _gather(refs: dict[str, Any], timeout_s: float = 30.0) -> dict[str, HostStatus]:
    """The hosts' answers, awaited together; one that died or did not answer in ``timeout_s`` is left out."""
    if refs:
        ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
    out = {}
    for name, ref in refs.items():
        if not ray.wait([ref], timeout=0)[0]:
            continue
        try:
            out[name] = ray.get(ref)
        except ray.exceptions.RayError:
            continue
    return out
