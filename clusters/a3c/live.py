"""Online learning from live slots (``dl2ray cluster up --learn``): the agent as an A3C worker.

With a shape checkpoint (the shipped architecture) the agent's learner is
:class:`~clusters.a3c.live_shape.LiveShapeLearner` (counterfactual credit in a twin of the live
cluster); with a paper one, :class:`LiveLearner` below.

:class:`LiveLearner` is a scheduler (``decide(view) -> Allocation``) that does
on live views what :class:`~clusters.a3c.training.ClusterAgentImpl` does on simulated
ones, through the same public pieces: it samples the slot's actions from the
current global weights (:class:`~dl2ray.policy.decision.PolicyChooser` in
:func:`~dl2ray.policy.decision.run_decision`, with recorded steps), and when
the next view arrives it closes the slot's :class:`~dl2ray.learn.rollout.SlotRecord`
with the live reward ``r_t = Σ_j Δepochs_j / E_j`` (epochs each job trained in
the slot over its declared epochs; a job that left the view finished its
remaining epochs) and ``s_{t+1}``. Every ``steps_per_update`` decision steps it
computes the actor-critic gradient (:func:`~dl2ray.learn.rollout.to_batch`,
:func:`~dl2ray.learn.actor_critic.compute_gradients`) and pushes it to the
:class:`~clusters.a3c.global_policy.GlobalPolicy` actor, pulling the new weights in the same
call; ``version`` is the global update count of the weights in use.

A slot whose allocation the guardrail replaced is dropped from the experience
(the recorded actions were not applied). Sampling draws from
``default_rng([seed, 1, incarnation])``.

Where the gradients go is the learner's *sink*: :class:`GlobalPolicySink` (the
A3C GlobalPolicy actor by name, ``cluster up --learn``) or a federation
member's link (:class:`clusters.federation.live.MemberSink`). With ``learning=False``
the learner decides greedily and keeps no experience (a federation member in
``shadow`` or ``serve-only`` mode).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import ray

from clusters.a3c.global_policy import A3COptions, GlobalPolicy
from clusters.a3c.weights import load_vector, with_hidden_of
from clusters.ray.config import Learn, LiveConfig
from clusters.runtime import NAMESPACE
from dl2ray.config import ExperimentConfig
from dl2ray.errors import UserError
from dl2ray.learn.actor_critic import LossConfig, compute_gradients, flatten
from dl2ray.learn.records import UpdateRecord, UpdateRow
from dl2ray.learn.rollout import SlotRecord, to_batch
from dl2ray.policy.decision import PolicyChooser, run_decision
from dl2ray.policy.encoding import Encoding, encode_window
from dl2ray.policy.network import NumpyPolicy, load_checkpoint
from dl2ray.policy.shape_net import checkpoint_arch
from dl2ray.view import Allocation, ClusterView

log = logging.getLogger(__name__)
AGENT_ID = 1000  # the live agent's id in the GlobalPolicy's per-agent counts (simulated agents: 0..N-1)


def _policy_path(spec: str) -> Path:
    name, _, arg = spec.partition(":")
    if name.strip().lower() != "dl2" or not arg:
        raise UserError(f"--learn needs the dl2 scheduler with a checkpoint (dl2:PATH), not {spec!r}")
    return Path(arg)


def ensure_global_policy(cfg: LiveConfig, scheduler: str) -> Any:
    """The named, detached GlobalPolicy actor (started from the scheduler's checkpoint if none runs)."""
    learn = cfg.live.learn
    try:
        return ray.get_actor(learn.global_policy, namespace=NAMESPACE)
    except ValueError:
        pass
    init = _policy_path(scheduler)
    exp = with_hidden_of(cfg.experiment(), init)
    out = cfg.log_dir() / "global-policy.pt"
    out.parent.mkdir(parents=True, exist_ok=True)
    opts = A3COptions(agents=1, traces=1, val_every=None, checkpoint_every=10)
    gp = GlobalPolicy.options(name=learn.global_policy, namespace=NAMESPACE, lifetime="detached").remote(
        exp, str(init), learn.seed, str(out), opts, None, out.exists())
    ray.get(gp.stats.remote())
    return gp


@dataclass(frozen=True)
class LearnFromLiveSlots:
    """``cluster up --learn``'s policy source (:class:`~clusters.ray.agent.PolicySource`): built inside the
    agent actor, a :class:`LiveLearner` on the ``dl2:PATH`` checkpoint's networks that pushes to the named
    GlobalPolicy actor (:func:`ensure_global_policy` starts it)."""

    learn: Learn
    scheduler: str

    def build(self, exp: ExperimentConfig, incarnation: int) -> Any:
        """The paper's :class:`LiveLearner` or, for a shape checkpoint, the
        :class:`~clusters.a3c.live_shape.LiveShapeLearner` (counterfactual credit in a twin of the live
        cluster)."""
        path = _policy_path(self.scheduler)
        if checkpoint_arch(path) == "shape":
            from clusters.a3c.live_shape import LiveShapeLearner

            sink = GlobalPolicySink(self.learn.global_policy)
            exp = with_hidden_of(exp, path)
            return LiveShapeLearner.from_scheduler(exp, self.learn, path, sink, incarnation)
        return LiveLearner.from_scheduler(exp, self.learn, self.scheduler, incarnation)

    def describe(self) -> dict[str, Any] | None:
        return None


class GlobalPolicySink:
    """A :class:`LiveLearner`'s way to the named A3C GlobalPolicy actor of its own Ray cluster."""

    def __init__(self, name: str) -> None:
        self.gp = ray.get_actor(name, namespace=NAMESPACE)

    def fetch(self) -> tuple[int, np.ndarray]:
        """``(updates, flat weights)`` of the global policy now."""
        out: Any = ray.get(self.gp.get_weights.remote())
        return out

    def push(self, flat_grad: np.ndarray, row: UpdateRecord, version: int) -> tuple[int, np.ndarray | None]:
        """Apply one gradient (or pseudo-gradient) computed on the weights of update ``version``;
        ``(updates, new weights)`` (the GlobalPolicy's checks may refuse it: the count stays)."""
        out: Any = ray.get(self.gp.push.remote(flat_grad, row, AGENT_ID, None, True, version))
        return out


class Sink(Protocol):
    def fetch(self) -> tuple[int, np.ndarray]: ...
    def push(self, flat_grad: np.ndarray, row: UpdateRecord,
             version: int) -> tuple[int, np.ndarray | None]: ...


class LiveLearner:
    """The learning scheduler (module docstring).

    ``policy``/``value``: the networks (their weights are replaced by the sink's on the first decision);
    ``steps_per_update``: decision steps per gradient; ``rng``: action sampling; ``learning=False``:
    greedy decisions, no experience, no pushes.
    """

    name = "dl2-learn"

    def __init__(self, cfg: ExperimentConfig, enc: Encoding, policy: Any, value: Any, sink: Sink,
                 steps_per_update: int, rng: np.random.Generator, learning: bool = True) -> None:
        self.cfg, self.enc, self.sink = cfg, enc, sink
        self.policy, self.value = policy, value
        self.steps_per_update, self.rng, self.learning = steps_per_update, rng, learning
        self.numpy: NumpyPolicy | None = None
        self.version = -1
        self.records: list[SlotRecord] = []
        self.pushed = 0
        self.slots = 0
        self._prev: tuple[ClusterView, Any] | None = None

    @classmethod
    def from_scheduler(cls, cfg: ExperimentConfig, learn: Learn, scheduler: str,
                       incarnation: int = 0) -> LiveLearner:
        """``cluster up --learn``: the ``dl2:PATH`` checkpoint's networks, the GlobalPolicy's weights."""
        ckpt = load_checkpoint(_policy_path(scheduler), expect=Encoding.from_config(cfg),
                               catalogue=cfg.catalogue.names)
        learner = cls(cfg, ckpt.meta.encoding, ckpt.policy, ckpt.value, GlobalPolicySink(learn.global_policy),
                      learn.steps_per_update, np.random.default_rng([learn.seed, 1, incarnation]))
        learner.take(*learner.sink.fetch())
        return learner

    def take(self, updates: int, weights: np.ndarray) -> None:
        """Decide from now on with ``weights`` (the flat vector of global update ``updates``)."""
        load_vector(self.policy, self.value, weights)
        self.numpy = NumpyPolicy.from_torch(self.policy)
        self.version = updates

    def decide(self, view: ClusterView) -> Allocation:
        if self.numpy is None:
            self.take(*self.sink.fetch())
        assert self.numpy is not None
        if not self.learning:
            return run_decision(view, self.enc, PolicyChooser(self.numpy, greedy=True)).allocation
        if self._prev is not None:
            self._close(view)
        decision = run_decision(view, self.enc, PolicyChooser(self.numpy, greedy=False, rng=self.rng),
                                record=True)
        self._prev = (view, decision)
        return decision.allocation

    def rejected(self) -> None:
        """The guardrail did not apply this slot's allocation: its actions teach nothing."""
        self._prev = None

    def _close(self, view: ClusterView) -> None:
        prev, decision = self._prev  # type: ignore[misc]
        self._prev = None
        now = {j.job_id: j for j in view.jobs}
        reward = 0.0
        for j in prev.jobs:
            done = now[j.job_id].done_epochs if j.job_id in now else j.est_epochs
            reward += max(done - j.done_epochs, 0.0) / j.est_epochs
        nxt = encode_window(view, self.enc)[0]
        self.records.append(SlotRecord(decision.steps, reward, nxt, False, -1, prev.slot))
        self.slots += 1
        if sum(len(r.steps) for r in self.records) >= self.steps_per_update:
            self._push()

    def _push(self) -> None:
        batch = to_batch(self.records, self.enc, self.cfg.policy.gamma)
        loss_cfg = LossConfig.from_config(self.cfg, True, max(self.version, 0))
        grads, st = compute_gradients(self.policy, self.value, batch, loss_cfg)
        row = UpdateRow(-1, st.policy_loss, st.value_loss, st.entropy,
                        float(np.mean([r.reward for r in self.records])), st.mean_value, len(batch),
                        len(self.records), 0)
        updates, weights = self.sink.push(flatten(grads), row, self.version)
        self.records = []
        self.pushed += 1
        if weights is not None:
            self.take(updates, weights)

    def stats(self) -> dict[str, Any]:
        return {"version": self.version, "pushed": self.pushed, "slots": self.slots,
                "pending_steps": sum(len(r.steps) for r in self.records)}
