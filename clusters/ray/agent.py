"""The live agent on Ray: the control loop of :mod:`clusters.agent.loop` in a named, detached, restartable
Ray actor, over a :class:`~clusters.ray.backend.RayBackend`.

The loop runs in a thread of the actor; control calls (``submit``, ``cancel``,
``jobs``, ``queues``, ``status``) are answered concurrently with it, and so is the agent's HTTP server
(:mod:`clusters.agent.http`: the dashboard, ``/api/state``, ``/metrics``; its address is
``dashboard_url`` of ``status()``). Slot ``k`` starts at
``epoch + k · slot_seconds`` (``epoch`` is part of the actor's constructor
arguments, so a restarted agent keeps the same slots).

On a restart (``max_restarts=-1``; Ray re-runs ``__init__``) the agent holds
nothing it must recover: jobs, their members, their progress and their
observations live in the job host actors (:mod:`clusters.ray.job`), which the
backend lists again at the next snapshot. ``adopted`` counts the running jobs
found at start-up.

The policy is the config's scheduler, or one a :class:`PolicySource` builds
inside the actor (it travels there pickled): the live A3C learner of
``cluster up --learn`` (:class:`clusters.a3c.live.LearnFromLiveSlots`) or a
federation's policy (:class:`clusters.federation.live.LiveMember`). Either sits
behind the same guardrail.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from contextlib import suppress
from typing import Any, Protocol

import ray

from clusters.agent.dashboard import DashboardState, dashboard_state
from clusters.agent.http import AgentHttp, make_app
from clusters.agent.loop import Agent
from clusters.agent.queues import QueueRow, check_job_queue
from clusters.agent.waiting import queue
from clusters.ray.backend import RayBackend, RayJob, list_hosts
from clusters.ray.config import LiveConfig
from clusters.ray.member import end_members
from clusters.ray.pool import end_pool, ensure_pool, pool_stats
from clusters.ray.record import delete_record, record_names
from clusters.runtime import NAMESPACE, actor_class, incarnation
from dl2ray.config import ExperimentConfig
from dl2ray.errors import UserError
from dl2ray.jobspec import parse_jobspec
from dl2ray.schedulers.base import Scheduler

log = logging.getLogger(__name__)


class LearningPolicy(Scheduler, Protocol):
    """A policy that learns as it decides: the weights' global update count, and its own counts."""

    version: int

    def stats(self) -> dict[str, Any]: ...


class PolicySource(Protocol):
    """Builds the agent's policy inside the agent actor (once per incarnation)."""

    def build(self, exp: ExperimentConfig, incarnation: int) -> LearningPolicy:
        """The policy for ``exp`` (``incarnation``: 1 once Ray has restarted the agent, for fresh RNG
        streams)."""
        ...

    def describe(self) -> dict[str, Any] | None:
        """What ``status()`` reports of the source under ``federation`` (None: not a federation's)."""
        ...


class LiveAgentImpl:
    """The agent actor (module docstring). ``config_json``: a :class:`LiveConfig`; ``scheduler``: the
    scheduler's spec (with ``policy``, only its name); ``run_loop=False``: tests call ``step``."""

    def __init__(self, config_json: str, epoch: float, scheduler: str, shadow: bool = False,
                 run_loop: bool = True, policy: PolicySource | None = None) -> None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
        self.cfg = LiveConfig.model_validate_json(config_json)
        live = self.cfg.live
        exp = self.cfg.experiment()
        self.tenancy = exp.tenancy  # the queues a job may name (None: one pool)
        self.epoch, self.shadow, self.source = epoch, shadow, policy
        self._learner: tuple[float, dict[str, Any]] | None = None  # (monotonic time, learner status)
        self.restarted = incarnation()
        self.backend = RayBackend(exp.catalogue, live.slot_seconds, epoch, exp.cluster.default_placement,
                                  live.timeouts.heartbeat_timeout_s, live.timeouts.register_timeout_s,
                                  orphan_timeout_s=live.timeouts.orphan_timeout_s, reads=live.reads)
        self.learner = policy.build(exp, self.restarted) if policy is not None else None
        self.agent = Agent(self.cfg, self.backend, scheduler, self.learner, shadow, exp)
        self.agent.metrics.watch_jobs(lambda: self.backend.statuses().values())  # the jobs' numbers too
        if self.tenancy is not None:
            self.agent.metrics.watch_queues(self.queues)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self.agent.run, args=(self._stop,), name="control-loop",
                                        daemon=True)
        board = live.dashboard
        app = make_app(self.dashboard, self.agent.metrics.scrape, f"dl2ray agent {live.agent_name}")
        self.http = AgentHttp(app, board.host, board.port) if board.enabled else None
        if run_loop:
            self._thread.start()

    def step(self) -> dict[str, Any]:
        """One slot now (tests; the loop does this every slot)."""
        return self.agent.step()

    # ---- control calls ----------------------------------------------------------

    def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Register a job; ``{"ok": False, "error": ...}`` naming the field for a bad one (an unknown queue
        or priority class too: :func:`clusters.agent.queues.check_job_queue`)."""
        try:
            job = parse_jobspec(spec)
            check_job_queue(self.tenancy, job)
            st = self.backend.submit(job)
        except UserError as exc:
            return {"ok": False, "error": str(exc)}
        return {"ok": True, "job": st}

    def jobs(self) -> list[dict[str, Any]]:
        """Every job's status in submission order; a waiting job's has ``queue``: its position among the
        waiting jobs and why it waits, from the last decision (:mod:`clusters.agent.waiting`), else None."""
        jobs = sorted(self.backend.statuses().values(), key=lambda s: s["submitted_at"])
        waits = queue(jobs, self.agent.last_decision)
        return [{**s, "queue": waits.get(s["name"])} for s in jobs]

    def job(self, name: str) -> dict[str, Any] | None:
        """One job's full status, with ``queue`` as in :meth:`jobs`; the other jobs as the last slot read
        them (a follower polls this every second: no call to every other job's host)."""
        host = self.backend.hosts().get(name)
        if host is None:
            return None
        st = ray.get(host.status.remote()).to_dict()
        others = [_brief(j) for n, j in dict(self.backend.jobs).items() if n != name]
        return {**st, "queue": queue([*others, st], self.agent.last_decision).get(name)}

    def queues(self) -> list[QueueRow]:
        """Each queue's quota, use, borrowing and jobs after the last decision (``dl2ray queues list``);
        [] on a cluster without queues."""
        return self.agent.queues(self.backend.statuses().values())

    def cancel(self, name: str) -> dict[str, Any]:
        try:
            return self.backend.cancel(name)
        except UserError as exc:
            return {"ok": False, "reason": str(exc)}

    def status(self, jobs: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
        """The agent now (``dl2ray cluster status``); ``jobs``: the backend's statuses if already read."""
        jobs = self.backend.statuses() if jobs is None else jobs
        a = self.agent
        return {
            "agent": self.cfg.live.agent_name, "scheduler": a.spec, "shadow": self.shadow,
            "slot": self.backend.slot_now(), "slot_seconds": self.cfg.live.slot_seconds,
            "slots_done": a.slots_done, "restarted": self.restarted, "adopted": a.adopted,
            "jobs": dict(Counter(s["state"] for s in jobs.values())),
            "guardrail_fallbacks": dict(a.scheduler.fallbacks), "errors": dict(a.errors),
            "policy_version": self.learner.version if self.learner is not None else None,
            "learn": self.learner.stats() if self.learner is not None else None,
            "federation": self.source.describe() if self.source is not None else None,
            "pool": pool_stats(),
            "log_dir": str(self.cfg.log_dir()),
            "dashboard_url": self.http.url if self.http is not None else None,
        }

    def dashboard(self) -> DashboardState:
        """What the dashboard shows now (:mod:`clusters.agent.dashboard`; ``GET /api/state``)."""
        fed = self.source.describe() if self.source is not None else None
        if fed is not None:
            fed = {**fed, "learner": self._learner_status()}
        jobs = self.backend.statuses()
        return dashboard_state(self.agent, self.status(jobs), jobs.values(), list(self.backend.nodes.names),
                               fed)

    def _learner_status(self, max_age_s: float = 5.0) -> dict[str, Any] | None:
        """The federation learner's status (members, staleness), read at most every ``max_age_s`` seconds
        through the source's ``learner_status`` (None without one, or while the learner is unreachable)."""
        ask = getattr(self.source, "learner_status", None)
        if ask is None:
            return None
        now = time.monotonic()
        if self._learner is None or now - self._learner[0] > max_age_s:
            try:
                self._learner = (now, ask())
            except Exception as exc:  # the learner may be down: the dashboard says so and goes on
                log.warning("federation learner status: %r", exc)
                self._learner = (now, {"error": f"{type(exc).__name__}: {exc}"})
        return self._learner[1]

    def loop_timings(self) -> list[dict[str, float]]:
        return list(self.agent.loop_ms)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.agent.close()
        if self.http is not None:
            self.http.stop()

    def pid(self) -> int:
        return os.getpid()


def _brief(job: RayJob) -> dict[str, Any]:
    """What :func:`~clusters.agent.waiting.queue` needs of a job, as the last snapshot read it."""
    return {"name": job.name, "job_id": job.job_id, "state": job.state, "submitted_at": job.submitted_at,
            "workers": job.plan()[1], "busy": job.busy, "spec": job.spec.model_dump(mode="json")}


LiveAgent = actor_class(LiveAgentImpl, num_cpus=0, max_restarts=-1, max_concurrency=8)
"""The agent actor class; started named and detached by :func:`launch_agent`."""


def launch_agent(cfg: LiveConfig, scheduler: str, shadow: bool = False, policy: PolicySource | None = None,
                 epoch: float | None = None) -> Any:
    """Start the named, detached agent (or return the running one). Needs a connected Ray driver.

    ``scheduler``: a make_scheduler spec (``cfg.scheduler_spec``), or the name of ``policy``'s policy;
    raises here (not in the actor's log) if the constructor fails (a bad scheduler or config)."""
    live = cfg.live
    try:
        return ray.get_actor(live.agent_name, namespace=NAMESPACE)
    except ValueError:
        pass
    cfg.log_dir().mkdir(parents=True, exist_ok=True)
    ensure_pool(live.pool.per_node, live.pool.refill_interval_s)
    agent = LiveAgent.options(name=live.agent_name, namespace=NAMESPACE, lifetime="detached").remote(
        cfg.model_dump_json(), time.time() if epoch is None else epoch, scheduler, shadow, True, policy)
    ray.get(agent.pid.remote())
    return agent


def find_agent(name: str = "dl2ray-agent") -> Any:
    try:
        return ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        raise UserError(f"no dl2ray agent {name!r} on this Ray cluster: "
                        "run `dl2ray cluster up` first") from None


def teardown(agent_name: str = "dl2ray-agent", global_policy: str = "dl2ray-global-policy") -> None:
    """Stop the agent, cancel and end every job host, end the warm pool, every member actor left and the
    live GlobalPolicy, delete the hosts' records (connected driver needed)."""
    with suppress(ValueError):
        agent = ray.get_actor(agent_name, namespace=NAMESPACE)
        with suppress(ray.exceptions.RayError):
            ray.get(agent.stop.remote(), timeout=60)
        ray.kill(agent, no_restart=True)
    for host in list_hosts().values():
        with suppress(ray.exceptions.RayError):
            ray.get(host.cancel.remote(), timeout=60)
        ray.kill(host)  # no restart
    end_pool()
    end_members()  # a host's members (detached) that outlived it, idle ones the pool had not handed out
    for name in record_names():
        delete_record(name)
    with suppress(ValueError):
        ray.kill(ray.get_actor(global_policy, namespace=NAMESPACE), no_restart=True)
