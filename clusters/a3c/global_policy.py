"""The A3C master copy: :class:`GlobalPolicy` (networks, optimiser, checkpoints, run history) and the
:class:`Validator` it owns. The agents that feed it are in :mod:`clusters.a3c.training` (simulated
clusters) and :mod:`clusters.a3c.live` (a live cluster); a federation's learner extends it
(:mod:`clusters.federation.learner`).

- :class:`GlobalPolicy` holds the master policy and value networks and the
  :class:`~dl2ray.learn.actor_critic.ActorCriticOptimizer` (two Adams). Each
  gradient is applied **on arrival** (:meth:`GlobalPolicyImpl.push`), whatever
  weights it was computed on (Hogwild-style staleness, as in A3C). It keeps the
  run's :class:`~dl2ray.learn.records.RLResult` (one :class:`~dl2ray.learn.records.UpdateRow`
  per applied gradient, with the losses the agent computed; validation rows),
  logs both to TensorBoard, and every ``checkpoint_every`` updates writes its
  checkpoint (networks, optimiser state, counts, result; atomically) and the
  run JSON (:func:`dl2ray.learn.train.write_run_json`). On a Ray restart it
  resumes from that checkpoint, so a crash loses at most
  ``checkpoint_every - 1`` updates.
- Validation runs **off the update path**, in a :class:`Validator` actor the
  GlobalPolicy owns: at every ``val_every``-th update the GlobalPolicy hands it
  a snapshot of the weights and goes on applying gradients; the greedy
  policy's average JCT on the validation traces
  (:func:`dl2ray.seeds.validation`) comes back later and is logged at the
  snapshot's update, and ``OUT.best.pt`` is rewritten from the snapshot when it
  is the best so far. One validation runs at a time; when another falls due
  meanwhile, the newest due snapshot waits and older waiting ones are dropped
  (a validation of an untrained policy can take longer than many updates).
  Every validation is logged at the wall time its snapshot was taken (TensorBoard's
  ``walltime``), not when its answer came back: the time the weights had that quality.
- With ``defer_validation`` every due snapshot is kept (none dropped, in the checkpoint too) and
  validated after the last update (:meth:`GlobalPolicyImpl.finish`): on a machine with no core to
  spare (two agents on two cores) a validator running beside the agents takes CPU from them, which
  one agent with a free core does not pay; deferred, the run's clock counts learning alone
  (Fig. 18's time to quality, :mod:`dl2ray.studies.scaling`). The progress callback then sees no
  validation until the end.
- With ``share_baseline`` (the shape policy learning online, ``algo: pg``) the master also keeps the
  value baseline the agents fit, as the paper's A3C shares its critic: the weights it hands out and the
  pushes it takes are ``[policy ; baseline]``, both stepped by the
  :class:`~clusters.a3c.weights.OuterStep`; checkpoints carry it (``extra.baseline``), validations
  judge the policy alone. Without it each agent keeps its own baseline.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import ray
import torch
from torch import nn

from clusters.a3c.local import LocalSettings
from clusters.a3c.weights import (
    OuterStep,
    atomic_save,
    fresh_networks,
    load_vector,
    networks,
    params_vector,
    save_networks,
)
from clusters.runtime import actor_class, incarnation
from dl2ray import seeds as seedsets
from dl2ray.config import ExperimentConfig
from dl2ray.learn import train, validation
from dl2ray.learn.actor_critic import ActorCriticOptimizer
from dl2ray.learn.records import RLResult, UpdateRecord, ValidationRow, restore_result, result_doc
from dl2ray.learn.shape.pg import build_job_value
from dl2ray.policy.network import load_checkpoint
from dl2ray.policy.shape import ShapeEncoding
from dl2ray.policy.shape_net import load_shape_checkpoint

SHAPE_MAX_UPDATE_NORM = 10.0
"""The default bound on a shape pseudo-gradient's L2 norm: a KL-limited improvement (``policy.shape.kl``
0.1 nats, ``trust`` 0.02) moves the testbed network by well under 1 (docs/BENCHMARKS.md, "A3C of the
shape policy"), so 10 refuses only what no honest update is."""


@dataclass(frozen=True)
class A3COptions:
    """One A3C run's switches and schedule (the A3C counterpart of
    :class:`~dl2ray.learn.records.RLOptions`)."""

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
    max_update_norm: float | None = None  # a push with a larger L2 norm is refused; None: the arch's default
    max_lag: int | None = None  # a push computed on weights more than this many updates old is refused
    twin: Literal["config", "observed"] = "config"  # shape agents: where tries run (a3c.local)
    twin_window: int = 8  # observed twin: the newest observed traces it replays
    observe_every: int = 1  # observed twin: updates per episode run on the agent's own cluster
    zero_advantage: bool = False  # shape agents: the control (each try's advantages shuffled)
    same_traces: bool = False  # the benchmark's control: every agent cycles all ``traces`` (not its part)
    algo: Literal["counterfactual", "pg"] = "counterfactual"  # shape agents: tries in the twin, or online pg
    credit: Literal["job", "slot"] = "job"  # shape agents, pg: a job choice's return
    share_baseline: bool = False  # shape agents, pg: the master keeps the value baseline too (module doc)
    defer_validation: bool = False  # validate every due snapshot after the last update (module doc)

    def __post_init__(self) -> None:
        if self.agents < 1 or self.traces < (1 if self.same_traces else self.agents):
            raise ValueError(f"need 1 <= agents ({self.agents}) <= traces ({self.traces}): "
                             "every agent needs training traces of its own")
        if self.pull_every < 1 or self.max_in_flight < 1:
            raise ValueError("pull_every and max_in_flight must be >= 1")
        if self.twin_window < 1 or self.observe_every < 1:
            raise ValueError("twin_window and observe_every must be >= 1")
        if self.share_baseline and self.algo != "pg":
            raise ValueError("share_baseline: only the online learner (algo pg) has a value baseline")

    def agent_traces(self, agent_id: int) -> list[int]:
        """Agent ``agent_id``'s training seeds: every ``agents``-th of ``seeds.training(traces)`` (with
        ``same_traces``: all of them, in the same order for every agent)."""
        if self.same_traces:
            return seedsets.training(self.traces)
        return seedsets.training(self.traces)[agent_id::self.agents]

    def local_settings(self) -> LocalSettings:
        """What an agent's :class:`~clusters.a3c.local.LocalLearner` is built with."""
        return LocalSettings(self.steps_per_update, self.critic, self.exploration, self.twin,
                             self.twin_window, self.observe_every, self.zero_advantage,
                             algo=self.algo, credit=self.credit, share_baseline=self.share_baseline)


class ValidatorImpl:
    """Greedy average JCT of weight snapshots on the validation traces; behind :data:`Validator`."""

    def __init__(self, cfg: ExperimentConfig, val_seeds: list[int], threads: int = 1) -> None:
        torch.set_num_threads(threads)
        self.cfg, self.val_seeds = cfg, val_seeds
        self.policy, self.value = fresh_networks(cfg)

    def baseline(self) -> float:
        """DRF's average JCT (slots) on the validation traces: the reference of every run."""
        return validation.heuristic_jct(self.cfg, "drf", self.val_seeds)

    def validate(self, vec: np.ndarray) -> float:
        """Average JCT (slots) of the greedy policy with parameters ``vec`` (a flat vector,
        :func:`~clusters.a3c.weights.params_vector`)."""
        load_vector(self.policy, self.value, vec)
        return validation.validate(self.cfg, self.policy, self.val_seeds)


Validator = actor_class(ValidatorImpl, num_cpus=0, max_restarts=-1, max_task_retries=-1)
"""The Ray actor class of :class:`ValidatorImpl` (no CPU reserved: it shares the agents' cores)."""


@dataclass
class _Snapshot:
    update: int
    weights: np.ndarray
    wall: float = field(default_factory=time.time)  # when the weights were taken (Unix seconds)
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
        self.policy, self.value = networks(cfg, init, seed)
        # the shared value baseline (module docstring), from the same seed as the agents' own would be
        self.baseline: nn.Module | None = None
        if options.share_baseline:
            if self.value is not None:
                raise ValueError("share_baseline: the paper's networks keep their critic in the master")
            self.baseline = build_job_value(ShapeEncoding.from_config(cfg), cfg.policy.shape.head, seed)
        self.opt: ActorCriticOptimizer | OuterStep = (
            OuterStep(self.policy, self.baseline) if self.value is None
            else ActorCriticOptimizer(self.policy, self.value,  # type: ignore[arg-type]  # paper networks
                                      cfg.policy.rl_lr, options.max_grad_norm))
        self.size = len(self._vector())
        self.norm_bound = (options.max_update_norm if options.max_update_norm is not None
                           else SHAPE_MAX_UPDATE_NORM if self.value is None else None)
        self.max_norm_seen = 0.0  # the largest L2 norm of an applied push
        self.per_agent: dict[int, int] = {}
        self.refused: Counter[str] = Counter()  # pushes refused, by reason (see check)
        self.val_seeds = seedsets.validation(options.val_traces)
        self.result = RLResult(seed, init, 0, self.val_seeds, float("nan"))
        self.resumed = False
        self._deferred: list[_Snapshot] = []  # defer_validation: every due snapshot, validated at the end
        self._clock = time.perf_counter()  # result.wall_seconds: this actor's time since here, plus restored
        if self.checkpoint is not None and self.checkpoint.exists() and (resume or incarnation()):
            self._restore(self.checkpoint)
        elif self.checkpoint is not None:  # a restart before the first periodic one resumes from this
            self.save(str(self.checkpoint))
        self.writer = train.tensorboard_writer(Path(logdir)) if logdir else None
        self.validator = (Validator.remote(cfg, self.val_seeds, options.threads)
                          if options.val_every is not None else None)
        self._running: _Snapshot | None = None  # submitted to the validator
        self._waiting: _Snapshot | None = None  # due while another ran; replaced by a newer one

    # -- updates ---------------------------------------------------------------------------

    def check(self, flat_grad: np.ndarray, version: int | None = None) -> str | None:
        """Why a push must be refused, or None: ``"shape"`` (not one value per parameter),
        ``"nan"`` (a NaN or infinity), ``"norm"`` (L2 norm above ``norm_bound``), ``"stale"``
        (computed on weights of update ``version``, more than ``max_lag`` updates ago)."""
        g = np.asarray(flat_grad)
        if g.ndim != 1 or g.shape[0] != self.size:
            return "shape"
        if not np.all(np.isfinite(g)):
            return "nan"
        norm = float(np.linalg.norm(g.astype(np.float64)))
        if self.norm_bound is not None and norm > self.norm_bound:
            return "norm"
        lag_bound = self.opts.max_lag
        if version is not None and lag_bound is not None and self.opt.updates - version > lag_bound:
            return "stale"
        return None

    def push(self, flat_grad: np.ndarray, row: UpdateRecord, agent_id: int, limit: int | None = None,
             pull: bool = False, version: int | None = None) -> tuple[int, np.ndarray | None]:
        """Apply one agent's gradient with the statistics of its minibatch; ``(updates, weights or None)``.

        A push that would exceed ``limit`` updates is dropped (so a run ends at
        exactly ``limit``); one that :meth:`check` refuses is counted in ``refused`` and never
        applied. ``pull``: return the parameters after it too. ``version``: the update count of the
        weights the gradient was computed on (for the staleness bound).
        """
        why = self.check(flat_grad, version)
        if why is not None:
            self.refused[why] += 1
        elif limit is None or self.opt.updates < limit:
            self.max_norm_seen = max(self.max_norm_seen, float(np.linalg.norm(flat_grad)))
            self.apply_gradients(flat_grad, agent_id)
            u = self.opt.updates
            row = dataclasses.replace(row, update=u)
            self.result.history.append(row)
            self.result.updates = u
            if self.writer is not None:
                train.log_update(self.writer, row)
            every = self.opts.val_every
            if every is not None and (u % every == 0 or u == limit):
                self._due(_Snapshot(u, params_vector(self.policy, self.value)))
            if self.checkpoint is not None and (u % self.opts.checkpoint_every == 0 or u == limit):
                self._write()
        self._poll()
        return self.opt.updates, (self._vector() if pull else None)

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
        """``(updates, parameters)``: the update count and the flat parameter vector (policy then value, or
        then the shared baseline)."""
        return self.opt.updates, self._vector()

    def _vector(self) -> np.ndarray:
        """What the agents take: the networks' parameters (policy, then the value network or the shared
        baseline, if any)."""
        return params_vector(self.policy, self.value if self.baseline is None else self.baseline)

    def checkpoint_bytes(self, since: int = -1) -> tuple[int, bytes | None]:
        """``(updates, checkpoint)``: the current networks as the bytes of a checkpoint file
        (:func:`~dl2ray.policy.network.save_checkpoint`; ``kind`` ``"a3c-snapshot"``), or ``None`` when the
        update count is still ``since``. The Serve endpoint pulls its weights with it (by actor name)."""
        import tempfile

        if self.opt.updates == since:
            return since, None
        with tempfile.TemporaryDirectory(prefix="dl2ray-gp-") as tmp:
            path = Path(tmp) / "snapshot.pt"
            save_networks(path, self.policy, self.value, self.cfg.catalogue.names,
                          extra={"kind": "a3c-snapshot", "seed": self.seed, "updates": self.opt.updates})
            return self.opt.updates, path.read_bytes()

    def stats(self) -> dict[str, Any]:
        """``updates`` (total), ``per_agent`` (updates per agent id), ``resumed`` (from a checkpoint),
        ``refused`` (pushes refused, by reason), ``max_norm`` (largest norm applied), ``last_val`` (the
        latest validation row as a dict, or None)."""
        last = self.result.validation[-1] if self.result.validation else None
        return {"updates": self.opt.updates, "per_agent": dict(self.per_agent), "resumed": self.resumed,
                "refused": dict(self.refused), "max_norm": self.max_norm_seen,
                "last_val": dataclasses.asdict(last) if last else None}

    # -- validation --------------------------------------------------------------------------

    def start(self) -> None:
        """Before the first update of a run: DRF's reference JCT and the validation at update 0."""
        if self.validator is None or self.result.validation or self._running is not None or self._deferred:
            return
        self.result.baseline_avg_jct = float(ray.get(self.validator.baseline.remote()))
        self._due(_Snapshot(self.opt.updates, params_vector(self.policy, self.value)))

    def finish(self) -> RLResult:
        """Validate the deferred snapshots, in order (``defer_validation``), and wait for the validations
        still due; write checkpoint and run JSON; flush the logs."""
        while self._running is not None:
            self._poll(block=True)
        for snap in self._deferred:
            self._submit(snap)
            self._poll(block=True)
        self._deferred = []
        if self.checkpoint is not None:
            self._write()
        else:
            self._tick()
        if self.writer is not None:
            self.writer.flush()
        return self.result

    def _due(self, snap: _Snapshot) -> None:
        if self.opts.defer_validation:
            self._deferred.append(snap)
        elif self._running is None:
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
            train.log_validation(self.writer, row, walltime=snap.wall)
        if self.checkpoint is not None and (best is None or row.avg_jct < best.avg_jct):
            self._save_best(snap)
        self._running, waiting, self._waiting = None, self._waiting, None
        if waiting is not None:
            self._submit(waiting)

    def _save_best(self, snap: _Snapshot) -> None:
        assert self.checkpoint is not None
        policy, value = fresh_networks(self.cfg)
        load_vector(policy, value, snap.weights)
        extra = {"kind": "a3c-best", "seed": self.seed, "updates": snap.update,
                 "val_avg_jct": self.result.validation[-1].avg_jct}
        atomic_save(self.checkpoint.with_suffix(".best.pt"), policy, value, self.cfg.catalogue.names, extra)

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
        train.write_run_json(self.checkpoint.with_suffix(".json"), self.cfg, self)  # type: ignore[arg-type]

    def save(self, path: str) -> None:
        """Write the checkpoint atomically (a kill mid-write leaves the previous one intact)."""
        atomic_save(Path(path), self.policy, self.value, self.cfg.catalogue.names, self._checkpoint_extra())

    def _checkpoint_extra(self) -> dict[str, Any]:
        """What the checkpoint holds beside the networks (a subclass adds its own keys)."""
        return {"kind": "a3c", "seed": self.seed, "updates": self.opt.updates,
                "optimizer": self.opt.state_dict(),
                "per_agent": {str(k): v for k, v in self.per_agent.items()}, "refused": dict(self.refused),
                "max_norm": self.max_norm_seen, "options": dataclasses.asdict(self.opts),
                "result": result_doc(self.result),
                **({"baseline": self.baseline.state_dict()} if self.baseline is not None else {}),
                # defer_validation: the snapshots not yet validated (the weights as tensors)
                **({"deferred": [{"update": d.update, "wall": d.wall, "weights": torch.from_numpy(d.weights)}
                                 for d in self._deferred]} if self._deferred else {})}

    def _restore_extra(self, extra: dict[str, Any]) -> None:
        """A subclass's part of :meth:`_restore` (the checkpoint is read once)."""

    def _restore(self, path: Path) -> None:
        enc: Any = self.policy.enc  # ShapeEncoding or Encoding, with the architecture
        if self.value is None:
            shape = load_shape_checkpoint(path, expect=enc)
            ex = shape.extra
            self.policy.load_state_dict(shape.policy.state_dict())
        else:
            ckpt = load_checkpoint(path, expect=enc, catalogue=self.cfg.catalogue.names)
            ex = ckpt.extra
            self.policy.load_state_dict(ckpt.policy.state_dict())
            self.value.load_state_dict(ckpt.value.state_dict())
        if ex.get("kind") != "a3c":
            raise ValueError(f"{path}: not an A3C checkpoint; cannot resume from it")
        self.opt.load_state_dict(ex["optimizer"])
        if self.baseline is not None:
            if "baseline" not in ex:
                raise ValueError(f"{path}: no shared baseline here; resume without share_baseline")
            self.baseline.load_state_dict(ex["baseline"])
        self.per_agent = {int(k): int(v) for k, v in ex["per_agent"].items()}
        self.refused = Counter({str(k): int(v) for k, v in ex.get("refused", {}).items()})
        self.max_norm_seen = float(ex.get("max_norm", 0.0))
        self.result.init = ex["result"]["init"]
        restore_result(self.result, ex["result"], int(ex["result"]["updates"]))
        self._deferred = [_Snapshot(int(d["update"]), d["weights"].numpy(), float(d["wall"]))
                          for d in ex.get("deferred", [])]
        self._restore_extra(ex)
        self.resumed = True


# max_task_retries=-1: a call in flight when its actor dies, or sent while it restarts, runs again once
# the actor is back (at least once). For a push that means a gradient may be applied twice, which A3C's
# stale, unsynchronised updates tolerate; a lost run() call simply collects again.
GlobalPolicy = actor_class(GlobalPolicyImpl, num_cpus=0, max_restarts=-1, max_task_retries=-1)
"""The Ray actor class of :class:`GlobalPolicyImpl` (no CPU reserved: a push costs it ~3 ms)."""
