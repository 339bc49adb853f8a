"""Federated A3C on Ray actors: one :class:`GlobalPolicy`, N :class:`ClusterAgent` s, one validator.

Architecture (``docs/policy.md``, "Federated A3C"):

- :class:`~clusters.a3c.global_policy.GlobalPolicy` applies each push on arrival (after its checks:
  shape, NaN, norm, staleness), validates off the update path and checkpoints
  (:mod:`clusters.a3c.global_policy`).
- :class:`ClusterAgent` is bound to its own simulated cluster and its own part of the training
  traces: with N agents, agent ``i`` cycles every N-th seed of ``seeds.training(traces)`` from the
  ``i``-th (disjoint parts; together the same set as the single-process trainer's). Its loop:
  compute one push with its :class:`~clusters.a3c.local.LocalLearner` of the networks'
  architecture — ``paper``: ``steps_per_update`` decision steps with the sampled policy (and
  job-aware exploration) and their actor-critic gradient; ``shape`` (the shipped policy): one
  update's counterfactual tries in the agent's twin (``twin``: ``config`` or ``observed``,
  :mod:`dl2ray.learn.shape.twin`) and the pseudo-gradient of its KL-limited improvement — and send it
  with ``.remote()``. Every ``pull_every``-th push asks for the weights back in the same call;
  replies are taken up when they have arrived, and the agent blocks only when ``max_in_flight``
  pushes are still unanswered (which bounds staleness and memory; a shape agent waits for every
  reply: its push follows seconds of rollouts, and its next tries should start from the master's
  weights). A killed agent is restarted by Ray (``max_restarts``) with its ``__init__`` state: it
  pulls the current weights and starts its stream again from its first trace.

There is no replay in A3C: every push comes from the agent's fresh, on-policy experience (the
parallel agents decorrelate it instead).

Random streams: networks from ``seed`` (when not from ``init``); agent ``i``'s action sampling (or
tried jobs and rows) from ``[seed, 1, i, incarnation]`` and exploration from ``[seed, 2, i,
incarnation]``, where ``incarnation`` is 1 once Ray has restarted that agent (so a restarted agent
does not replay the first samples); a shape agent's twin draws from :data:`dl2ray.seeds.TWIN`.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch
from ray.exceptions import ActorUnavailableError

from clusters.a3c.global_policy import A3COptions, GlobalPolicy
from clusters.a3c.local import local_learner
from clusters.a3c.reports import AgentReport
from clusters.a3c.weights import with_hidden_of
from clusters.runtime import NAMESPACE, actor_class, incarnation
from dl2ray.config import ExperimentConfig
from dl2ray.learn.records import RLResult


class ClusterAgentImpl:
    """One agent on its own backend and trace stream (module docstring); behind :data:`ClusterAgent`."""

    def __init__(self, cfg: ExperimentConfig, global_name: str, agent_id: int, seed: int,
                 options: A3COptions) -> None:
        torch.set_num_threads(options.threads)
        # By name, not by a handle argument: a restartable actor should not hold references in its
        # constructor arguments (Ray warns that a restart may fail once they go out of scope).
        global_policy = ray.get_actor(global_name, namespace=NAMESPACE)
        self.cfg, self.gp, self.agent_id, self.opts = cfg, global_policy, agent_id, options
        self.incarnation = incarnation()
        self.learner = local_learner(cfg, options.agent_traces(agent_id), seed, [agent_id, self.incarnation],
                                     options.local_settings(), salt=agent_id)
        # A shape agent's push follows seconds of rollouts and its next collection should start from
        # the master's weights, not only its own improvement: it waits for each reply (a few ms).
        self.max_in_flight = 1 if cfg.policy.arch == "shape" else options.max_in_flight
        self._first: Any = global_policy.get_weights.remote()  # prefetched while the actor finishes starting
        self._version: int = -1  # the global update count of the weights loaded
        self._pending: list[ray.ObjectRef] = []
        self._turns: int = 0
        self._known: int = -1  # the largest update count a reply reported

    def run(self, n_updates: int) -> AgentReport:
        """Push ``n_updates`` gradients; returns what was collected."""
        return self._loop(lambda r: r.pushed >= n_updates)

    def run_until(self, updates: int) -> AgentReport:
        """Push until the global update count reaches ``updates`` (pushes beyond it are dropped)."""
        return self._loop(lambda r: r.last_update >= updates, limit=updates)

    def run_for(self, seconds: float) -> AgentReport:
        """Push gradients until ``seconds`` of wall time have passed (at least one)."""
        return self._loop(lambda r: r.seconds >= seconds)

    def stats(self) -> dict[str, Any]:
        """What it saw of its own cluster (:meth:`~clusters.a3c.local.LocalLearner.stats`)."""
        return self.learner.stats()

    def _loop(self, done: Callable[[AgentReport], bool], limit: int | None = None) -> AgentReport:
        t0 = time.perf_counter()
        rep = AgentReport(self.agent_id, 0, 0, 0, 0.0, self._known, self.incarnation)
        if self._version < 0:
            self._take(*ray.get(self._first))
        while not done(rep):
            push = self.learner.compute(self._version)
            self._turns += 1
            pull = self._turns % self.opts.pull_every == 0 or self.max_in_flight == 1
            self._pending.append(self.gp.push.remote(push.grad, push.row, self.agent_id, limit, pull,
                                                     self._version))
            rep.pushed += 1
            rep.slots += push.slots
            rep.steps += push.steps
            self._replies(rep, wait_oldest=len(self._pending) >= self.max_in_flight)
            rep.seconds = time.perf_counter() - t0
        self._replies(rep, wait_all=True)  # a failed push raises here, before reporting success
        rep.seconds = time.perf_counter() - t0
        return rep

    def _replies(self, rep: AgentReport, wait_oldest: bool = False, wait_all: bool = False) -> None:
        """Take up the answered pushes, in order: the newest weights and the largest update count."""
        n = len(self._pending)
        if n == 0:
            return
        if wait_all:
            k = n
        else:
            answered, _ = ray.wait(self._pending, num_returns=n, timeout=0)
            k = next((i for i, ref in enumerate(self._pending) if ref not in answered), n)
            k = max(k, 1 if wait_oldest else 0)
        ready, self._pending = self._pending[:k], self._pending[k:]
        newest = None
        for updates, weights in ray.get(ready):
            self._known = max(self._known, updates)
            if weights is not None:
                newest = (updates, weights)
        if newest is not None:
            self._take(*newest)
        rep.last_update = self._known

    def _take(self, updates: int, weights: np.ndarray) -> None:
        if updates < self._version:
            return
        self.learner.take(weights)
        self._version = updates
        self._known = max(self._known, updates)


ClusterAgent = actor_class(ClusterAgentImpl, num_cpus=1, max_task_retries=-1)
"""The Ray actor class of :class:`ClusterAgentImpl`; one CPU each (the agents do the work)."""


@dataclass
class A3CResult:
    """Experience summed over the agents' calls, and calls retried after an agent restart."""

    updates: int
    per_agent: dict[int, int]
    slots: int
    steps: int
    seconds: float
    restarts: int
    reports: list[AgentReport] = field(default_factory=list)
    refused: dict[str, int] = field(default_factory=dict)  # pushes the GlobalPolicy refused, by reason


def global_policy_name(checkpoint: Path | None) -> str:
    """The GlobalPolicy actor's name for a run writing ``checkpoint``: ``dl2ray-a3c-<stem>-<hash>``
    (the hash of the absolute path; a run without a checkpoint is named after this process)."""
    import hashlib

    if checkpoint is None:
        return f"dl2ray-a3c-pid{os.getpid()}-{next(_UNNAMED)}"
    path = str(Path(checkpoint).resolve())
    return f"dl2ray-a3c-{Path(path).stem}-{hashlib.sha256(path.encode()).hexdigest()[:10]}"


_UNNAMED = itertools.count()


def _name_free(name: str, wait_s: float = 10.0) -> bool:
    """True once no actor holds ``name`` (a run's GlobalPolicy just killed may take a moment to go)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


class A3CRun:
    """The driver: one GlobalPolicy and ``options.agents`` ClusterAgents on the current Ray instance.

    ``checkpoint``: the GlobalPolicy's checkpoint path (``OUT``; ``None``:
    nothing written); ``resume``: continue from an A3C checkpoint there.
    """

    def __init__(self, cfg: ExperimentConfig, init: Path | None, seed: int, checkpoint: Path | None,
                 options: A3COptions | None = None, logdir: Path | None = None, resume: bool = False) -> None:
        self.opts = options or A3COptions()
        cfg = with_hidden_of(cfg, init)
        name = self.name = global_policy_name(checkpoint)
        if not _name_free(name):
            raise RuntimeError(f"a GlobalPolicy named {name!r} already runs in namespace {NAMESPACE!r}: "
                               f"another run writes {checkpoint}")
        # Owned by this driver (it goes when the run does), but named in a fixed namespace: another
        # process (Serve's weight pull, a federation member) finds it by global_policy_name(OUT).
        self.gp = GlobalPolicy.options(name=name, namespace=NAMESPACE).remote(
            cfg, str(init) if init else None, seed, str(checkpoint) if checkpoint else None, self.opts,
            str(logdir) if logdir else None, resume)
        self.arch = cfg.policy.arch
        agent = ClusterAgent.options(max_restarts=self.opts.agent_restarts)
        self.agents = [agent.remote(cfg, name, i, seed, self.opts) for i in range(self.opts.agents)]
        self.restarts = 0
        self.reports: list[AgentReport] = []

    def stats(self) -> dict[str, Any]:
        return ray.get(self.gp.stats.remote())

    def updates(self) -> int:
        return int(self.stats()["updates"])

    def train(self, updates: int, on_progress: Callable[[dict[str, Any]], None] | None = None,
              poll_s: float = 1.0) -> int:
        """Run the agents until the global update count is ``updates`` (exactly); returns it.

        Each agent runs one long call; the driver only looks at the GlobalPolicy's
        ``stats()`` every ``poll_s`` seconds for ``on_progress``. A call whose
        agent died is retried by Ray once the agent is back (``max_task_retries``);
        one that ran out of retries while the agent restarted is sent again; an
        agent out of restarts raises.
        """
        ray.get(self.gp.start.remote())
        running = {a.run_until.remote(updates): i for i, a in enumerate(self.agents)}
        while running:
            ready, _ = ray.wait(list(running), num_returns=len(running), timeout=poll_s)
            for ref in ready:
                i = running.pop(ref)
                try:
                    self.reports.append(ray.get(ref))
                except ActorUnavailableError:
                    self.restarts += 1
                    running[self.agents[i].run_until.remote(updates)] = i
            if on_progress is not None:
                on_progress(self.stats())
        return self.updates()

    def finish(self) -> RLResult:
        """Let the GlobalPolicy finish its validations and write its files; the run's history."""
        return ray.get(self.gp.finish.remote())

    def run_for(self, seconds: float) -> list[AgentReport]:
        """Every agent runs for ``seconds`` (the throughput benchmark)."""
        reps = ray.get([a.run_for.remote(seconds) for a in self.agents])
        self.reports.extend(reps)
        return reps

    def result(self) -> A3CResult:
        st = self.stats()
        restarted = self.restarts + sum(r.incarnation for r in self.reports)
        return A3CResult(st["updates"], st["per_agent"], sum(r.slots for r in self.reports),
                         sum(r.steps for r in self.reports), sum(r.seconds for r in self.reports),
                         restarted, list(self.reports), dict(st["refused"]))

    def agent_stats(self) -> list[dict[str, Any]]:
        """Each agent's view of its own cluster (shape: ``cluster_jct``, ``observed``; paper: empty)."""
        return ray.get([a.stats.remote() for a in self.agents])

    def save(self, path: Path) -> None:
        ray.get(self.gp.save.remote(str(path)))

    def shutdown(self) -> None:
        for a in self.agents:
            ray.kill(a, no_restart=True)
        ray.kill(self.gp, no_restart=True)  # its validator goes with it (owned by it)


def train_a3c(cfg: ExperimentConfig, init: Path | None, updates: int, seed: int, out: Path,
              options: A3COptions | None = None, logdir: Path | None = None, resume: bool = False,
              on_progress: Callable[[dict[str, Any]], None] | None = None) -> tuple[RLResult, A3CResult]:
    """Train until ``updates`` global updates; ``OUT``, ``OUT.best.pt``, ``OUT.json`` (and ``logdir``).

    ``resume``: continue from the A3C checkpoint ``out``. Needs a running Ray instance.
    """
    run = A3CRun(cfg, init, seed, out, options, logdir, resume)
    try:
        run.train(updates, on_progress)
        history = run.finish()
        return history, run.result()
    finally:
        run.shutdown()
