"""The cluster agent: one control loop over any :class:`~clusters.agent.backend.LiveBackend`.

Every slot::

    view = backend.snapshot()          # live state (level-triggered): nodes, jobs, their members, progress
    alloc = scheduler.decide(view)     # the configured scheduler behind the guardrail / shadow wrapper
    backend.apply(alloc)               # deltas only: scale-downs and pauses first, then scale-ups

A step that fails is logged and counted, and the loop goes on at the next slot.
Each slot is one row of ``slots.parquet`` (timings, actions, errors) and one of
``decisions.parquet`` (both allocations, which one was applied, why; see
:mod:`clusters.agent.guard`) in the config's ``log_dir``, read by
``dl2ray cluster report``.

The agent keeps nothing it must recover: after a restart the backend's first
snapshot reads the jobs, their members and their slot history from the
cluster, so running jobs are adopted as they are (``adopted`` counts them).
Where the agent runs is its backend's business: in a named, detached Ray actor
(:mod:`clusters.ray.agent`) or in the process of ``dl2ray cluster up`` with a
Kubernetes config (the agent Deployment's command, :mod:`clusters.cli.k8s`).
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections import Counter
from collections.abc import Iterable
from typing import Any

from clusters.agent.backend import LiveBackend
from clusters.agent.guard import DecisionLog, GuardedScheduler
from clusters.agent.metrics import AgentMetrics
from clusters.agent.queues import QueueRow, queue_rows
from clusters.agent.settings import AgentConfig
from clusters.agent.waiting import LastDecision, waits
from dl2ray.config import ExperimentConfig
from dl2ray.errors import UserError
from dl2ray.schedulers.base import Scheduler, make_scheduler
from dl2ray.tenancy import TenancyConfig
from dl2ray.view import ClusterView

log = logging.getLogger(__name__)


def _queued(policy: Scheduler, tenancy: TenancyConfig) -> Scheduler:
    """A given policy object inside the queue layer, as :func:`make_scheduler` puts a configured one. A
    learning policy (one with a ``version``: the live A3C learner, a federation member's) is refused: the
    queue layer asks a scheduler several times per slot (each queue's demand, then each queue's share), and
    a learner would take every such call for a decision of its own."""
    if hasattr(policy, "version"):
        raise UserError("learning on a cluster with queues (tenancy:) is not supported yet: the queue layer "
                        "asks its scheduler several times per slot; run the learner on a cluster of one pool")
    from dl2ray.schedulers.queued import Queued

    return Queued(policy, tenancy)


class Agent:
    """The control loop (module docstring) of the cluster behind ``backend``.

    ``spec``: the scheduler's make_scheduler spec (default: the config's, ``dl2:PATH`` made absolute);
    ``policy``: a scheduler object instead (a learner's or a federation member's; ``spec`` then only
    names it; on a cluster with queues it decides inside the queue layer, and a learning one is refused);
    ``shadow``: decide with it, apply the guardrail's fallback. ``exp``: the experiment the
    schedulers are built for (default: the one the config names). ``metrics``: where each slot is counted
    (:mod:`clusters.agent.metrics`; default: a registry of the agent's own, without the jobs' metrics).
    ``last_view`` is the latest snapshot (None before the first), for the dashboard; ``tenancy``: the
    experiment's queues (:mod:`clusters.agent.queues`), None on a cluster of one pool.
    """

    def __init__(self, cfg: AgentConfig, backend: LiveBackend, spec: str | None = None,
                 policy: Scheduler | None = None, shadow: bool = False,
                 exp: ExperimentConfig | None = None, metrics: AgentMetrics | None = None) -> None:
        settings = cfg.agent
        exp = exp or cfg.experiment()
        self.cfg, self.backend = cfg, backend
        self.tenancy = exp.tenancy  # the queues the schedulers decide within (None: one pool)
        self.spec = spec or cfg.scheduler_spec()
        log_dir = cfg.log_dir()
        log_dir.mkdir(parents=True, exist_ok=True)
        self.decisions = DecisionLog(log_dir / "decisions.parquet")
        self.slots_log = DecisionLog(log_dir / "slots.parquet")
        if policy is not None and self.tenancy is not None:
            policy = _queued(policy, self.tenancy)
        self.scheduler = GuardedScheduler(
            policy if policy is not None else make_scheduler(self.spec, exp),
            make_scheduler(settings.guardrail.fallback, exp),
            settings.guardrail.time_budget_s, shadow, self.decisions)
        self.metrics = metrics or AgentMetrics()
        self.last_view: ClusterView | None = None
        self.errors: Counter[str] = Counter()
        # per slot: view, decide, apply and total milliseconds, and the view's parts (backend.view_parts)
        self.loop_ms: list[dict[str, float]] = []
        self.slots_done = 0
        self.last_slot = -1
        self.last_decision: LastDecision | None = None  # the latest slot's, for why jobs wait
        self.adopted = backend.adopt()

    def step(self) -> dict[str, Any]:
        """One slot: snapshot, decide, apply. Never raises; failures are logged and counted."""
        t0 = time.perf_counter()
        row: dict[str, Any] = {"slot": self.backend.slot_now(), "time": time.time()}
        decided = len(self.decisions.rows)
        results: list[bool | None] = []
        try:
            view = self.backend.snapshot()
            self.last_view = view
            t1 = time.perf_counter()
            alloc = self.scheduler.decide(view)
            t2 = time.perf_counter()
            report = self.backend.apply(alloc)
            t3 = time.perf_counter()
            self.last_decision = LastDecision(view, alloc, report, self.tenancy)
            timings = {"view_ms": (t1 - t0) * 1e3, "decide_ms": (t2 - t1) * 1e3,
                       "apply_ms": (t3 - t2) * 1e3, "total_ms": (t3 - t0) * 1e3, **self.backend.view_parts()}
            row.update(slot=view.slot, jobs=len(view.jobs), **timings, actions=len(report.actions),
                       busy=len(report.skipped_busy), errors=";".join(report.errors),
                       events=";".join(a.event() for a in report.actions))
            self.loop_ms.append(timings)
            results = [a.ok for a in report.actions]
        except Exception as exc:  # the loop must survive any step's failure
            self.errors[type(exc).__name__] += 1
            row["error"] = f"{type(exc).__name__}: {exc}"
            log.error("slot step failed: %s", traceback.format_exc())
        self.slots_done += 1
        self.slots_log.add(row)
        self.metrics.slot(row, self.decisions.rows[-1] if len(self.decisions.rows) > decided else None,
                          results, getattr(self.scheduler.policy, "version", None))
        try:
            self.decisions.write()
            self.slots_log.write()
        except OSError as exc:
            self.errors["log"] += 1
            log.error("cannot write the decision log: %s", exc)
        return row

    def run(self, stop: threading.Event, max_slots: int | None = None) -> None:
        """Step once per slot, at its start, until ``stop`` is set (or ``max_slots`` slots ran)."""
        while not stop.is_set() and (max_slots is None or self.slots_done < max_slots):
            slot = self.backend.slot_now()
            if slot > self.last_slot:
                row = self.step()
                log.info("slot %s: %s", row.get("slot"),
                         {k: v for k, v in row.items() if k not in ("slot", "time")})
                self.last_slot = slot
            stop.wait(max(self.backend.slot_start(self.backend.slot_now() + 1) - time.time(), 0.01))
        self.scheduler.close()

    def queues(self, statuses: Iterable[dict[str, Any]]) -> list[QueueRow]:
        """Each queue's quota, use and borrowing after the last decision, its jobs counted from
        ``statuses`` (job statuses: ``state``, ``workers``, ``spec``; ended jobs left out;
        :func:`clusters.agent.queues.queue_rows`); [] on a cluster without queues."""
        if self.tenancy is None:
            return []
        last = self.last_decision
        jobs = [(s["spec"].get("queue"), waits(s["state"], s["workers"])) for s in statuses
                if s["state"] in ("pending", "running", "paused")]
        return queue_rows(self.tenancy, last.view if last else None, last.allocation if last else None, jobs)

    def close(self) -> None:
        """Stop the policy's worker thread (the guardrail's); the backend is its owner's to close."""
        self.scheduler.close()
