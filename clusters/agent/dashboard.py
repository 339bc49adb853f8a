"""What the agent's dashboard shows (``GET /api/state``), built from the agent, the jobs' statuses and the
agent's status: one :class:`DashboardState` per request, for any backend.

The page (``clusters/agent/dashboard.html``) polls it; nothing here is kept between requests, so a
restarted agent shows the same jobs at once (their statuses live in the cluster).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import Any

import numpy as np
from pydantic import BaseModel, Field

from clusters.agent.queues import QueueRow
from clusters.agent.waiting import queue

RESOURCES = ("cpu", "gpu", "mem")


class Resources(BaseModel):
    cpu: float = Field(description="cores")
    gpu: float = Field(description="GPUs")
    mem: float = Field(description="GB")


def _res(row: np.ndarray) -> Resources:
    return Resources(**{k: round(float(v), 3) for k, v in zip(RESOURCES, row, strict=True)})


class NodeState(BaseModel):
    name: str = Field(description="the backend's node name (Ray node id, Kubernetes node)")
    capacity: Resources
    used: Resources = Field(description="held by the members of unfinished jobs now (their demands)")
    free: Resources = Field(description="free to the scheduler in the latest view (capacity less what it "
                                        "cannot give: a paused job's PS)")


class SlotRecord(BaseModel):
    """One closed slot of a job: its deployment and the epochs it trained in the slot."""

    slot: int
    ps: int
    workers: int
    epochs: float


class ScaleCall(BaseModel):
    """One scale call the agent made to the job: target, result, how long it took."""

    slot: float = Field(description="slot (fractional) at which the call started")
    ps: int
    workers: int
    ok: bool | None
    reason: str
    seconds: float


class ScalingEvent(BaseModel):
    """One completed plan of the job's coordinator."""

    plan_id: int
    change: str
    clock: int = Field(description="iteration at which the plan took effect")
    duration_ms: float = Field(description="prepare to resume, ms")
    pause_ms: float = Field(description="largest worker suspension, ms")


class JobState(BaseModel):
    name: str
    job_id: int
    type: str
    state: str
    reason: str = ""
    ps: int
    workers: int
    ps_nodes: list[str] = Field(description="node of each PS in the plan")
    worker_nodes: list[str] = Field(description="node of each worker in the plan")
    epochs_done: float
    est_epochs: float
    submitted_at: float = Field(description="unix time, s")
    finished_at: float | None = None
    seconds: float = Field(description="since submission (JCT once ended), s")
    queue_position: int | None = Field(description="1, 2, … among waiting jobs in submission order; None "
                                                   "while it does not wait")
    wait_reason: str | None = Field(description="why it waits: one of clusters.agent.waiting.REASONS, read "
                                                "from the agent's last decision; None while it does not wait")
    wait_detail: str | None = Field(description="the reason's numbers (what it was given, needs, room left)")
    busy: bool = Field(description="a scale call is running")
    operation: str | None = None
    timeline: list[SlotRecord] = Field(description="the closed slots of the latest window, oldest first")
    scale_calls: list[ScaleCall] = Field(description="the scale calls of the latest window")
    events: list[ScalingEvent]


class DecisionRow(BaseModel):
    """One slot's decision: both allocations by job name (``[ps, workers]``), which was applied, why."""

    slot: int
    applied: str
    reason: str
    policy_ms: float
    policy_alloc: dict[str, list[int]] | None
    fallback_alloc: dict[str, list[int]] | None


class PolicyState(BaseModel):
    scheduler: str = Field(description="the scheduler's spec (dl2:PATH, drf, a federation's label)")
    guarded: str = Field(description="the guardrail wrapper's name: policy and fallback")
    fallback: str
    shadow: bool
    version: int | None = Field(description="global update count of the weights (learning policies)")


class DashboardState(BaseModel):
    time: float = Field(description="unix time of this answer, s")
    agent: dict[str, Any] = Field(description="the agent's status (dl2ray cluster status)")
    slot: int
    slot_seconds: float
    epoch: float = Field(description="unix time at which slot 0 started, s")
    policy: PolicyState
    nodes: list[NodeState]
    jobs: list[JobState]
    decisions: list[DecisionRow] = Field(description="the latest slots, newest last")
    fallbacks: dict[str, int] = Field(description="guardrail fallbacks by reason since the agent started")
    federation: dict[str, Any] | None = Field(
        description="the federation this agent is a member of, and its learner's members (staleness)")
    queues: list[QueueRow] = Field(default_factory=list, description="each queue's quota, use and borrowing "
                                   "after the last decision (clusters.agent.queues); [] without tenancy")


def _job(st: dict[str, Any], names: dict[str, str], wait: dict[str, Any] | None, epoch: float, slot_s: float,
         now: float, since: int) -> JobState:
    plan = [m for m in st.get("members") or () if m.get("state") == "member"]

    def nodes(role: str) -> list[str]:
        return [names.get(m.get("node") or "", (m.get("node") or "?")[:12])
                for m in plan if m["role"] == role]

    return JobState(
        name=st["name"], job_id=st["job_id"], type=st["job_type"], state=st["state"],
        reason=st.get("reason") or "", ps=st["ps"], workers=st["workers"], ps_nodes=nodes("ps"),
        worker_nodes=nodes("worker"), epochs_done=round(float(st["epochs_done"]), 4),
        est_epochs=float(st["est_epochs"]), submitted_at=st["submitted_at"],
        finished_at=st.get("finished_at"),
        seconds=round((st.get("finished_at") or now) - st["submitted_at"], 3),
        queue_position=(wait or {}).get("position"), wait_reason=(wait or {}).get("reason"),
        wait_detail=(wait or {}).get("detail"), busy=bool(st.get("busy")),
        operation=st.get("operation"),
        timeline=[SlotRecord(slot=h["slot"], ps=h["ps"], workers=h["workers"], epochs=round(h["epochs"], 4))
                  for h in st.get("history") or () if h["slot"] >= since],
        scale_calls=[ScaleCall(slot=round((a["time"] - epoch) / slot_s, 3), ps=a.get("ps", 0),
                               workers=a.get("workers", 0), ok=a.get("ok"), reason=str(a.get("reason", "")),
                               seconds=round(a.get("seconds", 0.0), 3))
                     for a in st.get("actions") or () if "time" in a and a["time"] >= epoch + since * slot_s],
        events=[ScalingEvent(plan_id=e["plan_id"], change=e["change"], clock=e["clock"],
                             duration_ms=round(e["duration_ms"], 3),
                             pause_ms=round(max(e["suspension_ms"].values(), default=0.0), 3))
                for e in st.get("events") or ()],
    )


def node_usage(jobs: Iterable[dict[str, Any]], names: list[str]) -> np.ndarray:
    """Shape (len(names), 3): Σ of the per-task demand (cpu, gpu, mem GB) of every alive member of every
    unfinished job on each node (members on a node not in ``names`` are left out)."""
    index = {n: i for i, n in enumerate(names)}
    used = np.zeros((len(names), 3))
    for st in jobs:
        if st["state"] in ("finished", "failed", "cancelled"):
            continue
        demand = {r: np.array([st["spec"][r][k] for k in RESOURCES], dtype=np.float64)
                  for r in ("ps", "worker")}
        for m in st.get("members") or ():
            if m.get("node") in index and m.get("role") in demand:
                used[index[m["node"]]] += demand[m["role"]]
    return used


def _named(alloc_json: str, names: dict[int, str]) -> dict[str, list[int]] | None:
    alloc = json.loads(alloc_json)
    return None if alloc is None else {names.get(int(k), k): v for k, v in alloc.items()}


def dashboard_state(agent: Any, status: dict[str, Any], jobs: Iterable[dict[str, Any]],
                    node_names: list[str] | None = None, federation: dict[str, Any] | None = None,
                    decisions: int = 30, window: int = 240) -> DashboardState:
    """The dashboard's state now.

    ``agent``: the :class:`~clusters.agent.loop.Agent` (its latest view and decision, scheduler, decision
    log; each waiting job's queue position and reason are :func:`~clusters.agent.waiting.queue`'s);
    ``status``: the agent's status dict (``dl2ray cluster status``); ``jobs``: the backend's job statuses;
    ``node_names``: the view's nodes in order (default ``node-0``, …); ``federation``: what the
    agent knows of its federation (None: not a member); ``decisions``: how many latest slots to list;
    ``window``: the timeline's slots (each job's slot records and scale calls of the latest ``window``
    slots: the answer's size stays bounded however long the jobs run).
    """
    now = time.time()
    jobs = sorted(jobs, key=lambda s: s["submitted_at"])
    view = agent.last_view
    cap = view.capacity if view is not None else np.zeros((0, 3))
    free = view.free if view is not None else np.zeros((0, 3))
    names = list(node_names or ())
    names += [f"node-{i}" for i in range(len(names), len(cap))]
    short = {n: n[:12] for n in names}
    used = node_usage(jobs, names[:len(cap)])
    waits = queue(jobs, agent.last_decision)
    epoch = float(agent.backend.slot_start(0))
    slot_s = float(agent.backend.slot_start(1)) - epoch
    by_id = {int(st["job_id"]): st["name"] for st in jobs}
    guard = agent.scheduler
    return DashboardState(
        time=now, agent=status, slot=agent.backend.slot_now(), slot_seconds=slot_s, epoch=epoch,
        policy=PolicyState(scheduler=agent.spec, guarded=guard.name, fallback=guard.fallback.name,
                           shadow=guard.shadow, version=status.get("policy_version")),
        nodes=[NodeState(name=short[n], capacity=_res(cap[i]), used=_res(used[i]), free=_res(free[i]))
               for i, n in enumerate(names[:len(cap)])],
        jobs=[_job(st, short, waits.get(st["name"]), epoch, slot_s or 1.0, now,
                   agent.backend.slot_now() - window) for st in jobs],
        decisions=[DecisionRow(slot=d["slot"], applied=d["applied"], reason=d["reason"],
                               policy_ms=round(d["policy_ms"], 3),
                               policy_alloc=_named(d["policy_alloc"], by_id),
                               fallback_alloc=_named(d["fallback_alloc"], by_id))
                   for d in list(agent.decisions.rows)[-decisions:]],
        fallbacks=dict(guard.fallbacks), federation=federation, queues=agent.queues(jobs),
    )
