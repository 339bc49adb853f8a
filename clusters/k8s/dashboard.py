"""The Kubernetes agent's dashboard and Prometheus metrics: the Ray agent's HTTP server
(:mod:`clusters.agent.http`) over DL2Jobs.

The dashboard (:func:`clusters.agent.dashboard.dashboard_state`), the jobs' metrics
(:class:`clusters.agent.metrics.JobsCollector`) and the wait reasons (:mod:`clusters.agent.waiting`) read
job statuses in the shape of a Ray job host's ``status()``; :func:`job_status` gives a DL2Job that shape,
from what the backend read at its latest snapshot (its spec, its status, its member pods and the
coordinator's plan), so both agents show the same page, JSON and metrics. States map as

    Pending → pending   Running → running (paused: no worker in the coordinator's plan)
    Suspended → paused  Succeeded → finished   Failed, Invalid → failed

On a shared cluster the queues' table and metrics come from the backend's queue rows after the agent's
last decision (:meth:`~clusters.k8s.backend.KubernetesBackend.queue_rows`). Scale calls are not recorded in
a DL2Job's status (its Events are), so a job's ``actions`` are empty and the timeline shows no ▲.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from clusters.agent.dashboard import DashboardState, dashboard_state
from clusters.agent.http import AgentHttp, make_app
from clusters.agent.loop import Agent
from clusters.k8s.backend import KubernetesBackend
from clusters.k8s.world import JobState

STATES = {"Pending": "pending", "Running": "running", "Suspended": "paused", "Succeeded": "finished",
          "Failed": "failed", "Invalid": "failed"}


def job_status(js: JobState) -> dict[str, Any]:
    """One DL2Job as a Ray job host's ``status()`` (module docstring); ``spec`` None for an invalid one."""
    st = js.status
    ps, workers = js.plan()
    state = STATES.get(js.phase, "pending")
    if state == "running" and workers == 0:
        state = "paused"
    members = [{"name": (pod.get("metadata") or {}).get("name"), "role": role,
                "node": (pod.get("spec") or {}).get("nodeName"), "state": "member"}
               for role in ("ps", "worker") for pod in js.live(role).values()]
    spec = js.spec.model_dump(mode="json") if js.spec is not None else None
    return {
        "name": js.name, "job_id": js.job_id, "job_type": js.spec.job_type if js.spec else "",
        "state": state, "reason": js.error or "", "spec": spec,
        "submitted_at": float(st.get("submittedAt", 0.0)), "finished_at": st.get("finishedAt"),
        "ps": ps, "workers": workers, "members": members,
        "epochs_done": float(st.get("epochsDone", 0.0)), "est_epochs": float(st.get("estEpochs", 0.0)),
        "busy": False, "operation": None, "history": list(st.get("history") or []), "actions": [],
        "events": [{"plan_id": e.get("planId", 0), "change": e.get("change", ""), "clock": e.get("clock", 0),
                    "duration_ms": e.get("durationMs", 0.0), "suspension_ms": {},
                    "lost_iterations": e.get("lostIterations", 0)} for e in st.get("scalingEvents") or ()],
    }


def job_statuses(backend: KubernetesBackend) -> list[dict[str, Any]]:
    """Every DL2Job with a valid spec, as :func:`job_status` gives it (an invalid one has no demands to
    show; its condition and Event say what is wrong)."""
    return [job_status(js) for js in list(backend.jobs.values()) if js.spec is not None]


def agent_status(agent: Agent, backend: KubernetesBackend, jobs: list[dict[str, Any]]) -> dict[str, Any]:
    """The agent now, with the keys of the Ray agent's ``status()`` that the dashboard reads."""
    return {"agent": f"k8s:{backend.cfg.namespace}", "scheduler": agent.spec, "slot": backend.slot_now(),
            "slot_seconds": backend.cfg.slot_seconds, "slots_done": agent.slots_done, "restarted": 0,
            "adopted": agent.adopted, "jobs": dict(Counter(s["state"] for s in jobs)),
            "guardrail_fallbacks": dict(agent.scheduler.fallbacks), "errors": dict(agent.errors),
            "policy_version": None}


def state(agent: Agent, backend: KubernetesBackend) -> DashboardState:
    """What the dashboard shows now (``GET /api/state``)."""
    jobs = job_statuses(backend)
    return dashboard_state(agent, agent_status(agent, backend, jobs), jobs, list(backend.nodes.names))


def start_http(agent: Agent, backend: KubernetesBackend) -> AgentHttp | None:
    """The agent's HTTP server (dashboard, ``/api/state``, ``/metrics``) as its config's ``dashboard``
    says (None when disabled), with the jobs' and, on a shared cluster, the queues' metrics added."""
    agent.metrics.watch_jobs(lambda: job_statuses(backend))
    if agent.tenancy is not None:
        agent.metrics.watch_queues(lambda: backend.queue_rows(
            agent.last_decision.allocation if agent.last_decision is not None else None))
    board = backend.cfg.dashboard
    if not board.enabled:
        return None
    app = make_app(lambda: state(agent, backend), agent.metrics.scrape,
                   f"dl2ray agent k8s:{backend.cfg.namespace}")
    return AgentHttp(app, board.host, board.port)
