"""How the Kubernetes backend applies an allocation: per job, deltas only, converging pods and the
coordinator's plan on the target.

* **Scale-up**: create the missing member pods (lowest free index, pinned by
  node affinity to the allocation's node when it has room, else where the
  view's placement policy puts them; :mod:`clusters.agent.placement`), wait
  until they are Ready, then ``ElasticJob.scale``.
* **Scale-down** (and pause = 1 PS, 0 workers; also ``suspend: true``):
  ``ElasticJob.scale`` first, then wait for the released members to exit and
  delete their pods, so no training step is lost.
* A job's first allocation creates its coordinator pod and Service, then its
  members, and waits until the coordinator's first plan runs; a start an
  earlier slot (or agent) left half done is resumed from the coordinator's
  command line.
* Applying the same allocation twice changes nothing (no writes); spare
  member pods an unfinished operation left standby are deleted.
* Each job it changed gets its status (ready counts, phase, conditions) and
  one Event for the change at once (:meth:`StatusWriter.applied
  <clusters.k8s.status.StatusWriter.applied>`: ``Started``, ``Scaled``,
  ``Paused``, ``Suspended``, ``Resumed``, or the Warning ``ScaleFailed``).

Jobs are converged in parallel (``parallel_jobs``); their waits on pods share
one pod listing per period (:class:`PodPoll`).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from concurrent.futures import Executor
from typing import Any

from clusters.agent.placement import MemberPlacer, final_target
from clusters.agent.plan import PAUSED_PS, Changes, bounded
from clusters.agent.reports import ApplyReport, ScaleAction
from clusters.k8s import objects as ko
from clusters.k8s.api import ApiGiveUp, KubeApi
from clusters.k8s.config import K8sSettings
from clusters.k8s.status import StatusWriter
from clusters.k8s.world import (
    TERMINAL_JOBS,
    TERMINAL_PODS,
    Coordinators,
    JobState,
    World,
    node_usage,
    pod_phase,
    pod_ready,
)
from dl2ray.view import Allocation, Tasks
from dl2ray.workload import JobCatalogue
from elastic_mxnet.job import ScaleRefused
from elastic_mxnet.protocol.messages import StatusReply

log = logging.getLogger(__name__)


class PodPoll:
    """The namespace's dl2ray pods, listed at most once per ``period_s`` however many jobs wait on them.

    The jobs of one apply wait in parallel (pods Ready, released pods ended); sharing one listing
    keeps that at one API call per period instead of one per job.
    """

    def __init__(self, api: KubeApi, period_s: float = 0.2) -> None:
        self.api, self.period_s = api, period_s
        self._lock = threading.Lock()
        self._at = -math.inf
        self._items: list[dict] = []

    def pods(self, job: str) -> list[dict]:
        with self._lock:
            if time.monotonic() - self._at >= self.period_s:
                self._items = self.api.pods()
                self._at = time.monotonic()
            items = self._items
        return [p for p in items if p["metadata"]["labels"][ko.LABEL_JOB] == job]


class Reconciler:
    """Applies allocations to the cluster (module docstring); ``placement``: the view's placement policy;
    ``status``: where each change is reported (status and Event)."""

    def __init__(self, api: KubeApi, settings: K8sSettings, catalogue: JobCatalogue, placement: str,
                 coordinators: Coordinators, pool: Executor, status: StatusWriter) -> None:
        self.api, self.cfg, self.catalogue, self.placement = api, settings, catalogue, placement
        self.coordinators, self._pool, self.status = coordinators, pool, status
        self.world = World.empty(settings.pods.coordinator_port)
        self._poll = PodPoll(api)

    def _coordinator_status(self, js: JobState) -> StatusReply | None:
        addr = self.world.address(js)
        return None if addr is None else self.coordinators.status(addr)

    def _ended_silently(self, js: JobState) -> bool:
        """True when the job's coordinator did not answer the snapshot's status because it has just
        exited (the job finished between the pod list and the question): its pod is read again. A
        coordinator still Ready is asked once more (a busy moment), and stays an error if it is silent
        again (:meth:`_converge`)."""
        if js.coordinator is None or js.coord is not None or not pod_ready(js.coordinator):
            return False
        js.coord = self._coordinator_status(js)
        if js.coord is not None:
            return False
        name = js.coordinator["metadata"]["name"]
        try:
            fresh = [p for p in self.api.pods(js.name) if p["metadata"]["name"] == name]
        except ApiGiveUp:
            return False  # unknown: _converge reports the silent coordinator
        if fresh and not pod_ready(fresh[0]):
            log.info("%s: the coordinator has exited (%s); its end is read next slot", js.name,
                     pod_phase(fresh[0]))
            return True
        return False

    def apply(self, world: World, allocation: Allocation, slot: int) -> ApplyReport:
        """Converge every job of ``world`` on ``allocation`` (module docstring); scale-downs before
        scale-ups. ``world.usage`` is kept up to date with what starts."""
        self.world = world
        report = ApplyReport(slot)
        self._poll = PodPoll(self.api)
        changes: Changes[JobState] = Changes(report)
        for js in self.world.jobs.values():
            if js.spec is None or js.phase in TERMINAL_JOBS or self._ended_silently(js):
                continue
            target = self._target(js, allocation.tasks.get(js.job_id, Tasks(0, 0)))
            before = js.plan()
            self._desired(js, target)
            if target == before and js.coordinator is not None:
                self._trim(js, target, report)
                continue
            if target == (0, 0) and js.coordinator is None:
                continue
            busy = js.coord is not None and js.coord.operation is not None
            changes.add(js, js.name, before, target, busy)
        self._run(changes.downs, allocation, report)
        if changes.downs and changes.ups:  # what the scale-downs freed is room for the scale-ups
            self.world.usage = node_usage(self.world.nodes, self.api.all_pods())
        self._run(changes.ups, allocation, report)
        return report

    def _target(self, js: JobState, t: Tasks) -> tuple[int, int]:
        """``(ps, workers)`` the job should run with: within its bounds; a job allocated nothing (or
        suspended) keeps one PS and no worker once it has started, and nothing before."""
        spec = js.spec
        assert spec is not None
        started = js.coordinator is not None
        if js.suspend or t.workers <= 0 or t.ps <= 0:
            return (PAUSED_PS, 0) if started else (0, 0)
        return bounded(t.ps, t.workers, spec)

    def _desired(self, js: JobState, target: tuple[int, int]) -> None:
        st = js.status
        want = {
            "ps": {**st.get("ps", {}), "desired": target[0]},
            "workers": {**st.get("workers", {}), "desired": target[1]},
        }
        if want["ps"] != st.get("ps") or want["workers"] != st.get("workers"):
            st.update(want)
            self.api.patch_status(js.name, want)

    def _run(
        self, todo: list[tuple[JobState, ScaleAction]], allocation: Allocation, report: ApplyReport
    ) -> None:
        if not todo:
            return
        placer = MemberPlacer(self.world.nodes.capacity, self.world.usage, self.placement, self.catalogue)
        placed = []
        for js, action in todo:
            nodes = self._place(placer, js, action, allocation)
            if nodes is not None:
                placed.append((js, action, nodes))
        results = self._pool.map(lambda item: self._converge(*item), placed)
        for (js, action, _nodes), err in zip(placed, results, strict=True):
            report.actions.append(action)
            if err:
                report.errors.append(f"{action.job}: {err}")
            try:
                self.status.applied(js, action, report.slot)
            except ApiGiveUp as exc:  # the change is made; its report waits for the next slot's status
                log.warning("%s: reporting the change: %s", action.job, exc)
                report.errors.append(f"{action.job}: status: {exc}")

    def _place(
        self, placer: MemberPlacer, js: JobState, action: ScaleAction, allocation: Allocation
    ) -> dict[str, list[str | None]] | None:
        """Nodes for the new pods of one job (:mod:`clusters.agent.placement`: the allocation's when they
        have room), charged to the world's usage; the target cut to what fits (None: nothing to start)."""
        spec = js.spec
        assert spec is not None
        have = {"ps": len(js.live("ps")), "worker": len(js.live("worker"))}
        want = {"ps": action.target[0], "worker": action.target[1]}
        demand = {r: (spec.ps if r == "ps" else spec.worker).as_array() for r in ko.ROLES}
        new = placer.place(js.job_id, have, want, (allocation.placement or {}).get(js.job_id), demand)
        final = final_target(have, want, new)
        if js.coordinator is None:
            useless = final[0] < 1 or final[1] < 1  # a job starts with at least one PS and one worker
        else:
            useless = final == action.before or final[0] < 1
        if useless:
            placer.give_back(new, demand)  # cannot start: give the room back
            return None
        action.target = final
        names = self.world.nodes.names
        return {r: [names[n] for n in new.of(r)] for r in ko.ROLES}

    def _converge(self, js: JobState, action: ScaleAction, nodes: dict[str, list[str | None]]) -> str | None:
        """Bring one job to ``action.target``; an error string (also in ``action.reason``) or None."""
        t0 = time.monotonic()
        try:
            started = js.coord is not None and js.coord.started
            if js.coordinator is not None and js.coord is None and pod_ready(js.coordinator):
                raise TimeoutError(f"the coordinator of {js.name} does not answer")
            if started:
                self._scale(js, action, nodes)
            else:  # not started, or a start an earlier slot (or agent) left half done
                self._start(js, action, nodes)
        except (ApiGiveUp, TimeoutError, ScaleRefused, OSError) as exc:
            action.ok, action.reason = False, f"{type(exc).__name__}: {exc}"
        action.seconds = time.monotonic() - t0
        if action.ok is None:
            action.ok = True
        return None if action.ok else action.reason

    def _common(self) -> dict[str, Any]:
        p = self.cfg.pods
        return {"image": self.cfg.image, "pull": self.cfg.image_pull_policy, "python": p.python}

    def _start(self, js: JobState, action: ScaleAction, nodes: dict[str, list[str | None]]) -> None:
        """First start: Service and coordinator pod; once it is Ready, the members; then wait until the
        coordinator's first plan runs."""
        spec = js.spec
        assert spec is not None
        if (
            js.coordinator is not None
        ):  # resume a start: the first plan's size is in the coordinator's command
            cmd = js.coordinator["spec"]["containers"][0]["command"]
            action.target = (int(cmd[cmd.index("--ps") + 1]), int(cmd[cmd.index("--workers") + 1]))
            for role, want in zip(ko.ROLES, action.target, strict=True):
                missing = max(want - len(js.live(role)), 0)
                nodes[role] = ([*nodes[role], *[None] * missing])[:missing]
        ps, workers = action.target
        p = self.cfg.pods
        pod, svc = ko.coordinator_objects(
            js.obj,
            spec,
            ps,
            workers,
            port=p.coordinator_port,
            heartbeat_timeout_s=p.heartbeat_timeout_s,
            register_timeout_s=p.register_timeout_s,
            node=nodes["ps"][0] if nodes["ps"] else None,  # beside the first PS
            **self._common(),
        )
        if not js.service:
            self.api.create(svc)
        if js.coordinator is None and self.api.create(pod):
            action.created.append(pod["metadata"]["name"])
        coord = self._wait_ready(js.name, [pod["metadata"]["name"]])[pod["metadata"]["name"]]
        js.coordinator = coord
        first = len(action.created)
        self._create_members(js, action, nodes)
        self._wait_ready(js.name, action.created[first:])
        deadline = time.monotonic() + p.register_timeout_s
        while time.monotonic() < deadline:
            if self._first_plan_ran(js, pod["metadata"]["name"]):
                action.reason = "started"
                return
            time.sleep(0.2)
        raise TimeoutError(f"the coordinator of {js.name} did not start its first plan")

    def _first_plan_ran(self, js: JobState, coordinator: str) -> bool:
        """Whether the coordinator got past its first plan (``StatusReply.started``), or its pod already
        Succeeded (a short job can train to its end between two polls, and its coordinator exits then).
        TimeoutError when the coordinator's pod failed."""
        st = self._coordinator_status(js)
        if st is not None:
            return st.started
        pods = {p["metadata"]["name"]: p for p in self._poll.pods(js.name)}
        phase = pod_phase(pods[coordinator]) if coordinator in pods else None
        if phase == "Failed":
            raise TimeoutError(f"the coordinator of {js.name} failed before its first plan")
        return phase == "Succeeded"

    def _create_members(self, js: JobState, action: ScaleAction, nodes: dict[str, list[str | None]]) -> None:
        spec = js.spec
        assert spec is not None
        for role in ko.ROLES:
            taken = set(js.members[role])
            index = 0
            for node in nodes[role]:
                while index in taken:
                    index += 1
                pod = ko.member_pod(js.obj, spec, role, index, node, **self._common())
                self.api.create(pod)  # False: it exists (a lost answer's retry); it is ours by name
                action.created.append(pod["metadata"]["name"])
                taken.add(index)
                js.members[role][index] = pod

    def _wait_ready(self, job: str, names: list[str]) -> dict[str, dict]:
        """Wait until every pod in ``names`` is Ready; TimeoutError if one failed or time ran out."""
        deadline = time.monotonic() + self.cfg.pods.ready_timeout_s
        while True:
            pods = {p["metadata"]["name"]: p for p in self._poll.pods(job)}
            failed = [n for n in names if n in pods and pod_phase(pods[n]) in TERMINAL_PODS]
            if failed:
                raise TimeoutError(f"pods ended before they were Ready: {failed}")
            if all(n in pods and pod_ready(pods[n]) for n in names):
                return {n: pods[n] for n in names}
            if time.monotonic() > deadline:
                missing = [n for n in names if n not in pods or not pod_ready(pods[n])]
                raise TimeoutError(f"pods not Ready within {self.cfg.pods.ready_timeout_s:g} s: {missing}")
            time.sleep(0.2)

    def _scale(self, js: JobState, action: ScaleAction, nodes: dict[str, list[str | None]]) -> None:
        """Scale-up: create pods, wait Ready, then scale. Scale-down: scale, then delete released pods."""
        ps, workers = action.target
        self._create_members(js, action, nodes)
        if action.created:
            self._wait_ready(js.name, action.created)
        addr = self.world.address(js)
        assert addr is not None
        try:
            reply = self.coordinators.scale(addr, ps, workers, self.cfg.pods.register_timeout_s + 60)
        except ScaleRefused:
            for name in action.created:  # the coordinator took none of them: no spare pods left behind
                self.api.delete("Pod", name)
                action.deleted.append(name)
            raise
        action.reason = reply.reason or "scaled"
        self._release(js, action)

    def _release(self, js: JobState, action: ScaleAction) -> None:
        """After a scale-down the removed members exit on their own: delete their pods once they have."""
        target = {"ps": action.target[0], "worker": action.target[1]}
        deadline = time.monotonic() + self.cfg.pods.release_timeout_s
        while True:
            pods = self._poll.pods(js.name)
            live = Counter(
                p["metadata"]["labels"][ko.LABEL_ROLE] for p in pods if pod_phase(p) not in TERMINAL_PODS
            )
            done = [
                p
                for p in pods
                if pod_phase(p) in TERMINAL_PODS and p["metadata"]["labels"][ko.LABEL_ROLE] in ko.ROLES
            ]
            for p in done:
                if self.api.delete("Pod", p["metadata"]["name"]):
                    action.deleted.append(p["metadata"]["name"])
            if all(live[r] <= target[r] for r in ko.ROLES) or time.monotonic() > deadline:
                return
            time.sleep(0.2)

    def _trim(self, js: JobState, target: tuple[int, int], report: ApplyReport) -> None:
        """At the target already: delete member pods beyond it that the coordinator left standby (spares of
        an operation that did not finish, e.g. before an agent restart). Reads only when there are none."""
        if js.coord is None or js.coord.operation is not None:
            return
        standby: Counter[str] = Counter(m.role for m in js.coord.members if m.state == "standby")
        for role, want in zip(ko.ROLES, target, strict=True):
            ready = sorted(i for i, p in js.live(role).items() if pod_ready(p))
            extra = min(len(js.live(role)) - want, standby[role])
            for i in reversed(ready[-extra:] if extra > 0 else []):
                name = js.members[role][i]["metadata"]["name"]
                if self.api.delete("Pod", name):
                    report.actions.append(
                        ScaleAction(js.name, target, target, True, "spare deleted", deleted=[name])
                    )
                    self.status.event(js, "SpareDeleted", f"{name}: a standby member beyond the plan",
                                      key=name)
