"""Live federation members: a live Ray cluster's or a Kubernetes cluster's agent with the federation's policy.

A ``ray`` member is the live agent of its Ray cluster (:class:`~clusters.ray.agent.LiveAgentImpl`,
named by its live config's ``agent_name``, so ``dl2ray submit`` reaches it as
usual); a ``k8s`` member is the Kubernetes agent loop
(:class:`~clusters.agent.loop.Agent` over :class:`~clusters.k8s.backend.KubernetesBackend`)
in a :data:`K8sMember` actor. Both schedule with a :class:`FederatedLivePolicy`
behind the guardrail of their cluster config:

- ``learn``: the :class:`~clusters.a3c.live.LiveLearner` (actions sampled
  from the global weights, live reward ``Σ_j Δepochs_j / E_j``); every
  ``steps_per_update`` decision steps the gradient is pushed to the
  federation's learner (:meth:`~clusters.federation.learner.FederatedPolicyImpl.push_member`:
  weighted, dropped when staler than the member's bound), and the reply's
  weights are taken; between batches (no decision step pending) it also pulls
  every ``pull_interval_s``, so an idle cluster keeps fresh weights and keeps
  in contact;
- ``shadow``: greedy decisions with the global weights, recorded beside the
  fallback's, which is applied (the decision log is the report:
  ``dl2ray cluster report --log-dir``); weights pulled every ``pull_interval_s``;
- ``serve-only``: greedy decisions, applied; weights pulled, nothing pushed.

The learner is reached through a :class:`~clusters.federation.links.Link` (an
actor link in the learner's Ray, HTTP with the shared token elsewhere). A member
that cannot reach it keeps deciding with the weights it has (counted in
``errors``; the next contact rejoins and takes fresh weights); one that never
had weights raises, so its guardrail applies the fallback for that slot. A
push that fails loses that batch of experience, never a slot. Live members have
no simulated validation traces: the learner's ``val_jct``/``drf_jct`` stay empty
for them.

Random streams: action sampling ``[seed, 1, member index, incarnation]``
(incarnation: 1 after a Ray restart of the agent); initial networks from ``seed``
(replaced by the learner's weights before the first decision).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray
import torch

from clusters.a3c.live import LiveLearner
from clusters.agent.loop import Agent
from clusters.federation.links import LinkDown
from clusters.federation.members import MemberCounters, MemberSpec
from clusters.k8s.config import K8sConfig
from clusters.ray.agent import launch_agent
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

    def build(self, exp: ExperimentConfig, incarnation: int) -> FederatedLivePolicy:
        """The policy source of the member's agent (:class:`~clusters.ray.agent.PolicySource`): the
        federation's policy for the member's experiment (``exp``, the cluster config's, is not used)."""
        return FederatedLivePolicy(self.cfg, self.spec, self.link, incarnation)

    def describe(self) -> dict[str, Any]:
        return {"federation": self.federation, "member": self.spec.name}


class MemberSink:
    """A live member's side of the federation protocol (join, push with version and boot, pull), counted."""

    def __init__(self, link: Any, spec: MemberSpec) -> None:
        self.link, self.spec = link, spec
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
        pull = (self.c.pushed + 1) % self.spec.pull_every == 0
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
            else:
                self.c.rewound += 1
        self._seen(r)
        return int(r["updates"]), r.get("weights")

    def pull(self, version: int) -> tuple[int, np.ndarray | None]:
        """``(updates, weights or None when ``version`` is current)``; LinkDown when unreachable."""
        r = self.link.pull(self.spec.name, version, self.c.boot)
        with self._lock:
            self.c.pulls += 1
        self._seen(r)
        return int(r["updates"]), r.get("weights")

    def error(self, exc: BaseException) -> None:
        log.warning("member %s: %s", self.spec.name, exc)
        self.rejoin = True
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


class FederatedLivePolicy(LiveLearner):
    """The federation's policy as a live cluster's scheduler (module docstring)."""

    def __init__(self, cfg: ExperimentConfig, spec: MemberSpec, link: Any, incarnation: int = 0) -> None:
        torch.set_num_threads(spec.threads)
        enc = Encoding.from_config(cfg)
        policy, value = build_networks(enc, cfg.policy.hidden, spec.seed)
        super().__init__(cfg, enc, policy, value, MemberSink(link, spec),
                         spec.steps_per_update or cfg.policy.minibatch,
                         np.random.default_rng([spec.seed, 1, spec.index, incarnation]),
                         learning=spec.mode == "learn")
        self.spec = spec
        self.name = f"federation-{spec.mode}"
        self.decided = 0  # slots decided with the federation's weights
        self._last_pull = time.monotonic()

    def decide(self, view: ClusterView) -> Allocation:
        self._refresh()
        alloc = super().decide(view)
        self.decided += 1
        return alloc

    def _refresh(self) -> None:
        """Join when there are no weights or the learner was lost; pull when due and no experience is
        pending (a learning member's batch is computed on the weights that chose its actions)."""
        sink: MemberSink = self.sink  # type: ignore[assignment]
        due = time.monotonic() - self._last_pull >= self.spec.pull_interval_s and self._between_batches()
        if self.numpy is not None and not sink.rejoin and not due:
            return
        self._last_pull = time.monotonic()
        try:
            if self.numpy is None or sink.rejoin:
                self.take(*sink.fetch())
            else:
                updates, weights = sink.pull(self.version)
                if weights is not None:
                    self.take(updates, weights)
        except LinkDown as exc:
            sink.error(exc)
            if self.numpy is None:
                raise  # no weights yet: the guardrail's fallback decides this slot

    def _between_batches(self) -> bool:
        if not self.learning:
            return True
        return not any(r.steps for r in self.records) and (self._prev is None or not self._prev[1].steps)

    def stats(self) -> dict[str, Any]:
        """The learner's counts (``version``: global update of the weights in use; ``slots``: slots of
        experience), the link's (joins; ``pushed``: pushes the learner answered, and their verdicts; pulls,
        errors) and ``decided``."""
        sink: MemberSink = self.sink  # type: ignore[assignment]
        link = {k: v for k, v in sink.counters().items() if k not in ("version", "slots", "validations")}
        return {"member": self.spec.name, "mode": self.spec.mode, "decided": self.decided,
                **super().stats(), **link}


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
