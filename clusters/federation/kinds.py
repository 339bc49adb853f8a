"""Each kind of federation member (``members[i].backend.kind``), written once: how its agent is named,
what is checked before anything starts, how its agent starts and whether ``down`` may end it, and what
``status`` says of its validation. :data:`KINDS` registers one :class:`MemberKind` per backend; the rest of
:mod:`clusters.federation` asks :func:`kind_of`, so a new backend is one more class here.

* ``sim``: a simulated cluster in the learner's Ray (:class:`~clusters.federation.learner.MemberAgentImpl`);
* ``ray``: a live Ray cluster's own agent (``live.agent_name``), which joins the federation;
* ``k8s``: a Kubernetes cluster's agent actor, started beside the learner.
"""

from __future__ import annotations

import socket
from typing import Any, ClassVar

from clusters.federation.config import LEARNER_RAY, FederationFile, member_config
from clusters.runtime import NAMESPACE
from dl2ray.errors import UserError


def default_actor_name(fed: FederationFile, index: int) -> str:
    """``PREFIX-member-NAME`` in namespace ``dl2ray``."""
    return f"{fed.actor_prefix}-member-{fed.members[index].name}"


class MemberKind:
    """What every kind of member answers (the defaults hold for a member whose agent the federation starts
    and owns)."""

    kind: ClassVar[str]
    simulated: ClassVar[bool] = False
    """Whether it runs on simulated traces (its own validation; ``federation experiment`` members)."""
    validation: ClassVar[str] = "none: a live cluster has no simulated validation traces"

    def actor_name(self, fed: FederationFile, index: int) -> str:
        return default_actor_name(fed, index)

    def preflight(self, fed: FederationFile, index: int) -> None:
        """Before anything starts; UserError naming the field (exit 2)."""

    def start(self, fed: FederationFile, index: int, link: Any) -> Any:
        """Its agent in the connected Ray (created unless it runs); UserError naming the member when it
        cannot start."""
        raise NotImplementedError

    def owned(self, fed: FederationFile, agent: Any) -> bool:
        """Whether ``down`` ends this running agent (an actor handle)."""
        return True


class SimMember(MemberKind):
    kind = "sim"
    simulated = True
    validation = "own simulated validation traces"

    def start(self, fed: FederationFile, index: int, link: Any) -> Any:
        from clusters.a3c.weights import with_hidden_of
        from clusters.federation.members import MemberAgent, member_specs

        init = fed.resolve(fed.learner.init) if fed.learner.init else None
        cfg = with_hidden_of(member_config(fed, index), init)
        spec = member_specs(fed, fed.learner.seed)[index]
        return MemberAgent.options(name=self.actor_name(fed, index), namespace=NAMESPACE, lifetime="detached",
                                   get_if_exists=True).remote(cfg, spec, link)


class RayMember(MemberKind):
    kind = "ray"

    def actor_name(self, fed: FederationFile, index: int) -> str:
        """The live cluster's own agent (``live.agent_name``)."""
        from clusters.federation.config import live_member_config
        from clusters.ray.config import LiveConfig

        cluster = live_member_config(fed, index)[0]
        assert isinstance(cluster, LiveConfig)
        return cluster.live.agent_name

    def preflight(self, fed: FederationFile, index: int) -> None:
        """Its Ray head answers (unless it is the learner's own)."""
        m = fed.members[index]
        address = getattr(m.backend, "address", LEARNER_RAY)
        if address == LEARNER_RAY:
            return
        why = _answers(address)
        if why is not None:
            raise UserError(f"members.{index}.backend.address: {address} ({m.name}): no Ray head "
                            f"answers there ({why})")

    def start(self, fed: FederationFile, index: int, link: Any) -> Any:
        from clusters.federation import live as fed_live  # live members need torch and the backends

        return fed_live.start_ray_member(fed, index, link)

    def owned(self, fed: FederationFile, agent: Any) -> bool:
        """Only while it is this federation's: the cluster's own agent outlives the federation."""
        import ray

        status: Any = ray.get(agent.status.remote(), timeout=60)
        return (status.get("federation") or {}).get("federation") == fed.name


class K8sMember(MemberKind):
    kind = "k8s"

    def preflight(self, fed: FederationFile, index: int) -> None:
        """Its kubeconfig holds its context."""
        check_context(fed, index)

    def start(self, fed: FederationFile, index: int, link: Any) -> Any:
        import ray

        from clusters.federation import live as fed_live

        m = fed.members[index]
        agent = fed_live.start_k8s_member(fed, index, link, self.actor_name(fed, index))
        try:
            ray.get(agent.status.remote(), timeout=180)
        except ray.exceptions.RayError as exc:
            cause = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
            cause = cause.removeprefix(f"{UserError.__module__}.{UserError.__name__}: ")
            raise UserError(f"members.{index}.backend ({m.name}): its Kubernetes agent did not start: "
                            f"{cause}") from None
        return agent


KINDS: dict[str, MemberKind] = {k.kind: k for k in (SimMember(), RayMember(), K8sMember())}
"""Every kind of member, by ``backend.kind``."""


def kind_of(fed: FederationFile, index: int) -> MemberKind:
    """Member ``index``'s kind."""
    return KINDS[fed.members[index].backend.kind]


def check_context(fed: FederationFile, index: int) -> None:
    """Member ``index``'s kubeconfig exists and holds its ``backend.context``; UserError naming the field."""
    from clusters.federation.config import K8sBackendSpec, live_member_config
    from clusters.k8s.api import kube_contexts
    from clusters.k8s.config import K8sConfig

    m = fed.members[index]
    assert isinstance(m.backend, K8sBackendSpec)
    cluster = live_member_config(fed, index)[0]
    assert isinstance(cluster, K8sConfig)
    path = cluster.kubeconfig_path()
    assert path is not None  # live_member_config refuses an in-cluster (null) kubeconfig
    if not path.is_file():
        raise UserError(f"members.{index}.backend.config: kubernetes.kubeconfig: {path}: no such file")
    contexts = kube_contexts(str(path))
    if m.backend.context not in contexts:
        raise UserError(f"members.{index}.backend.context: {m.backend.context!r} ({m.name}): no such context "
                        f"in kubeconfig {path} (it has {', '.join(contexts) or 'none'})")


def _answers(address: str, timeout_s: float = 3.0) -> str | None:
    """None if something accepts TCP connections at ``host:port``, else why not."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return None
    except OSError as exc:
        return exc.strerror or type(exc).__name__
