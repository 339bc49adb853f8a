"""Federated A3C on Ray actors: one :class:`GlobalPolicy`, N :class:`ClusterAgent` s.

Architecture (``docs/policy.md``, "A3C"):

- :class:`GlobalPolicy` holds the master policy and value networks and the
  :class:`~dl2ray.learn.actor_critic.ActorCriticOptimizer` (two Adams). Each
  gradient is applied **on arrival** (:meth:`GlobalPolicy.apply_gradients`),
  whatever weights it was computed on (Hogwild-style staleness, as in A3C).
  Every ``checkpoint_every`` updates it writes its checkpoint (networks,
  optimiser state, update counts) atomically; on (re)start it resumes from that
  checkpoint when it exists, so an actor with ``max_restarts`` loses at most
  ``checkpoint_every - 1`` updates.
- :class:`ClusterAgent` is bound to its own :class:`~clusters.backend.ClusterBackend`
  and its own trace stream: agent ``i`` cycles the training seeds
  ``seeds.training(traces, offset=i·traces)`` (disjoint from every other
  agent's). Its loop: take the weights pulled after its previous push, collect
  ``steps_per_update`` decision steps with the sampled policy (and job-aware
  exploration), compute the gradient locally, push it with ``.remote()``
  without waiting for the result, and ask for fresh weights. A killed agent is
  restarted by Ray (``max_restarts``) with its ``__init__`` state: it pulls the
  current weights and starts its stream again from its first trace.

There is no replay in A3C: every gradient comes from the agent's fresh,
on-policy experience (the parallel agents decorrelate it instead).

Random streams: networks from ``seed`` (when not from ``init``); agent ``i``'s
action sampling from ``[seed, 1, i, incarnation]`` and exploration from
``[seed, 2, i, incarnation]``, where ``incarnation`` is 1 once Ray has
restarted that agent (so a restarted agent does not replay the first samples).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch
from ray.exceptions import ActorUnavailableError

from clusters.sim_backend import SimBackend
from dl2ray.config import ExperimentConfig
from dl2ray.learn import seeds as seedsets
from dl2ray.learn.actor_critic import ActorCriticOptimizer, LossConfig, compute_gradients, flatten
from dl2ray.learn.exploration import JobAwareExploration
from dl2ray.learn.rollout import Collector, to_batch
from dl2ray.policy.encoding import Encoding
from dl2ray.policy.network import (
    NumpyPolicy,
    PolicyNet,
    ValueNet,
    build_networks,
    load_checkpoint,
    save_checkpoint,
)


@dataclass(frozen=True)
class A3COptions:
    """One A3C run's schedule and switches."""

    traces: int = 100  # training traces per agent (agent i: training seeds i·traces .. (i+1)·traces-1)
    steps_per_update: int | None = None  # decision steps per gradient; None: policy.minibatch
    checkpoint_every: int = 50  # global updates between checkpoints of the GlobalPolicy
    exploration: bool = True  # job-aware exploration in the agents
    max_grad_norm: float | None = None  # per-network clip in the GlobalPolicy; None: none
    agent_restarts: int = 3  # Ray restarts allowed per agent (-1: unlimited)
    threads: int = 1  # torch CPU threads per actor


def _networks(cfg: ExperimentConfig, init: str | None, seed: int) -> tuple[PolicyNet, ValueNet]:
    enc = Encoding.from_config(cfg)
    if init is None:
        return build_networks(enc, cfg.policy.hidden, seed)
    ckpt = load_checkpoint(init, expect=enc, catalogue=cfg.catalogue.names)
    return ckpt.policy, ckpt.value


def _params_vector(policy: PolicyNet, value: ValueNet) -> np.ndarray:
    """All parameters, policy then value, as one float32 vector (the order of every gradient list)."""
    with torch.no_grad():
        vec = torch.nn.utils.parameters_to_vector([*policy.parameters(), *value.parameters()])
    return vec.numpy().astype(np.float32, copy=True)


def _load_vector(policy: PolicyNet, value: ValueNet, vec: np.ndarray) -> None:
    # Arrays from ray.get are read-only views of the object store: copy before torch owns them.
    t = torch.from_numpy(np.array(vec, dtype=np.float32, copy=True))
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(t, [*policy.parameters(), *value.parameters()])


class GlobalPolicyImpl:
    """The master copy (see the module docstring); the plain class behind the :data:`GlobalPolicy` actor.

    ``checkpoint``: path of the checkpoint written every ``checkpoint_every``
    updates (``None``: never written); read back in ``__init__`` if present.
    """

    def __init__(self, cfg: ExperimentConfig, init: str | None, seed: int, checkpoint: str | None,
                 checkpoint_every: int = 50, max_grad_norm: float | None = None, threads: int = 1) -> None:
        torch.set_num_threads(threads)
        self.cfg, self.seed = cfg, seed
        self.checkpoint = Path(checkpoint) if checkpoint else None
        self.checkpoint_every = checkpoint_every
        self.policy, self.value = _networks(cfg, init, seed)
        self.opt = ActorCriticOptimizer(self.policy, self.value, cfg.policy.rl_lr, max_grad_norm)
        self.per_agent: dict[int, int] = {}
        self.resumed = False
        if self.checkpoint is not None and self.checkpoint.exists():
            self._restore(self.checkpoint)

    def apply_gradients(self, flat_grad: np.ndarray, agent_id: int) -> int:
        """One Adam step of both networks with a flat gradient (float32, :func:`flatten` layout).

        Returns the update count after it; checkpoints when it is a multiple of ``checkpoint_every``.
        """
        self.opt.apply_gradients(np.array(flat_grad, dtype=np.float32, copy=True))
        self.per_agent[agent_id] = self.per_agent.get(agent_id, 0) + 1
        if self.checkpoint is not None and self.opt.updates % self.checkpoint_every == 0:
            self.save(str(self.checkpoint))
        return self.opt.updates

    def get_weights(self) -> tuple[int, np.ndarray]:
        """``(updates, parameters)``: the update count and the flat parameter vector (policy then value)."""
        return self.opt.updates, _params_vector(self.policy, self.value)

    def stats(self) -> dict[str, Any]:
        """``updates`` (total), ``per_agent`` (updates per agent id), ``resumed`` (from a checkpoint)."""
        return {"updates": self.opt.updates, "per_agent": dict(self.per_agent), "resumed": self.resumed}

    def save(self, path: str) -> None:
        """Write the checkpoint atomically (a kill mid-write leaves the previous one intact)."""
        target = Path(path)
        tmp = target.with_name(target.name + ".tmp")
        extra = {"kind": "a3c", "seed": self.seed, "updates": self.opt.updates,
                 "optimizer": self.opt.state_dict(), "per_agent": dict(self.per_agent)}
        save_checkpoint(tmp, self.policy, self.value, self.cfg.catalogue.names, extra=extra)
        os.replace(tmp, target)

    def _restore(self, path: Path) -> None:
        ckpt = load_checkpoint(path, expect=self.policy.enc, catalogue=self.cfg.catalogue.names)
        if ckpt.extra.get("kind") != "a3c":
            raise ValueError(f"{path}: not an A3C checkpoint; cannot resume from it")
        self.policy.load_state_dict(ckpt.policy.state_dict())
        self.value.load_state_dict(ckpt.value.state_dict())
        self.opt.load_state_dict(ckpt.extra["optimizer"])
        self.per_agent = {int(k): int(v) for k, v in ckpt.extra["per_agent"].items()}
        self.resumed = True


@dataclass
class AgentReport:
    """What one :meth:`ClusterAgentImpl.run` call did: gradients pushed, slots and steps collected."""

    agent_id: int
    pushed: int
    slots: int
    steps: int
    seconds: float
    last_update: int  # the global update count of the last weights it pulled
    incarnation: int  # 1 if this agent is a Ray restart, else 0


class ClusterAgentImpl:
    """One agent on its own backend and trace stream (module docstring); behind :data:`ClusterAgent`."""

    def __init__(self, cfg: ExperimentConfig, global_policy: Any, agent_id: int, seed: int,
                 options: A3COptions) -> None:
        torch.set_num_threads(options.threads)
        self.cfg, self.gp, self.agent_id, self.opts = cfg, global_policy, agent_id, options
        self.incarnation = _incarnation()
        self.enc = Encoding.from_config(cfg)
        self.policy, self.value = build_networks(self.enc, cfg.policy.hidden, seed)  # overwritten by pulls
        self.loss_cfg = LossConfig.from_config(cfg)
        explore = JobAwareExploration.from_config(cfg) if options.exploration else None
        streams = [seed, agent_id, self.incarnation]
        self.collector = Collector(
            SimBackend.from_config(cfg),  # type: ignore[arg-type]  # duck-typed: reset/step(.view/.reward/.done)
            self.enc, seedsets.training(options.traces, offset=agent_id * options.traces),
            np.random.default_rng([streams[0], 1, *streams[1:]]), explore,
            np.random.default_rng([streams[0], 2, *streams[1:]]))
        self.steps_per_update = options.steps_per_update or cfg.policy.minibatch
        self._weights = global_policy.get_weights.remote()
        self._pending: list[ray.ObjectRef] = []

    def run(self, n_updates: int) -> AgentReport:
        """Push ``n_updates`` gradients; returns what was collected."""
        return self._loop(lambda r: r.pushed >= n_updates)

    def run_for(self, seconds: float) -> AgentReport:
        """Push gradients until ``seconds`` of wall time have passed (at least one)."""
        return self._loop(lambda r: r.seconds >= seconds)

    def _loop(self, done) -> AgentReport:
        t0 = time.perf_counter()
        rep = AgentReport(self.agent_id, 0, 0, 0, 0.0, -1, self.incarnation)
        while True:
            rep.last_update, vec = ray.get(self._weights)
            _load_vector(self.policy, self.value, vec)
            records = self.collector.collect(NumpyPolicy.from_torch(self.policy), self.steps_per_update)
            batch = to_batch(records, self.enc, self.loss_cfg.gamma)
            grads, _ = compute_gradients(self.policy, self.value, batch, self.loss_cfg)
            self._pending.append(self.gp.apply_gradients.remote(flatten(grads), self.agent_id))
            # Actor calls from one caller run in order: these weights include the gradient just pushed.
            self._weights = self.gp.get_weights.remote()
            ready, self._pending = ray.wait(self._pending, num_returns=len(self._pending), timeout=0)
            ray.get(ready)  # raise here if a push failed
            rep.pushed += 1
            rep.slots += len(records)
            rep.steps += sum(len(r.steps) for r in records)
            rep.seconds = time.perf_counter() - t0
            if done(rep):
                ray.get(self._pending)  # surface a failed push before reporting success
                self._pending = []
                return rep


def _incarnation() -> int:
    try:
        ctx = ray.get_runtime_context()
        return int(ctx.was_current_actor_reconstructed)
    except Exception:  # outside an actor (unit use of the plain class)
        return 0


# max_task_retries=-1: a call in flight when its actor dies, or sent while it restarts, runs again once
# the actor is back (at least once). For a push that means a gradient may be applied twice, which A3C's
# stale, unsynchronised updates tolerate; a lost run() call simply collects again.
GlobalPolicy = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)(GlobalPolicyImpl)
"""The Ray actor class of :class:`GlobalPolicyImpl` (no CPU reserved: it is idle between pushes)."""

ClusterAgent = ray.remote(num_cpus=1, max_task_retries=-1)(ClusterAgentImpl)
"""The Ray actor class of :class:`ClusterAgentImpl`; one CPU each (the agents do the work)."""


@dataclass
class A3CResult:
    """A finished run: global updates, per-agent counts, experience summed over calls, restarted calls."""

    updates: int
    per_agent: dict[int, int]
    slots: int
    steps: int
    seconds: float
    restarts: int
    reports: list[AgentReport] = field(default_factory=list)


class A3CRun:
    """The driver: one GlobalPolicy and ``agents`` ClusterAgents, started on the current Ray instance.

    ``checkpoint`` is the GlobalPolicy's checkpoint path; a run started on an
    existing one resumes from it.
    """

    def __init__(self, cfg: ExperimentConfig, init: Path | None, agents: int, seed: int,
                 checkpoint: Path | None, options: A3COptions | None = None) -> None:
        self.opts = options or A3COptions()
        self.gp = GlobalPolicy.remote(cfg, str(init) if init else None, seed,
                                      str(checkpoint) if checkpoint else None, self.opts.checkpoint_every,
                                      self.opts.max_grad_norm, self.opts.threads)
        self.agents = [
            ClusterAgent.options(max_restarts=self.opts.agent_restarts).remote(
                cfg, self.gp, i, seed, self.opts)
            for i in range(agents)
        ]
        self.restarts = 0
        self.reports: list[AgentReport] = []

    def updates(self) -> int:
        return int(ray.get(self.gp.stats.remote())["updates"])

    def train(self, updates: int, chunk: int = 4) -> int:
        """Run the agents until the global update count reaches ``updates``; returns the count.

        Agents work in calls of at most ``chunk`` pushes (fewer near the target), so
        the count may overshoot by up to ``agents - 1``. A call whose agent died is
        retried by Ray once the agent is restarted (``max_task_retries``); an agent
        out of restarts raises.
        """
        count = self.updates()

        def calls() -> int:  # pushes per call: at most chunk, fewer near the target to limit overshoot
            return max(1, min(chunk, -(-(updates - count) // len(self.agents))))

        running: dict[ray.ObjectRef, int] = {a.run.remote(calls()): i for i, a in enumerate(self.agents)}
        while running:
            [ref], _ = ray.wait(list(running), num_returns=1)
            i = running.pop(ref)
            try:
                rep: AgentReport = ray.get(ref)
                self.reports.append(rep)
                count = max(count, rep.last_update + 1)
            except ActorUnavailableError:  # retries ran out while it restarted: ask again
                self.restarts += 1
            count = max(count, self.updates())
            if count < updates:
                running[self.agents[i].run.remote(calls())] = i
        return self.updates()

    def run_for(self, seconds: float) -> list[AgentReport]:
        """Every agent runs for ``seconds`` (the throughput benchmark)."""
        reps = ray.get([a.run_for.remote(seconds) for a in self.agents])
        self.reports.extend(reps)
        return reps

    def result(self) -> A3CResult:
        st = ray.get(self.gp.stats.remote())
        restarted = self.restarts + sum(r.incarnation for r in self.reports)
        return A3CResult(st["updates"], st["per_agent"], sum(r.slots for r in self.reports),
                         sum(r.steps for r in self.reports), sum(r.seconds for r in self.reports),
                         restarted, list(self.reports))

    def save(self, path: Path) -> None:
        ray.get(self.gp.save.remote(str(path)))

    def shutdown(self) -> None:
        for a in self.agents:
            ray.kill(a, no_restart=True)
        ray.kill(self.gp, no_restart=True)


def train_a3c(cfg: ExperimentConfig, init: Path | None, agents: int, updates: int, out: Path, seed: int,
              options: A3COptions | None = None) -> A3CResult:
    """Train with ``agents`` agents until ``updates`` global updates; write ``out`` (resumable).

    ``out`` doubles as the GlobalPolicy's periodic checkpoint: an existing
    A3C checkpoint there is resumed. Needs a running Ray instance.
    """
    run = A3CRun(cfg, init, agents, seed, out, options)
    try:
        run.train(updates)
        run.save(out)
        return run.result()
    finally:
        run.shutdown()
