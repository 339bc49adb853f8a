"""A simulated federation member: its agent (:class:`MemberAgentImpl`) and what it needs of the file
(:class:`MemberSpec`, :func:`member_specs`).

:class:`MemberAgentImpl` is one member cluster's agent: a control loop in its
own thread (each step's failure is logged and retried with capped backoff,
never ends the loop) on a simulated cluster of the member's own config. In
``learn`` mode it computes one push with its :class:`~clusters.a3c.local.LocalLearner`
(the paper's networks: ``steps_per_update`` decision steps with the sampled policy
and their gradient; the shape policy: counterfactual tries in a twin it fits from
episodes its own cluster ran, and the pseudo-gradient of the improvement), sends it
and takes the reply's weights (a push the learner refuses is counted); in
``shadow`` and ``serve-only`` it pulls weights every ``pull_interval_s``
and pushes nothing (shadow: its cluster keeps the fallback, DRF, and the
policy is only judged; serve-only: the cluster is scheduled by the pulled
policy). A ``learn`` member with ``joins_after`` K (a cluster that joins a running federation) pulls
like a shadow member until the learner has applied K updates, then pushes. Every ``val_every`` pushes
(pulls) it measures the greedy policy's average JCT on its own validation traces against DRF's and
reports it.

Random streams: member ``i``'s action sampling (or tried jobs and rows)
``[seed, 1, i, incarnation]``, exploration ``[seed, 2, i, incarnation]``
(incarnation: 1 after a Ray restart of that member); networks from ``seed``;
its twin's draws from :data:`dl2ray.seeds.TWIN`.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from clusters.a3c.local import LocalSettings, local_learner
from clusters.federation.links import Link, LinkDown
from clusters.runtime import actor_class, incarnation
from dl2ray import seeds as seedsets
from dl2ray.config import ExperimentConfig
from dl2ray.learn import validation

log = logging.getLogger("dl2ray.federation")


@dataclass(frozen=True)
class MemberSpec:
    """What a member agent needs of the federation file (plain values: it travels to another Ray)."""

    name: str
    index: int
    mode: str
    traces: list[int]
    val_traces: list[int]
    val_every: int
    pull_interval_s: float
    seed: int
    steps_per_update: int | None = None
    critic: bool = True
    exploration: bool = True
    pull_every: int = 1
    threads: int = 1
    twin: str = "observed"  # shape policy: where its tries are simulated (dl2ray.learn.shape.twin)
    twin_window: int = 8
    observe_every: int = 1
    joins_after: int = 0  # learn: pushes once the learner has applied this many updates (pulls till then)
    algo: str = "counterfactual"  # shape policy: counterfactual tries in the twin, or pg online
    credit: str = "job"  # pg: a job choice's return
    share_baseline: bool = False  # pg: the value baseline is the learner's (its A3COptions say so too)


VALIDATION_LOG = 1000
"""Validations a simulated member keeps in its log (:meth:`MemberAgentImpl.validations`)."""


@dataclass
class MemberCounters:
    pushed: int = 0
    accepted: int = 0
    stale: int = 0
    rewound: int = 0
    refused: int = 0  # pushes the learner's checks refused (shape, NaN, norm)
    pulls: int = 0
    joins: int = 0
    reconnects: int = 0  # learner boots seen change (restarts survived)
    errors: int = 0
    last_error: str | None = None
    version: int = -1
    boot: int = -1
    slots: int = 0
    bytes_last: int = 0
    validations: int = 0


class MemberAgentImpl:
    """One member's agent (module docstring); behind :data:`MemberAgent`. The loop starts at once."""

    def __init__(self, cfg: ExperimentConfig, spec: MemberSpec, link: Link, start: bool = True) -> None:
        torch.set_num_threads(spec.threads)
        self.cfg, self.spec, self.link = cfg, spec, link
        self.incarnation = incarnation()
        settings = LocalSettings(spec.steps_per_update, spec.critic, spec.exploration, spec.twin,
                                 spec.twin_window, spec.observe_every, algo=spec.algo, credit=spec.credit,
                                 share_baseline=spec.share_baseline)
        # The networks of the member's architecture (replaced on join) and how it computes a push.
        self.learner = local_learner(cfg, spec.traces, spec.seed, [spec.index, self.incarnation], settings,
                                     salt=spec.index)
        self.policy, self.value = self.learner.policy, self.learner.value
        self.joined = False
        self.c = MemberCounters()
        self.drf: float | None = None
        # (own pushes, own slots of experience, seconds since start, validation avg JCT) per validation,
        # the newest VALIDATION_LOG of them: what Fig. 18's federation row reads (clusters.federation.quality)
        self._validated: deque[tuple[int, int, float, float]] = deque(maxlen=VALIDATION_LOG)
        self._started = time.perf_counter()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        if start:
            self.start()

    def start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name=f"member-{self.spec.name}", daemon=True)
            self._thread.start()

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=120)
        return self.status()

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {"name": self.spec.name, "mode": self.spec.mode, "incarnation": self.incarnation,
                    "running": bool(self._thread and self._thread.is_alive()), **dataclasses.asdict(self.c),
                    **self.learner.stats()}

    def validations(self) -> list[tuple[int, int, float, float]]:
        """Each validation's ``(own pushes, own slots of experience, seconds since the agent started,
        validation avg JCT)``, oldest first (the newest :data:`VALIDATION_LOG`)."""
        with self._lock:
            return list(self._validated)

    # -- the loop --------------------------------------------------------------------------------------

    def _loop(self) -> None:
        backoff = 0.2
        while not self._stop.is_set():
            try:
                self.step()
                backoff = 0.2
            except LinkDown as exc:
                self._error(exc)
                self.joined = False  # rejoin with fresh weights once the learner answers again
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
            except Exception as exc:  # a step's failure is logged and never ends the loop
                log.exception("member %s: step failed", self.spec.name)
                self._error(exc)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)

    def _error(self, exc: BaseException) -> None:
        with self._lock:
            self.c.errors += 1
            self.c.last_error = f"{type(exc).__name__}: {exc}"[:300]

    def step(self) -> None:
        """One turn: join if needed; then one push (learn) or one pull (shadow, serve-only)."""
        if not self.joined:
            r = self.link.join(self.spec.name)
            with self._lock:
                self.c.joins += 1
            self._take(r)
        if self.spec.mode == "learn" and self.c.version >= self.spec.joins_after:
            self._learn_turn()
            due = self.c.pushed % self.spec.val_every == 0
        else:  # shadow, serve-only, or a learn member waiting for the federation to reach joins_after
            self._stop.wait(self.spec.pull_interval_s)
            r = self.link.pull(self.spec.name, self.c.version, self.c.boot)
            with self._lock:
                self.c.pulls += 1
            self._take(r)
            due = self.spec.mode != "learn" and self.c.pulls % self.spec.val_every == 0
        if due:
            self.validate_and_report()

    def _learn_turn(self) -> None:
        push = self.learner.compute(self.c.version)
        # A shape member's next tries should start from the learner's weights: it pulls with every push.
        pull = (self.c.pushed + 1) % self.spec.pull_every == 0 or self.value is None
        r = self.link.push(self.spec.name, push.grad, push.row, self.c.version, self.c.boot, pull)
        with self._lock:
            self.c.pushed += 1
            self.c.slots += push.slots
            self.c.bytes_last = getattr(self.link, "bytes_last", 0)
            if r["accepted"] == "yes":
                self.c.accepted += 1
            elif r["accepted"] == "stale":
                self.c.stale += 1
            elif r["accepted"] == "rewound":
                self.c.rewound += 1
            else:  # refused by the learner's checks (shape, nan, norm)
                self.c.refused += 1
        self._take(r)

    def _take(self, r: dict[str, Any]) -> None:
        with self._lock:
            if self.c.boot not in (-1, r["boot"]):
                self.c.reconnects += 1
            self.c.boot = r["boot"]
        if r.get("weights") is None:
            return
        self.learner.take(r["weights"])
        self.joined = True
        with self._lock:
            self.c.version = int(r["updates"])

    def validate_and_report(self) -> tuple[float, float]:
        """Greedy JCT of the current weights and DRF's on this member's validation traces; reported."""
        if self.drf is None:
            self.drf = validation.heuristic_jct(self.cfg, "drf", self.spec.val_traces)
        with self._lock:
            version, pushed, slots = self.c.version, self.c.pushed, self.c.slots
        jct = validation.validate(self.cfg, self.policy, self.spec.val_traces)
        self.link.report(self.spec.name, version, jct, self.drf)
        with self._lock:
            self.c.validations += 1
            self._validated.append((pushed, slots, time.perf_counter() - self._started, jct))
        return jct, self.drf


MemberAgent = actor_class(MemberAgentImpl, num_cpus=0, max_restarts=-1, max_task_retries=-1)
"""A member's Ray actor: named ``fed-NAME-member-MEMBER`` in ``dl2ray``, detached; no CPU reserved
(members share the machine's cores; a reservation would cap how many fit on a small head)."""


def member_specs(fed, learning_seed: int) -> list[MemberSpec]:
    """Every member's :class:`MemberSpec`: disjoint training seeds (in file order), validation seeds."""
    specs, offset = [], 0
    lrn = fed.learner.learning
    for i, m in enumerate(fed.members):
        specs.append(MemberSpec(
            m.name, i, m.mode, seedsets.training(m.traces, offset), seedsets.validation(m.val_traces),
            m.val_every, m.pull_interval_s, learning_seed, m.steps_per_update or lrn.steps_per_update,
            lrn.critic, lrn.exploration, lrn.pull_every, lrn.threads, lrn.twin, lrn.twin_window,
            lrn.observe_every, m.joins_after, lrn.algo, lrn.credit))
        offset += m.traces
    return specs
