"""Federated A3C on Ray actors: one :class:`GlobalPolicy`, N :class:`ClusterAgent` s, one validator.

Architecture (``docs/policy.md``, "Federated A3C"):

- :class:`GlobalPolicy` holds the master policy and value networks and the
  :class:`~dl2ray.learn.actor_critic.ActorCriticOptimizer` (two Adams). Each
  gradient is applied **on arrival** (:meth:`GlobalPolicyImpl.push`), whatever
  weights it was computed on (Hogwild-style staleness, as in A3C). It keeps the
  run's :class:`~dl2ray.learn.rl.RLResult` (one :class:`~dl2ray.learn.rl.UpdateRow`
  per applied gradient, with the losses the agent computed; validation rows),
  logs both to TensorBoard, and every ``checkpoint_every`` updates writes its
  checkpoint (networks, optimiser state, counts, result; atomically) and the
  run JSON (:func:`dl2ray.learn.rl.write_run_json`). On a Ray restart it
  resumes from that checkpoint, so a crash loses at most
  ``checkpoint_every - 1`` updates.
- Validation runs **off the update path**, in a :class:`Validator` actor the
  GlobalPolicy owns: at every ``val_every``-th update the GlobalPolicy hands it
  a snapshot of the weights and goes on applying gradients; the greedy
  policy's average JCT on the validation traces
  (:func:`dl2ray.learn.seeds.validation`) comes back later and is logged at the
  snapshot's update, and ``OUT.best.pt`` is rewritten from the snapshot when it
  is the best so far. One validation runs at a time; when another falls due
  meanwhile, the newest due snapshot waits and older waiting ones are dropped
  (a validation of an untrained policy can take longer than many updates).
- :class:`ClusterAgent` is bound to its own :class:`~clusters.agent.backend.ClusterBackend`
  and its own part of the training traces: with N agents, agent ``i`` cycles
  every N-th seed of ``seeds.training(traces)`` from the ``i``-th (disjoint
  parts; together the same set as the single-process trainer's). Its loop:
  collect ``steps_per_update`` decision steps with the sampled policy (and
  job-aware exploration), compute the gradient locally, push it with
  ``.remote()`` **without waiting**, and go on collecting. Every
  ``pull_every``-th push asks for the weights back in the same call; replies
  are taken up when they have arrived, and the agent blocks only when
  ``max_in_flight`` pushes are still unanswered (which bounds staleness and
  memory). A killed agent is restarted by Ray (``max_restarts``) with its
  ``__init__`` state: it pulls the current weights and starts its stream again
  from its first trace.

There is no replay in A3C: every gradient comes from the agent's fresh,
on-policy experience (the parallel agents decorrelate it instead).

Random streams: networks from ``seed`` (when not from ``init``); agent ``i``'s
action sampling from ``[seed, 1, i, incarnation]`` and exploration from
``[seed, 2, i, incarnation]``, where ``incarnation`` is 1 once Ray has
restarted that agent (so a restarted agent does not replay the first samples).
"""

from __future__ import annotations

import dataclasses
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

from clusters.a3c.sim_backend import SimBackend
from dl2ray.config import ExperimentConfig
from dl2ray.learn import rl
from dl2ray.learn import seeds as seedsets
from dl2ray.learn.actor_critic import ActorCriticOptimizer, LossConfig, compute_gradients, flatten
from dl2ray.learn.exploration import JobAwareExploration
from dl2ray.learn.rl import RLResult, UpdateRow, ValidationRow
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
    """One A3C run's switches and schedule (the A3C counterpart of :class:`~dl2ray.learn.rl.RLOptions`)."""

    agents: int = 2  # ClusterAgent actors (one CPU each)
    traces: int = 100  # training traces in all, split between the agents (>= agents)
    val_traces: int = 3  # validation traces for the periodic JCT
    val_every: int | None = 25  # updates between validations; None: never validate (the benchmark)
    checkpoint_every: int = 50  # global updates between checkpoints of the GlobalPolicy
    critic: bool = True  # False: REINFORCE with the minibatch-mean return (agents collect whole episodes)
    exploration: bool = True  # job-aware exploration in the agents
    critic_warmup: int = 0  # first global updates that step only the value network
    steps_per_update: int | None = None  # decision steps per gradient; None: policy.minibatch
    max_grad_norm: float | None = None  # per-network clip in the GlobalPolicy; None: none
    pull_every: int = 1  # an agent asks for fresh weights with every pull_every-th push
    max_in_flight: int = 2  # unanswered pushes after which an agent waits (bounds staleness)
    agent_restarts: int = 3  # Ray restarts allowed per agent (-1: unlimited)
    threads: int = 1  # torch CPU threads per actor (more only steal the other agents' cores)

    def __post_init__(self) -> None:
        if self.agents < 1 or self.traces < self.agents:
            raise ValueError(f"need 1 <= agents ({self.agents}) <= traces ({self.traces}): "
                             "every agent needs training traces of its own")
        if self.pull_every < 1 or self.max_in_flight < 1:
            raise ValueError("pull_every and max_in_flight must be >= 1")

    def agent_traces(self, agent_id: int) -> list[int]:
        """Agent ``agent_id``'s training seeds: every ``agents``-th of ``seeds.training(traces)``."""
        return seedsets.training(self.traces)[agent_id::self.agents]


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


def _incarnation() -> int:
    """1 if the current actor is a Ray restart, else 0 (also 0 outside an actor)."""
    if not ray.is_initialized() or ray.get_runtime_context().get_actor_id() is None:
        return 0  # outside an actor (unit use of the plain classes)
    return int(bool(ray.get_runtime_context().was_current_actor_reconstructed))


class ValidatorImpl:
    """Greedy average JCT of weight snapshots on the validation traces; behind :data:`Validator`."""

    def __init__(self, cfg: ExperimentConfig, val_seeds: list[int], threads: int = 1) -> None:
        torch.set_num_threads(threads)
        self.cfg, self.val_seeds = cfg, val_seeds
        self.policy, self.value = build_networks(Encoding.from_config(cfg), cfg.policy.hidden, 0)

    def baseline(self) -> float:
        """DRF's average JCT (slots) on the validation traces: the reference of every run."""
        return rl.heuristic_jct(self.cfg, "drf", self.val_seeds)

    def validate(self, vec: np.ndarray) -> float:
        """Average JCT (slots) of the greedy policy with parameters ``vec`` (:func:`_params_vector`)."""
        _load_vector(self.policy, self.value, vec)
        return rl.validate(self.cfg, self.policy, self.val_seeds)


Validator = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)(ValidatorImpl)
"""The Ray actor class of :class:`ValidatorImpl` (no CPU reserved: it shares the agents' cores)."""


@dataclass
class _Snapshot:
    update: int
    weights: np.ndarray
    ref: Any = None  # the validator's pending answer, once submitted


class GlobalPolicyImpl:
    """The master copy (see the module docstring); the plain class behind the :data:`GlobalPolicy` actor.

    ``checkpoint``: the path written every ``checkpoint_every`` updates (``None``:
    never); ``OUT.best.pt`` and ``OUT.json`` go beside it. ``resume``: start
    from an existing checkpoint there; a Ray restart always resumes from it.
    ``logdir``: TensorBoard scalars (``rl/...`` as in the single-process trainer).
    """

    def __init__(self, cfg: ExperimentConfig, init: str | None, seed: int, checkpoint: str | None,
                 options: A3COptions, logdir: str | None = None, resume: bool = False) -> None:
        torch.set_num_threads(options.threads)
        self.cfg, self.seed, self.opts = cfg, seed, options
        self.checkpoint = Path(checkpoint) if checkpoint else None
        self.policy, self.value = _networks(cfg, init, seed)
        self.opt = ActorCriticOptimizer(self.policy, self.value, cfg.policy.rl_lr, options.max_grad_norm)
        self.per_agent: dict[int, int] = {}
        self.val_seeds = seedsets.validation(options.val_traces)
        self.result = RLResult(seed, init, 0, self.val_seeds, float("nan"))
        self.resumed = False
        self._clock = time.perf_counter()  # result.wall_seconds: this actor's time since here, plus restored
        if self.checkpoint is not None and self.checkpoint.exists() and (resume or _incarnation()):
            self._restore(self.checkpoint)
        elif self.checkpoint is not None:  # a restart before the first periodic one resumes from this
            self.save(str(self.checkpoint))
        self.writer = rl._writer(Path(logdir)) if logdir else None
        self.validator = (Validator.remote(cfg, self.val_seeds, options.threads)
                          if options.val_every is not None else None)
        self._running: _Snapshot | None = None  # submitted to the validator
        self._waiting: _Snapshot | None = None  # due while another ran; replaced by a newer one

    # -- updates ---------------------------------------------------------------------------

    def push(self, flat_grad: np.ndarray, row: UpdateRow, agent_id: int, limit: int | None = None,
             pull: bool = False) -> tuple[int, np.ndarray | None]:
        """Apply one agent's gradient with the statistics of its minibatch; ``(updates, weights or None)``.

        A push that would exceed ``limit`` updates is dropped (so a run ends at
        exactly ``limit``). ``pull``: return the parameters after it too.
        """
        if limit is None or self.opt.updates < limit:
            self.apply_gradients(flat_grad, agent_id)
            u = self.opt.updates
            row = dataclasses.replace(row, update=u)
            self.result.history.append(row)
            self.result.updates = u
            if self.writer is not None:
                rl._log_update(self.writer, row)
            every = self.opts.val_every
            if every is not None and (u % every == 0 or u == limit):
                self._due(_Snapshot(u, _params_vector(self.policy, self.value)))
            if self.checkpoint is not None and (u % self.opts.checkpoint_every == 0 or u == limit):
                self._write()
        self._poll()
        return self.opt.updates, (_params_vector(self.policy, self.value) if pull else None)

    def apply_gradients(self, flat_grad: np.ndarray, agent_id: int) -> int:
        """One Adam step of both networks with a flat gradient (float32, :func:`flatten` layout).

        The value network only during the first ``critic_warmup`` updates.
        Returns the update count after it (no history row; :meth:`push` adds one).
        """
        self.opt.apply_gradients(np.array(flat_grad, dtype=np.float32, copy=True),
                                 train_policy=self.opt.updates >= self.opts.critic_warmup)
        self.per_agent[agent_id] = self.per_agent.get(agent_id, 0) + 1
        return self.opt.updates

    def get_weights(self) -> tuple[int, np.ndarray]:
        """``(updates, parameters)``: the update count and the flat parameter vector (policy then value)."""
        return self.opt.updates, _params_vector(self.policy, self.value)

    def checkpoint_bytes(self, since: int = -1) -> tuple[int, bytes | None]:
        """``(updates, checkpoint)``: the current networks as the bytes of a checkpoint file
        (:func:`~dl2ray.policy.network.save_checkpoint`; ``kind`` ``"a3c-snapshot"``), or ``None`` when the
        update count is still ``since``. The Serve endpoint pulls its weights with it (by actor name)."""
        import tempfile

        if self.opt.updates == since:
            return since, None
        with tempfile.TemporaryDirectory(prefix="dl2ray-gp-") as tmp:
            path = Path(tmp) / "snapshot.pt"
            save_checkpoint(path, self.policy, self.value, self.cfg.catalogue.names,
                            extra={"kind": "a3c-snapshot", "seed": self.seed, "updates": self.opt.updates})
            return self.opt.updates, path.read_bytes()

    def stats(self) -> dict[str, Any]:
        """``updates`` (total), ``per_agent`` (updates per agent id), ``resumed`` (from a checkpoint),
        ``last_val`` (the latest validation row as a dict, or None)."""
        last = self.result.validation[-1] if self.result.validation else None
        return {"updates": self.opt.updates, "per_agent": dict(self.per_agent), "resumed": self.resumed,
                "last_val": dataclasses.asdict(last) if last else None}

    # -- validation --------------------------------------------------------------------------

    def start(self) -> None:
        """Before the first update of a run: DRF's reference JCT and the validation at update 0."""
        if self.validator is None or self.result.validation or self._running is not None:
            return
        self.result.baseline_avg_jct = float(ray.get(self.validator.baseline.remote()))
        self._due(_Snapshot(self.opt.updates, _params_vector(self.policy, self.value)))

    def finish(self) -> RLResult:
        """Wait for the validations still due; write checkpoint and run JSON; flush the logs."""
        while self._running is not None:
            self._poll(block=True)
        if self.checkpoint is not None:
            self._write()
        else:
            self._tick()
        if self.writer is not None:
            self.writer.flush()
        return self.result

    def _due(self, snap: _Snapshot) -> None:
        if self._running is None:
            self._submit(snap)
        else:
            self._waiting = snap

    def _submit(self, snap: _Snapshot) -> None:
        assert self.validator is not None
        snap.ref = self.validator.validate.remote(snap.weights)
        self._running = snap

    def _poll(self, block: bool = False) -> None:
        """Take up a finished validation (waiting for it if ``block``); submit the waiting snapshot."""
        snap = self._running
        if snap is None:
            return
        ready, _ = ray.wait([snap.ref], timeout=None if block else 0)
        if not ready:
            return
        row = ValidationRow(snap.update, float(ray.get(snap.ref)))
        best = self.result.best
        self.result.validation.append(row)
        if self.writer is not None:
            rl._log_validation(self.writer, row)
        if self.checkpoint is not None and (best is None or row.avg_jct < best.avg_jct):
            self._save_best(snap)
        self._running, waiting, self._waiting = None, self._waiting, None
        if waiting is not None:
            self._submit(waiting)

    def _save_best(self, snap: _Snapshot) -> None:
        assert self.checkpoint is not None
        policy, value = build_networks(self.policy.enc, self.cfg.policy.hidden, 0)
        _load_vector(policy, value, snap.weights)
        extra = {"kind": "a3c-best", "seed": self.seed, "updates": snap.update,
                 "val_avg_jct": self.result.validation[-1].avg_jct}
        _atomic_save(self.checkpoint.with_suffix(".best.pt"), policy, value, self.cfg.catalogue.names, extra)

    # -- checkpoints ---------------------------------------------------------------------------

    def _tick(self) -> None:
        now = time.perf_counter()
        self.result.wall_seconds += now - self._clock
        self._clock = now

    def _write(self) -> None:
        assert self.checkpoint is not None
        self._tick()
        self.save(str(self.checkpoint))
        # write_run_json reads .seed, .opts (a dataclass with .traces) and .result: this class has them.
        rl.write_run_json(self.checkpoint.with_suffix(".json"), self.cfg, self)  # type: ignore[arg-type]

    def save(self, path: str) -> None:
        """Write the checkpoint atomically (a kill mid-write leaves the previous one intact)."""
        extra = {"kind": "a3c", "seed": self.seed, "updates": self.opt.updates,
                 "optimizer": self.opt.state_dict(),
                 "per_agent": {str(k): v for k, v in self.per_agent.items()},
                 "options": dataclasses.asdict(self.opts), "result": dataclasses.asdict(self.result)}
        _atomic_save(Path(path), self.policy, self.value, self.cfg.catalogue.names, extra)

    def _restore(self, path: Path) -> None:
        ckpt = load_checkpoint(path, expect=self.policy.enc, catalogue=self.cfg.catalogue.names)
        ex = ckpt.extra
        if ex.get("kind") != "a3c":
            raise ValueError(f"{path}: not an A3C checkpoint; cannot resume from it")
        self.policy.load_state_dict(ckpt.policy.state_dict())
        self.value.load_state_dict(ckpt.value.state_dict())
        self.opt.load_state_dict(ex["optimizer"])
        self.per_agent = {int(k): int(v) for k, v in ex["per_agent"].items()}
        r = ex["result"]
        self.result.init = r["init"]
        self.result.updates = int(r["updates"])
        self.result.baseline_avg_jct = float(r["baseline_avg_jct"])
        self.result.wall_seconds = float(r.get("wall_seconds", 0.0))
        self.result.history = [UpdateRow(**row) for row in r["history"]]
        self.result.validation = [ValidationRow(**row) for row in r["validation"]]
        self.resumed = True


def _atomic_save(target: Path, policy: PolicyNet, value: ValueNet, catalogue, extra: dict) -> None:
    tmp = target.with_name(target.name + ".tmp")
    save_checkpoint(tmp, policy, value, catalogue, extra=extra)
    os.replace(tmp, target)


def _with_hidden_of(cfg: ExperimentConfig, init: Path | None) -> ExperimentConfig:
    """``cfg`` with the ``init`` checkpoint's ``policy.hidden``: agents and validator build its shapes."""
    if init is None:
        return cfg
    hidden = load_checkpoint(init).meta.hidden
    return cfg.model_copy(update={"policy": cfg.policy.model_copy(update={"hidden": hidden})})


def checkpoint_kind(path: Path) -> str | None:
    """The ``kind`` a checkpoint records (``"a3c"``, ``"rl"``, ...) or None; CheckpointError if unreadable."""
    return load_checkpoint(path).extra.get("kind")


@dataclass
class AgentReport:
    """What one agent call did: gradients pushed, slots and steps collected."""

    agent_id: int
    pushed: int
    slots: int
    steps: int
    seconds: float
    last_update: int  # the largest global update count a reply reported (-1: none yet)
    incarnation: int  # 1 if this agent is a Ray restart, else 0


class ClusterAgentImpl:
    """One agent on its own backend and trace stream (module docstring); behind :data:`ClusterAgent`."""

    def __init__(self, cfg: ExperimentConfig, global_name: str, agent_id: int, seed: int,
                 options: A3COptions) -> None:
        torch.set_num_threads(options.threads)
        # By name, not by a handle argument: a restartable actor should not hold references in its
        # constructor arguments (Ray warns that a restart may fail once they go out of scope).
        global_policy = ray.get_actor(global_name, namespace=A3C_NAMESPACE)
        self.cfg, self.gp, self.agent_id, self.opts = cfg, global_policy, agent_id, options
        self.incarnation = _incarnation()
        self.enc = Encoding.from_config(cfg)
        self.policy, self.value = build_networks(self.enc, cfg.policy.hidden, seed)  # overwritten by pulls
        self.loss_cfg = LossConfig.from_config(cfg, critic=options.critic)
        explore = JobAwareExploration.from_config(cfg) if options.exploration else None
        streams = [seed, agent_id, self.incarnation]
        self.collector = Collector(
            SimBackend.from_config(cfg),  # type: ignore[arg-type]  # duck-typed: reset/step(.view/.reward/.done)
            self.enc, options.agent_traces(agent_id),
            np.random.default_rng([streams[0], 1, *streams[1:]]), explore,
            np.random.default_rng([streams[0], 2, *streams[1:]]))
        self.steps_per_update = options.steps_per_update or cfg.policy.minibatch
        self._first = global_policy.get_weights.remote()  # prefetched while the actor finishes starting
        self._version = -1  # the global update count of the weights loaded
        self._numpy: NumpyPolicy | None = None
        self._pending: list[ray.ObjectRef] = []
        self._turns = 0
        self._known = -1  # the largest update count a reply reported

    def run(self, n_updates: int) -> AgentReport:
        """Push ``n_updates`` gradients; returns what was collected."""
        return self._loop(lambda r: r.pushed >= n_updates)

    def run_until(self, updates: int) -> AgentReport:
        """Push until the global update count reaches ``updates`` (pushes beyond it are dropped)."""
        return self._loop(lambda r: r.last_update >= updates, limit=updates)

    def run_for(self, seconds: float) -> AgentReport:
        """Push gradients until ``seconds`` of wall time have passed (at least one)."""
        return self._loop(lambda r: r.seconds >= seconds)

    def _loop(self, done: Callable[[AgentReport], bool], limit: int | None = None) -> AgentReport:
        t0 = time.perf_counter()
        rep = AgentReport(self.agent_id, 0, 0, 0, 0.0, self._known, self.incarnation)
        if self._numpy is None:
            self._take(*ray.get(self._first))
        while not done(rep):
            records = self.collector.collect(self._numpy, self.steps_per_update,
                                             whole_episodes=not self.loss_cfg.critic)
            batch = to_batch(records, self.enc, self.loss_cfg.gamma)
            # The entropy weight may decay with the global update count: that of the weights in use.
            loss_cfg = LossConfig.from_config(self.cfg, self.opts.critic, max(self._version, 0))
            grads, st = compute_gradients(self.policy, self.value, batch, loss_cfg)
            row = UpdateRow(-1, st.policy_loss, st.value_loss, st.entropy,
                            float(np.mean([r.reward for r in records])), st.mean_value, len(batch),
                            len(records), sum(r.explored for r in records))
            self._turns += 1
            pull = self._turns % self.opts.pull_every == 0
            self._pending.append(self.gp.push.remote(flatten(grads), row, self.agent_id, limit, pull))
            rep.pushed += 1
            rep.slots += len(records)
            rep.steps += len(batch)
            self._replies(rep, wait_oldest=len(self._pending) >= self.opts.max_in_flight)
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
        if updates < self._version and self._numpy is not None:
            return
        _load_vector(self.policy, self.value, weights)
        self._numpy = NumpyPolicy.from_torch(self.policy)
        self._version = updates
        self._known = max(self._known, updates)


# max_task_retries=-1: a call in flight when its actor dies, or sent while it restarts, runs again once
# the actor is back (at least once). For a push that means a gradient may be applied twice, which A3C's
# stale, unsynchronised updates tolerate; a lost run() call simply collects again.
GlobalPolicy = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)(GlobalPolicyImpl)
"""The Ray actor class of :class:`GlobalPolicyImpl` (no CPU reserved: a push costs it ~3 ms)."""

ClusterAgent = ray.remote(num_cpus=1, max_task_retries=-1)(ClusterAgentImpl)
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


A3C_NAMESPACE = "dl2ray"
"""Ray namespace of every run's GlobalPolicy (and the agents' look-up of it)."""


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
            ray.get_actor(name, namespace=A3C_NAMESPACE)
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
        cfg = _with_hidden_of(cfg, init)
        name = self.name = global_policy_name(checkpoint)
        if not _name_free(name):
            raise RuntimeError(f"a GlobalPolicy named {name!r} already runs in namespace {A3C_NAMESPACE!r}: "
                               f"another run writes {checkpoint}")
        # Owned by this driver (it goes when the run does), but named in a fixed namespace: another
        # process (Serve's weight pull, a federation member) finds it by global_policy_name(OUT).
        self.gp = GlobalPolicy.options(name=name, namespace=A3C_NAMESPACE).remote(
            cfg, str(init) if init else None, seed, str(checkpoint) if checkpoint else None, self.opts,
            str(logdir) if logdir else None, resume)
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
                         restarted, list(self.reports))

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
