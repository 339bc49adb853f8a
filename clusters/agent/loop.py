"""The cluster agent on Kubernetes: one process (the agent's Deployment) scheduling DL2Jobs slot by slot.

Every slot::

    view = backend.snapshot()          # nodes, pods, DL2Jobs, coordinators (level-triggered)
    alloc = scheduler.decide(view)     # the configured scheduler behind the guardrail
    backend.apply(alloc)               # pods and ElasticJob.scale calls, deltas only

A step that fails is logged and counted, and the loop goes on at the next
slot. The agent keeps nothing of its own: after a restart (the Deployment
brings it back) the first snapshot reads the jobs, their pods and their slot
history from the cluster, so running jobs are adopted as they are.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections import Counter
from typing import Any

from clusters.agent.guard import DecisionLog, GuardedScheduler
from clusters.k8s.config import K8sConfig
from dl2ray.schedulers.base import Scheduler, make_scheduler

log = logging.getLogger(__name__)


class K8sAgent:
    """The control loop over a :class:`~clusters.k8s.backend.KubernetesBackend` (module docstring)."""

    def __init__(
        self,
        cfg: K8sConfig,
        backend: Any,
        scheduler: str | None = None,
        policy: Scheduler | None = None,
        shadow: bool = False,
    ) -> None:
        """``scheduler``: a make_scheduler spec (default: the config's); ``policy``: a scheduler object
        instead (a federation member's; ``scheduler`` then only names it); ``shadow``: decide with it,
        apply the fallback."""
        k = cfg.kubernetes
        exp = cfg.experiment()
        self.cfg, self.backend = cfg, backend
        self.spec = scheduler or k.scheduler
        log_dir = cfg.resolve(k.log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
        self.decisions = DecisionLog(log_dir / "decisions.parquet")
        self.slots_log = DecisionLog(log_dir / "slots.parquet")
        self.scheduler = GuardedScheduler(
            policy if policy is not None else make_scheduler(self.spec, exp),
            make_scheduler(k.guardrail.fallback, exp),
            k.guardrail.time_budget_s,
            shadow,
            self.decisions,
        )
        self.errors: Counter[str] = Counter()
        self.slots_done = 0
        backend.read()
        self.adopted = sum(1 for js in backend.jobs.values() if js.coordinator is not None)

    def step(self) -> dict[str, Any]:
        """One slot: snapshot, decide, apply. Never raises; failures are logged and counted."""
        t0 = time.perf_counter()
        row: dict[str, Any] = {"slot": self.backend.slot_now(), "time": time.time()}
        try:
            view = self.backend.snapshot()
            t1 = time.perf_counter()
            alloc = self.scheduler.decide(view)
            t2 = time.perf_counter()
            report = self.backend.apply(alloc)
            t3 = time.perf_counter()
            row.update(
                slot=view.slot,
                jobs=len(view.jobs),
                view_ms=(t1 - t0) * 1e3,
                decide_ms=(t2 - t1) * 1e3,
                apply_ms=(t3 - t2) * 1e3,
                total_ms=(t3 - t0) * 1e3,
                actions=len(report.actions),
                busy=len(report.skipped_busy),
                errors=";".join(report.errors),
                events=";".join(f"{a.job}:{a.before}->{a.target}:{a.ok}:{a.reason}" for a in report.actions),
            )
        except Exception as exc:  # the loop must survive any step's failure
            self.errors[type(exc).__name__] += 1
            row["error"] = f"{type(exc).__name__}: {exc}"
            log.error("slot step failed: %s", traceback.format_exc())
        self.slots_done += 1
        self.slots_log.add(row)
        try:
            self.decisions.write()
            self.slots_log.write()
        except OSError as exc:
            self.errors["log"] += 1
            log.error("cannot write the decision log: %s", exc)
        return row

    def run(self, stop: threading.Event, max_slots: int | None = None) -> None:
        """Step once per slot until ``stop`` is set (or ``max_slots`` slots ran)."""
        last = -1
        slot_s = self.cfg.kubernetes.slot_seconds
        while not stop.is_set() and (max_slots is None or self.slots_done < max_slots):
            slot = self.backend.slot_now()
            if slot > last:
                row = self.step()
                log.info(
                    "slot %s: %s",
                    row.get("slot"),
                    {k: v for k, v in row.items() if k not in ("slot", "time")},
                )
                last = slot
            stop.wait(max((self.backend.slot_now() + 1) * slot_s - time.time(), 0.01))
        self.scheduler.close()
