"""The agent's Prometheus metrics (``GET /metrics`` of its HTTP server, :mod:`clusters.agent.http`).

Two kinds, in one registry per agent (never the process-wide default: a test process runs many agents):

* counted by the control loop as it runs (:meth:`AgentMetrics.slot`): the slot loop's time by phase,
  decisions by which allocation was applied, guardrail fallbacks by reason, scale calls by result,
  failed steps, the policy version;
* read from the jobs' statuses when scraped (:class:`JobsCollector`): jobs by state, the queue
  (waiting jobs), job completion times, scaling events and each event's worker pause. These are
  level-triggered like the agent: a restarted agent reports the same job numbers at once;
* on a shared cluster, read from the queues when scraped (:class:`QueuesCollector`, names in
  :data:`QUEUE_METRIC_NAMES`): each queue's nominal quota, use and borrowed resources after the last
  decision, and its jobs running and waiting (:mod:`clusters.agent.queues`).

Every name is listed in :data:`METRIC_NAMES`; ``configs/grafana/dl2ray.json`` queries them (a test checks
every panel's metric against a scrape).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from clusters.agent.queues import QueueRow
from clusters.agent.waiting import waits

LOOP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Seconds: one slot's view/decide/apply (milliseconds to the guardrail's budget and beyond)."""
JCT_BUCKETS = (10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 4 * 3600.0, 24 * 3600.0)
"""Seconds from submission to the end of a job."""
PAUSE_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0)
"""Seconds a scaling event suspended a worker (the largest suspension of the event's workers)."""
JOB_STATES = ("pending", "running", "paused", "finished", "failed", "cancelled")

METRIC_NAMES = (
    "dl2ray_agent_slot_seconds", "dl2ray_agent_slots_total", "dl2ray_agent_step_errors_total",
    "dl2ray_agent_decisions_total", "dl2ray_agent_fallbacks_total", "dl2ray_agent_scale_calls_total",
    "dl2ray_agent_policy_version", "dl2ray_jobs", "dl2ray_queue_length", "dl2ray_job_completion_seconds",
    "dl2ray_scaling_events_total", "dl2ray_scaling_pause_seconds",
)
QUEUE_METRIC_NAMES = (
    "dl2ray_queue_nominal", "dl2ray_queue_used", "dl2ray_queue_borrowed", "dl2ray_queue_jobs",
)
"""The queues' families, exposed by an agent whose experiment has ``tenancy:`` (labels ``queue`` and
``resource`` — cpu, gpu, mem — or ``state``: running, waiting)."""


class QueuesCollector(Collector):
    """Queue metrics computed at scrape time from ``rows()`` (:func:`clusters.agent.queues.queue_rows`)."""

    def __init__(self, rows: Callable[[], Iterable[QueueRow]]) -> None:
        self.rows = rows

    def collect(self) -> Iterator[Any]:
        rows = list(self.rows())
        docs = {"nominal": "Nominal quota of each queue (what it is guaranteed), by resource",
                "used": "What each queue's jobs hold after the agent's last decision, by resource",
                "borrowed": "What each queue holds beyond its nominal quota, by resource"}
        for field, doc in docs.items():
            family = GaugeMetricFamily(f"dl2ray_queue_{field}", doc, labels=["queue", "resource"])
            for r in rows:
                for resource, value in getattr(r, field).items():
                    family.add_metric([r.name, resource], value)
            yield family
        jobs = GaugeMetricFamily("dl2ray_queue_jobs", "Jobs of each queue not yet ended, running or waiting",
                                 labels=["queue", "state"])
        for r in rows:
            jobs.add_metric([r.name, "running"], r.running)
            jobs.add_metric([r.name, "waiting"], r.waiting)
        yield jobs


class JobsCollector(Collector):
    """Job-level metrics computed at scrape time from ``jobs()`` (the backend's job statuses)."""

    def __init__(self, jobs: Callable[[], Iterable[dict[str, Any]]]) -> None:
        self.jobs = jobs

    def collect(self) -> Iterator[Any]:
        statuses = list(self.jobs())
        by_state = GaugeMetricFamily("dl2ray_jobs", "Jobs the cluster knows, by state", labels=["state"])
        for state in JOB_STATES:
            by_state.add_metric([state], sum(st["state"] == state for st in statuses))
        yield by_state
        yield GaugeMetricFamily("dl2ray_queue_length", "Jobs waiting for the scheduler (pending, paused, or "
                                "running with no worker yet: the queue of dl2ray jobs list)",
                                value=sum(waits(st["state"], st["workers"]) for st in statuses))
        jcts = [st["finished_at"] - st["submitted_at"] for st in statuses
                if st["state"] == "finished" and st.get("finished_at")]
        yield _histogram("dl2ray_job_completion_seconds",
                         "Job completion time of finished jobs: submission to end, seconds",
                         jcts, JCT_BUCKETS)
        pauses = [max(e["suspension_ms"].values(), default=0.0) / 1e3
                  for st in statuses for e in st.get("events") or ()]
        events = CounterMetricFamily("dl2ray_scaling_events", "Completed scaling events (plans) of all jobs")
        events.add_metric([], len(pauses))
        yield events
        yield _histogram("dl2ray_scaling_pause_seconds",
                         "Largest worker suspension of each scaling event, seconds", pauses, PAUSE_BUCKETS)


def _histogram(name: str, doc: str, values: list[float], buckets: tuple[float, ...]) -> HistogramMetricFamily:
    cumulative = [(str(b), float(sum(v <= b for v in values))) for b in buckets]
    cumulative.append(("+Inf", float(len(values))))
    h = HistogramMetricFamily(name, doc)
    h.add_metric([], cumulative, sum_value=float(sum(values)))
    return h


class AgentMetrics:
    """One agent's registry: the loop's instruments and the jobs' collector (module docstring).

    ``jobs``: the backend's job statuses in the shape of the Ray job hosts' ``status()`` (``state``,
    ``submitted_at``, ``finished_at``, ``events`` with ``suspension_ms``); None: the loop's metrics only
    (the Kubernetes agent, whose statuses are DL2Job status objects of another shape).
    """

    def __init__(self, jobs: Callable[[], Iterable[dict[str, Any]]] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.slot_seconds = Histogram("dl2ray_agent_slot_seconds",
                                      "Time of one slot's control loop by phase (view, decide, apply, total)",
                                      ["phase"], buckets=LOOP_BUCKETS, registry=r)
        self.slots = Counter("dl2ray_agent_slots", "Slots the agent stepped", registry=r)
        self.step_errors = Counter("dl2ray_agent_step_errors", "Slots whose step failed, by exception",
                                   ["error"], registry=r)
        self.decisions = Counter("dl2ray_agent_decisions",
                                 "Slot decisions by the allocation applied (policy or fallback)",
                                 ["applied"], registry=r)
        self.fallbacks = Counter("dl2ray_agent_fallbacks",
                                 "Slots the guardrail gave to the fallback, by reason (shadow included)",
                                 ["reason"], registry=r)
        self.scale_calls = Counter("dl2ray_agent_scale_calls",
                                   "Scale calls the agent made, by result (ok, failed, running)",
                                   ["result"], registry=r)
        self.policy_version = Gauge("dl2ray_agent_policy_version",
                                    "Global update count of the policy's weights (-1: a fixed policy)",
                                    registry=r)
        self.policy_version.set(-1)
        for applied in ("policy", "fallback"):
            self.decisions.labels(applied)
        for phase in ("view", "decide", "apply", "total"):
            self.slot_seconds.labels(phase)
        for result in ("ok", "failed", "running"):
            self.scale_calls.labels(result)
        if jobs is not None:
            self.watch_jobs(jobs)

    def watch_jobs(self, jobs: Callable[[], Iterable[dict[str, Any]]]) -> None:
        """Add the jobs' metrics, read from ``jobs()`` at each scrape (:class:`JobsCollector`)."""
        self.registry.register(JobsCollector(jobs))

    def watch_queues(self, rows: Callable[[], Iterable[QueueRow]]) -> None:
        """Add the queues' metrics, read from ``rows()`` at each scrape (:class:`QueuesCollector`)."""
        self.registry.register(QueuesCollector(rows))

    def slot(self, row: dict[str, Any], decision: dict[str, Any] | None, results: Iterable[bool | None],
             version: object) -> None:
        """Count one stepped slot: its log ``row`` (``*_ms`` timings or ``error``), the decision log's row
        of the slot (None if it failed before deciding), each scale call's ``ok``, the policy's ``version``
        (its global update count when it learns; anything else leaves the gauge as it is)."""
        self.slots.inc()
        if row.get("error"):
            self.step_errors.labels(row["error"].split(":", 1)[0]).inc()
        for phase in ("view", "decide", "apply", "total"):
            if f"{phase}_ms" in row:
                self.slot_seconds.labels(phase).observe(row[f"{phase}_ms"] / 1e3)
        if decision is not None:
            self.decisions.labels(decision["applied"]).inc()
            if decision["applied"] == "fallback":
                self.fallbacks.labels(decision["reason"].split(":", 1)[0] or "shadow").inc()
        for ok in results:
            self.scale_calls.labels({True: "ok", False: "failed", None: "running"}[ok]).inc()
        if isinstance(version, int):
            self.policy_version.set(version)

    def scrape(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
