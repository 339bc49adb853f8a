"""Live federation members: a live Ray cluster's or a Kubernetes cluster's agent with the federation's policy.

A ``ray`` member is the live agent of its Ray cluster (:class:`~clusters.ray.agent.LiveAgentImpl`,
named by its live config's ``agent_name``, so ``dl2ray submit`` reaches it as
usual); a ``k8s`` member is the Kubernetes agent loop
(:class:`~clusters.agent.loop.Agent` over :class:`~clusters.k8s.backend.KubernetesBackend`)
in a :data:`K8sMember` actor. Both schedule, behind the guardrail of their cluster config, with the
live learner of the federation's architecture (``policy.arch`` of the learner's ``init`` checkpoint,
else of its config; :meth:`LiveMember.build` picks):

- ``shape`` (the shipped policy): :class:`FederatedLiveShapePolicy`, the
  :class:`~clusters.a3c.live_shape.LiveShapeLearner` of ``cluster up --learn``: greedy decisions with
  the global weights; in ``learn`` mode every ``steps_per_update`` slots a background thread fits the
  observed twin to what the cluster showed and pushes the pseudo-gradient of the counterfactual
  improvement (the slot loop never waits for it); the reply brings the new weights with every push;
- ``paper``: :class:`FederatedLivePolicy`, the :class:`~clusters.a3c.live.LiveLearner` (in ``learn``
  mode actions sampled from the global weights, live reward ``Σ_j Δepochs_j / E_j``, the actor-critic
  gradient of every ``steps_per_update`` decision steps).

By mode (both architectures):

- ``learn``: pushes go to the federation's learner
  (:meth:`~clusters.federation.learner.FederatedPolicyImpl.push_member`:
  checked, weighted, dropped when staler than the member's bound), and the reply's
  weights are taken; while no push is pending (paper: no decision step of the batch being collected;
  shape: no push being computed) it also pulls every ``pull_interval_s``, so an idle cluster keeps
  fresh weights and keeps in contact;
- ``shadow``: greedy decisions with the global weights, recorded beside the
  fallback's, which is applied (the decision log is the report:
  ``dl2ray cluster report --log-dir``); weights pulled every ``pull_interval_s``;
- ``serve-only``: greedy decisions, applied; weights pulled, nothing pushed.

Either takes the learner's weights (join) before its first decision. The learner is reached through
a :class:`~clusters.federation.links.Link` (an
actor link in the learner's Ray, HTTP with the shared token elsewhere). A member
that cannot reach it keeps deciding with the weights it has (counted in
``errors``; the next contact rejoins and takes fresh weights); one that never
had weights raises, so its guardrail applies the fallback for that slot. A
push that fails loses that batch of experience, never a slot. Live members have
no simulated validation traces: the learner's ``val_jct``/``drf_jct`` stay empty
for them.

Random streams: paper, action sampling ``[seed, 1, member index, incarnation]``; shape, tried jobs
and rows ``[seed, 1, member index, incarnation]`` and the twin's draws salted with the member index
(incarnation: 1 after a Ray restart of the agent); initial networks from ``seed``
(replaced by the learner's weights before the first decision).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray
import torch

from clusters.a3c.live import LiveLearner
from clusters.a3c.live_shape import LiveShapeLearner
from clusters.a3c.weights import fresh_networks
from clusters.agent.loop import Agent
from clusters.federation.links import LinkDown
from clusters.federation.members import MemberCounters, MemberSpec
from clusters.k8s.config import K8sConfig
from clusters.ray.agent import LearningPolicy, launch_agent
from clusters.runtime import NAMESPACE, actor_class, incarnation
from dl2ray.config import ExperimentConfig
from dl2ray.learn.records import UpdateRecord
from dl2ray.policy.encoding import Encoding
from dl2ray.policy.network import build_networks
from dl2ray.view import Allocation, ClusterView

log = logging.getLogger("dl2ray.federation")


@dataclass(frozen=True)
class LiveMember:
    """What a live member's agent needs of the federation (plain values and a link: it travels to its Ray).

    ``cfg``: the experiment the policy decides for (the cluster config's, with the learner's policy group).
    """

    federation: str
    cfg: ExperimentConfig
    spec: MemberSpec
    link: Any

    @property
    def label(self) -> str:
        """How the agent names its scheduler: ``federation:FEDERATION/MEMBER``."""
        return f"federation:{self.federation}/{self.spec.name}"

    @property
    def shadow(self) -> bool:
        return self.spec.mode == "shadow"

    def build(self, exp: ExperimentConfig, incarnation: int) -> LearningPolicy:
        """The policy source of the member's agent (:class:`~clusters.ray.agent.PolicySource`): the
        federation's policy for the member's experiment (``exp``, the cluster config's, is not used), of
        the federation's architecture (``cfg.policy.arch``: the learner's ``init`` checkpoint's, by
        :func:`~clusters.a3c.weights.with_hidden_of`, else its config's)."""
        cls = FederatedLiveShapePolicy if self.cfg.policy.arch == "shape" else FederatedLivePolicy
        return cls(self.cfg, self.spec, self.link, incarnation)

    def describe(self) -> dict[str, Any]:
        return {"federation": self.federation, "member": self.spec.name}

    def learner_status(self) -> dict[str, Any]:
        """The federation learner's status through the member's link (the members, their staleness)."""
        return self.link.status()


class MemberSink:
    """A live member's side of the federation protocol (join, push with version and boot, pull), counted.

    ``pull_every``: weights come back with every n-th push (default: the learning settings'
    ``pull_every``; the shape policy's member takes them with every push, as a simulated one does).
    """

    def __init__(self, link: Any, spec: MemberSpec, pull_every: int | None = None) -> None:
        self.link, self.spec = link, spec
        self.pull_every = pull_every or spec.pull_every
        self.c = MemberCounters()
        self.rejoin = False  # the learner was unreachable: join again (fresh weights) at the next contact
        self._lock = threading.Lock()

    def fetch(self) -> tuple[int, np.ndarray]:
        """Join: ``(updates, weights)``; LinkDown when the learner cannot be reached."""
        r = self.link.join(self.spec.name)
        with self._lock:
            self.c.joins += 1
        self.rejoin = False
        self._seen(r)
        return int(r["updates"]), r["weights"]

    def push(self, flat_grad: np.ndarray, row: UpdateRecord, version: int) -> tuple[int, np.ndarray | None]:
        """One gradient on the weights of update ``version``; ``(updates, weights or None)``. A push that
        cannot reach the learner is dropped (counted), and the member rejoins at its next contact."""
        pull = (self.c.pushed + 1) % self.pull_every == 0
        try:
            r = self.link.push(self.spec.name, flat_grad, row, version, self.c.boot, pull)
        except LinkDown as exc:
            self.error(exc)
            return version, None
        with self._lock:
            self.c.pushed += 1
            self.c.bytes_last = getattr(self.link, "bytes_last", 0)
            verdict = r["accepted"]
            if verdict == "yes":
                self.c.accepted += 1
            elif verdict == "stale":
                self.c.stale += 1
            elif verdict == "rewound":
                self.c.rewound += 1
            else:  # refused by the learner's checks (shape, nan, norm)
                self.c.refused += 1
        self._seen(r)
        return int(r["updates"]), r.get("weights")

    def pull(self, version: int) -> tuple[int, np.ndarray | None]:
        """``(updates, weights or None when ``version`` is current)``; LinkDown when unreachable."""
        r = self.link.pull(self.spec.name, version, self.c.boot)
        with self._lock:
            self.c.pulls += 1
        self._seen(r)
        return int(r["updates"]), r.get("weights")

    def error(self, exc: BaseException, rejoin: bool = True) -> None:
        """Count a failure (``rejoin``: of the link: take fresh weights at the next contact)."""
        log.warning("member %s: %s", self.spec.name, exc)
        self.rejoin = self.rejoin or rejoin
        with self._lock:
            self.c.errors += 1
            self.c.last_error = f"{type(exc).__name__}: {exc}"[:300]

    def _seen(self, r: dict[str, Any]) -> None:
        with self._lock:
            if self.c.boot not in (-1, r["boot"]):
                self.c.reconnects += 1
            self.c.boot = int(r["boot"])
            if r.get("weights") is not None:
                self.c.version = int(r["updates"])

    def counters(self) -> dict[str, Any]:
        with self._lock:
            return dataclasses.asdict(self.c)


class _Member:
    """What a federated live policy adds to its architecture's live learner (mixed in before it): the
    member's contact with the learner and its counts (module docstring).

    The learner underneath has ``version`` (-1: no weights yet), ``take(updates, weights)``, ``decide``
    and ``stats``; :meth:`_pending` says whether experience computed on the weights in use
    is still on its way to a push (no pull then: a push must go out on the weights it was computed on).
    """

    version: int
    take: Callable[[int, np.ndarray], None]

    def _join_federation(self, spec: MemberSpec, sink: MemberSink) -> None:
        self.spec, self.contact = spec, sink
        self.name = f"federation-{spec.mode}"
        self.decided = 0  # slots decided with the federation's weights
        self._last_pull = time.monotonic()

    def decide(self, view: ClusterView) -> Allocation:
        self._refresh()
        alloc: Allocation = super().decide(view)  # type: ignore[misc]
        self.decided += 1
        return alloc

    def _pending(self) -> bool:
        raise NotImplementedError

    def _refresh(self) -> None:
        """Join when there are no weights or the learner was lost; pull when due and nothing is pending."""
        sink = self.contact
        due = time.monotonic() - self._last_pull >= self.spec.pull_interval_s and not self._pending()
        if self.version >= 0 and not sink.rejoin and not due:
            return
        self._last_pull = time.monotonic()
        try:
            if self.version < 0 or sink.rejoin:
                self.take(*sink.fetch())
            else:
                updates, weights = sink.pull(self.version)
                if weights is not None:
                    self.take(updates, weights)
        except LinkDown as exc:
            sink.error(exc)
            if self.version < 0:
                raise  # no weights yet: the guardrail's fallback decides this slot

    def stats(self) -> dict[str, Any]:
        """The learner's counts (``version``: global update of the weights in use; ``slots``: slots of
        experience), the link's (joins; ``pushed``: pushes the learner answered, and their verdicts; pulls,
        errors) and ``decided``."""
        own: dict[str, Any] = super().stats()  # type: ignore[misc]
        link = {k: v for k, v in self.contact.counters().items()
                if k not in ("version", "slots", "validations")}
        return {"member": self.spec.name, "mode": self.spec.mode, "decided": self.decided, **own, **link}


class FederatedLivePolicy(_Member, LiveLearner):
    """The federation's paper-architecture policy as a live cluster's scheduler (module docstring)."""

    def __init__(self, cfg: ExperimentConfig, spec: MemberSpec, link: Any, incarnation: int = 0) -> None:
        torch.set_num_threads(spec.threads)
        enc = Encoding.from_config(cfg)
        policy, value = build_networks(enc, cfg.policy.hidden, spec.seed)
        sink = MemberSink(link, spec)
        super().__init__(cfg, enc, policy, value, sink, spec.steps_per_update or cfg.policy.minibatch,
                         np.random.default_rng([spec.seed, 1, spec.index, incarnation]),
                         learning=spec.mode == "learn")
        self._join_federation(spec, sink)

    def _pending(self) -> bool:
        """Steps of the batch being collected (their gradient needs the weights that chose them)."""
        if not self.learning:
            return False
        return any(r.steps for r in self.records) or (self._prev is not None and bool(self._prev[1].steps))


class FederatedLiveShapePolicy(_Member, LiveShapeLearner):
    """The federation's shape policy as a live cluster's scheduler (module docstring): the
    :class:`~clusters.a3c.live_shape.LiveShapeLearner` pushing through the member's link."""

    def __init__(self, cfg: ExperimentConfig, spec: MemberSpec, link: Any, incarnation: int = 0) -> None:
        torch.set_num_threads(spec.threads)
        net, _ = fresh_networks(cfg, spec.seed)
        sink = MemberSink(link, spec, pull_every=1)
        super().__init__(cfg, net, sink, spec.steps_per_update or cfg.policy.minibatch, spec.seed,
                         [spec.index, incarnation], learning=spec.mode == "learn", salt=spec.index)
        self._join_federation(spec, sink)

    def _pending(self) -> bool:
        """A push being computed (it goes out on its snapshot's version; the link is not shared with it)."""
        return self._thread is not None

    def _push_failed(self, exc: Exception) -> None:
        super()._push_failed(exc)
        self.contact.error(exc, rejoin=False)  # the member's errors count it too; the link is fine


# -- the Kubernetes member's actor ------------------------------------------------------------------------


class K8sMemberImpl:
    """A ``k8s`` member: the Kubernetes agent loop (in a thread) with the federation's policy.

    ``k8s_json``: its :class:`~clusters.k8s.config.K8sConfig` (the member's ``context`` set in it).
    Behind :data:`K8sMember`; the loop starts at once (``start=False``: tests step it themselves).
    """

    def __init__(self, k8s_json: str, member: LiveMember, start: bool = True) -> None:
        # The API client is imported here, in the k8s member's process: a ray member's agent never needs it.
        from clusters.k8s.backend import connect

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
        self.cfg = K8sConfig.model_validate_json(k8s_json)
        self.member = member
        self.backend = connect(self.cfg)
        self.policy = member.build(member.cfg, incarnation())
        try:
            self.agent = Agent(self.cfg, self.backend, member.label, self.policy, member.shadow)
        except BaseException:
            self.backend.close()
            raise
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if start:
            self._thread = threading.Thread(target=self.agent.run, args=(self._stop,),
                                            name=f"k8s-member-{member.spec.name}", daemon=True)
            self._thread.start()

    def status(self) -> dict[str, Any]:
        a = self.agent
        return {"name": self.member.spec.name, "mode": self.member.spec.mode,
                "federation": self.member.federation, "context": self.cfg.kubernetes.context,
                "namespace": self.cfg.kubernetes.namespace,
                "running": bool(self._thread and self._thread.is_alive()), "slots_done": a.slots_done,
                "adopted": a.adopted, "errors": dict(a.errors),
                "guardrail_fallbacks": dict(a.scheduler.fallbacks), "policy": self.policy.stats(),
                "log_dir": str(self.cfg.log_dir())}

    def step(self) -> dict[str, Any]:
        """One slot now (tests; the loop does this every slot)."""
        return self.agent.step()

    def stop(self) -> dict[str, Any]:
        """End the loop and close the API client; the jobs' pods stay (an agent started later adopts them)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=120)
        self.agent.close()
        st = self.status()
        self.backend.close()
        return st


K8sMember = actor_class(K8sMemberImpl, num_cpus=0, max_restarts=-1, max_task_retries=-1)
"""A ``k8s`` member's actor: named ``fed-NAME-member-MEMBER`` in ``dl2ray``, detached (as a simulated
member's); a restart reconnects, and the first snapshot adopts the running jobs."""


# -- starting a live member (a connected driver in the Ray cluster the member's agent runs in) -------------


def live_member(fed: Any, index: int, link: Any) -> tuple[Any, LiveMember]:
    """Member ``index``'s cluster config and :class:`LiveMember` (experiment with the init's hidden sizes)."""
    from clusters.a3c.weights import with_hidden_of
    from clusters.federation.config import live_member_config
    from clusters.federation.members import member_specs

    cluster, cfg = live_member_config(fed, index)
    init = fed.resolve(fed.learner.init) if fed.learner.init else None
    spec = member_specs(fed, fed.learner.seed)[index]
    return cluster, LiveMember(fed.name, with_hidden_of(cfg, init), spec, link)


def start_ray_member(fed: Any, index: int, link: Any) -> Any:
    """The live agent of member ``index``'s Ray cluster (this driver's), as a member of ``fed``; the running
    one when it is already this member (``up`` is idempotent), UserError when another agent holds the name."""
    from dl2ray.errors import UserError

    cluster, member = live_member(fed, index, link)
    name = cluster.live.agent_name
    try:
        running = ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        running = None
    if running is not None:
        st: Any = ray.get(running.status.remote(), timeout=60)
        if st.get("federation") != {"federation": fed.name, "member": member.spec.name}:
            raise UserError(f"members.{index}.backend.address: the Ray cluster there already runs agent "
                            f"{name!r} with scheduler {st.get('scheduler')!r}, not this federation's member; "
                            "stop it first (`dl2ray cluster down`)")
        return running
    return launch_agent(cluster, member.label, member.shadow, member)


def start_k8s_member(fed: Any, index: int, link: Any, actor_name: str) -> Any:
    """Member ``index``'s Kubernetes agent actor (created unless it runs) in this driver's Ray cluster."""
    cluster, member = live_member(fed, index, link)
    k = cluster.kubernetes.model_copy(update={"context": fed.members[index].backend.context})
    cluster = cluster.model_copy(update={"kubernetes": k})
    return K8sMember.options(name=actor_name, namespace=NAMESPACE, lifetime="detached",
                             get_if_exists=True).remote(cluster.model_dump_json(), member)
