"""The live cluster agent: a named, detached, restartable Ray actor that schedules real jobs slot by slot.

Its control loop (a thread of the actor), every slot::

    view = backend.snapshot()          # live state: Ray nodes, each job host's status
    alloc = scheduler.decide(view)     # the configured scheduler behind the guardrail / shadow wrapper
    backend.apply(alloc)               # deltas only, as ElasticJob.scale calls

A step that fails is logged and counted; the loop goes on at the next slot.
Slot ``k`` starts at ``epoch + k · slot_seconds`` (``epoch`` is part of the
actor's constructor arguments, so a restarted agent keeps the same slots).

On a restart (``max_restarts=-1``; Ray re-runs ``__init__``) the agent holds
nothing it must recover: jobs, their members, their progress and their
observations live in the job host actors (:mod:`clusters.ray.job`), which
the backend lists again at the next snapshot. ``adopted`` counts the running
jobs found at start-up. Control calls (``submit``, ``cancel``) are answered
concurrently with the loop.

As a federation's ``ray`` member (``member``: a :class:`clusters.federation.live.LiveMember`)
the agent's scheduler is the federation's policy (:class:`clusters.federation.live.FederatedLivePolicy`:
learning, shadow or serve-only) behind the same guardrail.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import ray

from clusters.agent.guard import DecisionLog, GuardedScheduler
from clusters.ray.backend import RayBackend
from clusters.ray.config import LiveConfig
from clusters.ray.job import NAMESPACE, TERMINAL
from dl2ray.errors import UserError
from dl2ray.jobspec import parse_jobspec
from dl2ray.schedulers.base import make_scheduler

log = logging.getLogger(__name__)


def _incarnation() -> int:
    try:
        return int(ray.get_runtime_context().was_current_actor_reconstructed)
    except Exception:  # outside an actor (tests driving the class directly)
        return 0


class LiveAgentImpl:
    """The agent (module docstring). ``config_json``: a :class:`LiveConfig`; ``scheduler``: its spec."""

    def __init__(self, config_json: str, epoch: float, scheduler: str, shadow: bool = False,
                 learn: bool = False, run_loop: bool = True, member: Any = None) -> None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
        self.cfg = LiveConfig.model_validate_json(config_json)
        live = self.cfg.live
        self.exp = self.cfg.experiment()
        self.epoch, self.spec, self.shadow = epoch, scheduler, shadow
        self.restarted = _incarnation()
        self.backend = RayBackend(self.exp.catalogue, live.slot_seconds, epoch, self.exp.cluster.placement,
                                  live.timeouts.heartbeat_timeout_s, live.timeouts.register_timeout_s)
        log_dir = self.cfg.resolve(live.log_dir)
        self.decisions = DecisionLog(log_dir / "decisions.parquet")
        self.slots_log = DecisionLog(log_dir / "slots.parquet")
        self.learner = None
        self.member = member
        if member is not None:  # a federation member: the federation's policy, its mode
            from clusters.federation.live import FederatedLivePolicy

            self.learner = FederatedLivePolicy(member.cfg, member.spec, member.link, self.restarted)
            policy = self.learner
            self.shadow = shadow = member.spec.mode == "shadow"
        elif learn:
            from clusters.a3c.live import LiveLearner

            self.learner = LiveLearner.from_scheduler(self.exp, live.learn, scheduler, self.restarted)
            policy = self.learner
        else:
            policy = make_scheduler(scheduler, self.exp)
        self.scheduler = GuardedScheduler(policy, make_scheduler(live.guardrail.fallback, self.exp),
                                          live.guardrail.time_budget_s, shadow, self.decisions)
        self.errors: Counter[str] = Counter()
        self.loop_ms: list[dict[str, float]] = []
        self.slots_done = 0
        self.last_slot = -1
        self.adopted = sum(1 for st in self.backend.statuses().values() if st["state"] not in TERMINAL)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="control-loop", daemon=True)
        if run_loop:
            self._thread.start()

    # ---- the control loop -------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            slot = self.backend.slot_now()
            if slot > self.last_slot:
                self.step()
                self.last_slot = slot
            next_start = self.epoch + (self.backend.slot_now() + 1) * self.cfg.live.slot_seconds
            self._stop.wait(max(next_start - time.time(), 0.01))

    def step(self) -> dict[str, Any]:
        """One slot: snapshot, decide, apply. Never raises; failures are logged and counted."""
        t0 = time.perf_counter()
        row: dict[str, Any] = {"slot": self.backend.slot_now(), "time": time.time()}
        try:
            self.backend.poll_pending()
            view = self.backend.snapshot()
            t1 = time.perf_counter()
            alloc = self.scheduler.decide(view)
            t2 = time.perf_counter()
            report = self.backend.apply(alloc)
            t3 = time.perf_counter()
            row.update(slot=view.slot, jobs=len(view.jobs), view_ms=(t1 - t0) * 1e3,
                       decide_ms=(t2 - t1) * 1e3, apply_ms=(t3 - t2) * 1e3, total_ms=(t3 - t0) * 1e3,
                       actions=len(report.actions), busy=len(report.skipped_busy),
                       events=";".join(f"{a.job}:{a.before}->{a.target}:{a.ok}:{a.reason}"
                                       for a in report.actions))
            self.loop_ms.append({k: row[k] for k in ("view_ms", "decide_ms", "apply_ms", "total_ms")})
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

    # ---- control calls ----------------------------------------------------------

    def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Register a job; ``{"ok": False, "error": ...}`` naming the field for a bad one."""
        try:
            st = self.backend.submit(parse_jobspec(spec))
        except UserError as exc:
            return {"ok": False, "error": str(exc)}
        return {"ok": True, "job": st}

    def jobs(self) -> list[dict[str, Any]]:
        return sorted(self.backend.statuses().values(), key=lambda s: s["submitted_at"])

    def job(self, name: str) -> dict[str, Any] | None:
        host = self.backend.hosts().get(name)
        return None if host is None else ray.get(host.status.remote())

    def cancel(self, name: str) -> dict[str, Any]:
        try:
            return self.backend.cancel(name)
        except UserError as exc:
            return {"ok": False, "reason": str(exc)}

    def status(self) -> dict[str, Any]:
        jobs = self.backend.statuses()
        states = Counter(s["state"] for s in jobs.values())
        sched = self.scheduler
        return {
            "agent": self.cfg.live.agent_name, "scheduler": self.spec, "shadow": self.shadow,
            "slot": self.backend.slot_now(), "slot_seconds": self.cfg.live.slot_seconds,
            "slots_done": self.slots_done, "restarted": self.restarted, "adopted": self.adopted,
            "jobs": dict(states), "guardrail_fallbacks": dict(sched.fallbacks), "errors": dict(self.errors),
            "policy_version": self.learner.version if self.learner is not None else None,
            "learn": self.learner.stats() if self.learner is not None else None,
            "federation": None if self.member is None else {"federation": self.member.federation,
                                                            "member": self.member.spec.name},
            "log_dir": str(self.cfg.resolve(self.cfg.live.log_dir)),
        }

    def loop_timings(self) -> list[dict[str, float]]:
        return list(self.loop_ms)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.scheduler.close()

    def pid(self) -> int:
        import os

        return os.getpid()


LiveAgent = ray.remote(num_cpus=0, max_restarts=-1, max_concurrency=8)(LiveAgentImpl)
"""The agent actor class; started named and detached by :func:`start_agent`."""


def start_agent(cfg: LiveConfig, scheduler: str | None = None, shadow: bool | None = None,
                learn: bool | None = None, epoch: float | None = None, member: Any = None) -> Any:
    """Start the named, detached agent (or return the running one). Needs a connected Ray driver.

    ``member``: a federation member's agent (:class:`clusters.federation.live.LiveMember`): the federation's
    policy in the member's mode; ``scheduler``, ``shadow`` and ``learn`` do not apply."""
    live = cfg.live
    try:
        return ray.get_actor(live.agent_name, namespace=NAMESPACE)
    except ValueError:
        pass
    Path(cfg.resolve(live.log_dir)).mkdir(parents=True, exist_ok=True)
    if member is not None:
        agent = LiveAgent.options(name=live.agent_name, namespace=NAMESPACE, lifetime="detached").remote(
            cfg.model_dump_json(), time.time() if epoch is None else epoch,
            f"federation:{member.federation}/{member.spec.name}", False, False, True, member)
        ray.get(agent.pid.remote())
        return agent
    spec = cfg.scheduler_spec(scheduler)
    if live.learn.enabled if learn is None else learn:
        from clusters.a3c.live import ensure_global_policy

        ensure_global_policy(cfg, spec)
    agent = LiveAgent.options(name=live.agent_name, namespace=NAMESPACE, lifetime="detached").remote(
        cfg.model_dump_json(), time.time() if epoch is None else epoch, spec,
        live.shadow if shadow is None else shadow, live.learn.enabled if learn is None else learn)
    ray.get(agent.pid.remote())  # raises here if the constructor failed (bad scheduler, config)
    return agent


def find_agent(name: str = "dl2ray-agent") -> Any:
    try:
        return ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        raise UserError(f"no dl2ray agent {name!r} on this Ray cluster: "
                        "run `dl2ray cluster up` first") from None
