"""The DL2Job status the Kubernetes backend writes at the start of a slot, and the tidying it does.

* **status** (:meth:`StatusWriter.update`): phase, progress, conditions
  (``Valid``, ``Suspended``), the coordinator's address, its latest scaling
  events, and the job's per-slot history: each slot closes the observation of
  the previous one (epochs trained, seconds, deployment) into
  ``status.history`` and moves ``status.mark``; so the history survives an
  agent restart. Written as a patch only where it changed.
* **tidying** (:meth:`StatusWriter.tidy`): pods and Services whose DL2Job is
  gone are deleted; so are member pods that ended (released members exit on
  their own; failed or evicted ones are reported as a ``MemberFailed`` Warning
  event and dropped, and the coordinator drops them from its plan).
* **after an apply** (:meth:`StatusWriter.applied`, called by the reconciler
  for each job it changed): the ready counts, phase and conditions the change
  made, written at once (``kubectl get`` shows them before the next slot), and
  one Event for the change (:func:`clusters.k8s.conditions.scale_event`).
* **conditions** (:mod:`clusters.k8s.conditions`): ``Valid``, ``Created``,
  ``Running``, ``Suspended``, ``Finished``.
* **events**: core/v1 Events on the DL2Job, named from its uid and their
  content, so each is reported once however often it is seen: ``InvalidSpec``
  naming the field, ``MemberFailed``, the scaling events, and ``Succeeded`` /
  ``Failed`` (Warning) when the job ends.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from datetime import UTC, datetime

from clusters.agent.reports import ScaleAction
from clusters.k8s import objects as ko
from clusters.k8s.api import KubeApi
from clusters.k8s.conditions import Seen, job_conditions, scale_event
from clusters.k8s.config import K8sSettings
from clusters.k8s.world import TERMINAL_JOBS, TERMINAL_PODS, JobState, World, pod_phase

HISTORY = 20
"""Per-slot observations kept in a DL2Job's status."""


def _now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class StatusWriter:
    """Writes what the backend read into the cluster (module docstring). ``clock``: Unix time (s)."""

    def __init__(self, api: KubeApi, settings: K8sSettings, clock: Callable[[], float]) -> None:
        self.api, self.settings, self.clock = api, settings, clock

    def tidy(self, world: World) -> None:
        """Delete what no job owns any more, and member pods that failed or were evicted."""
        for pod in world.orphans:
            self.api.delete("Pod", pod["metadata"]["name"])
        for name in world.orphan_services:
            self.api.delete("Service", ko.coordinator_name(name))
        for js in world.jobs.values():
            coord_phase = pod_phase(js.coordinator) if js.coordinator else None
            for role in ko.ROLES:
                for i, pod in list(js.members[role].items()):
                    # released members (Succeeded), failed or evicted ones, and all of a finished job
                    if pod_phase(pod) in TERMINAL_PODS or coord_phase in TERMINAL_PODS:
                        if pod_phase(pod) == "Failed" and coord_phase not in TERMINAL_PODS:
                            reason = (pod.get("status") or {}).get("reason") or "Failed"
                            js.status["replaced"] = int(js.status.get("replaced", 0)) + 1
                            self.event(
                                js,
                                "MemberFailed",
                                f"{pod['metadata']['name']}: {reason}; dropped from the job",
                                kind="Warning",
                                key=pod["metadata"]["name"],
                            )
                        self.api.delete("Pod", pod["metadata"]["name"])
                        del js.members[role][i]
            if coord_phase in TERMINAL_PODS and js.service:
                self.api.delete("Service", ko.coordinator_name(js.name))
                js.service = False

    def update(self, world: World, js: JobState, slot: int) -> None:
        """Phase, progress, conditions and the slot history; written only where it changed."""
        old = json.dumps(js.obj.get("status") or {}, sort_keys=True)
        st = js.status
        now = self.clock()
        if "submittedAt" not in st:
            created = js.obj["metadata"].get("creationTimestamp")
            st["submittedAt"] = (
                datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
                if created
                else round(now, 3)
            )
        st["jobId"] = js.job_id
        if js.error is not None:
            js.phase = "Invalid"
            before: dict = next((c for c in st.get("conditions") or [] if c.get("type") == "Valid"), {})
            if before.get("message") != js.error:  # reported once per distinct problem
                self.event(js, "InvalidSpec", js.error, kind="Warning", key=js.error)
        else:
            js.phase = self._phase(js)
            if js.phase in TERMINAL_JOBS and st.get("phase") != js.phase:
                st.setdefault("finishedAt", round(now, 3))
                self._finished(js)
        st["phase"] = js.phase
        if js.spec is not None:
            st["estEpochs"] = js.spec.epochs
            last = {
                r: st.get(r, {}).get("ready") or st.get(r, {}).get("desired", 0) for r in ("ps", "workers")
            }
            ps, workers = js.plan()
            st["ps"] = {"desired": st.get("ps", {}).get("desired", 0), "ready": ps}
            st["workers"] = {"desired": st.get("workers", {}).get("desired", 0), "ready": workers}
            if js.phase == "Succeeded":
                st["epochsDone"] = js.spec.epochs
            elif js.coord is not None:
                st["epochsDone"] = round(min(js.coord.epochs_done, js.spec.epochs), 6)
                st["scalingEvents"] = [
                    {
                        "planId": e.plan_id,
                        "change": e.change,
                        "clock": e.clock,
                        "durationMs": round(e.duration_ms, 1),
                        "lostIterations": e.lost_iterations,
                    }
                    for e in js.coord.events[-10:]
                ]
            if js.coordinator is not None and (addr := world.address(js)):
                st["coordinator"] = addr
            self._close_slot(js, slot, now, (last["ps"], last["workers"]))
        self._conditions(js)
        if json.dumps(st, sort_keys=True) != old:
            self.api.patch_status(js.name, st)
            js.obj["status"] = json.loads(json.dumps(st))

    def _phase(self, js: JobState) -> str:
        phase = pod_phase(js.coordinator) if js.coordinator is not None else None
        if phase in TERMINAL_PODS:
            return phase
        if js.suspend:
            return "Suspended"
        return "Pending" if phase is None else "Running"

    def _close_slot(self, js: JobState, slot: int, now: float, last: tuple[int, int]) -> None:
        """Append the observation of the slot before ``slot`` (once per slot) and move the mark. The first
        mark is the coordinator pod's start (0 epochs); a finished job gets one last observation with the
        deployment it last had (``last``: (ps, workers))."""
        st = js.status
        mark = st.get("mark")
        if mark is None and js.coordinator is not None:
            started = (js.coordinator.get("status") or {}).get("startTime")
            if started:
                t = datetime.strptime(started, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
                mark = {"slot": math.floor(t / self.settings.slot_seconds), "time": t, "epochs": 0.0}
        epochs = float(st.get("epochsDone", 0.0))
        if js.phase in TERMINAL_JOBS:  # one last observation up to the end, then none
            if mark is None or mark["epochs"] >= epochs - 1e-9:
                return
        elif js.coord is None or (mark is not None and mark["slot"] >= slot):
            return
        ps, workers = js.plan() if js.phase not in TERMINAL_JOBS else last
        if mark is not None:
            hist = list(st.get("history") or [])
            hist.append(
                {
                    "slot": slot - 1,
                    "ps": ps,
                    "workers": workers,
                    "epochs": round(max(epochs - mark["epochs"], 0.0), 6),
                    "seconds": round(now - mark["time"], 3),
                }
            )
            st["history"] = hist[-HISTORY:]
        st["mark"] = {"slot": slot, "time": round(now, 3), "epochs": epochs}

    def _conditions(self, js: JobState) -> None:
        st = js.status
        seen = Seen(
            phase=js.phase,
            error=js.error,
            created=js.coordinator is not None,
            suspend=js.suspend,
            plan=(int(st.get("ps", {}).get("ready", 0)), int(st.get("workers", {}).get("ready", 0))),
            epochs=float(st.get("epochsDone", 0.0)),
        )
        st["conditions"] = job_conditions(list(st.get("conditions") or []), seen, _now_iso())

    def _finished(self, js: JobState) -> None:
        if js.phase == "Succeeded":
            assert js.spec is not None
            self.event(js, "Succeeded", f"trained {js.spec.epochs:g} epochs", key="finished")
            return
        pod = js.coordinator or {}
        why = (pod.get("status") or {}).get("reason") or (pod.get("status") or {}).get("message") or "Failed"
        self.event(js, "Failed", f"the coordinator pod {pod.get('metadata', {}).get('name')} failed: {why}",
                   kind="Warning", key="finished")

    def applied(self, js: JobState, action: ScaleAction, slot: int) -> None:
        """After the reconciler changed one job: one Event for the change and, when it went through, the
        ready counts, phase and conditions it made, written now (only where they changed)."""
        kind, reason, message = scale_event(action, js.suspend)
        self.event(js, reason, message, kind=kind, key=f"{slot}:{action.before}->{action.target}:{action.ok}")
        if not action.ok:
            return
        st = js.status
        keys = ("phase", "ps", "workers", "conditions")
        old = json.dumps({k: st.get(k) for k in keys}, sort_keys=True)
        st["ps"] = {**st.get("ps", {}), "ready": action.target[0]}
        st["workers"] = {**st.get("workers", {}), "ready": action.target[1]}
        js.phase = self._phase(js)
        st["phase"] = js.phase
        self._conditions(js)
        new = {k: st[k] for k in keys}
        if json.dumps(new, sort_keys=True) != old:
            self.api.patch_status(js.name, new)

    def event(self, js: JobState, reason: str, message: str, kind: str = "Normal", key: str = "") -> None:
        """A core/v1 Event on the DL2Job (:func:`clusters.k8s.objects.event`): reported once, however
        often the same occurrence (``reason`` + ``key``) is seen."""
        self.api.create(ko.event(js.obj, reason, message, kind, key, _now_iso()))
