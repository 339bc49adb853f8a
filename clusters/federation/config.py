"""The federation file (``configs/federation.yaml``): one global learner and its member clusters.

::

    name: demo
    learner:
      config: testbed.yaml            # base experiment: its policy group is every member's policy
      init: null                      # start from this checkpoint (SL warm start); null: random from seed
      seed: 0
      out: ../runs/federation/demo    # checkpoint global.pt (+ .best.pt, .json), tb/, state.json
      checkpoint_every: 20            # global updates between checkpoints
      ray: {address: null, num_cpus: 2}   # null: `federation up` starts a head of its own
      http: {enabled: true, host: 127.0.0.1, port: 8471, token_file: federation.token}
      learning: {steps_per_update: 64, max_grad_norm: 10.0}
    members:
      - name: testbed
        backend: {kind: sim, config: testbed.yaml, overrides: {}}
        ray_address: null             # null: the learner's Ray (actor calls); else another Ray (HTTP)
        mode: learn                   # learn | shadow | serve-only
        weight: 1.0                   # the member's gradients are multiplied by this
        staleness: 8                  # pushes computed on weights older than this many updates are dropped
        traces: 20                    # training traces of its own (seeds.training, offset by member)
        val_traces: 2                 # its own validation traces (seeds.validation)
        val_every: 20                 # own pushes (or pulls) between its validations
      - name: lab                     # a live Ray cluster: its agent is this federation's member
        backend: {kind: ray, address: 10.0.0.5:6379, config: live-local.yaml}   # or address: learner
        mode: learn
        steps_per_update: 16          # this member's decision steps per gradient (live slots are slow)
      - name: kube                    # a Kubernetes cluster: the same agent loop against a kubeconfig context
        backend: {kind: k8s, context: prod, config: k8s-cluster.yaml}
        ray_address: null             # where its agent actor runs (as for sim members)
        mode: shadow

Relative paths are relative to the federation file's folder. Every member's
experiment config is its ``backend.config`` with ``backend.overrides`` merged
in (group by group, as in the YAML), and with the learner's ``policy`` group:
one global policy needs one encoding (window, catalogue), so members may
differ in cluster, workload and speed but not in policy dimensions.

Live members (:mod:`clusters.federation.live`): a ``ray`` member is the live agent
(:mod:`clusters.ray.agent`) of the Ray cluster at ``backend.address`` (a
``configs/live-*.yaml`` for slot length, guardrail, log folder, agent name);
``address: learner`` (or the learner's own ``learner.ray.address``) puts it in
the learner's Ray, reached by actor calls, any other address over HTTP. A
``k8s`` member is the Kubernetes agent loop (:mod:`clusters.agent.loop`) of a
``configs/k8s-cluster.yaml`` against the kubeconfig ``context``; its agent
actor runs where ``ray_address`` says, as a simulated member's does. Both
decide with the learner's policy on the experiment of their cluster config
(its catalogue must be the learner's) and have no simulated validation traces.

:func:`load_federation` turns every problem into a :class:`~dl2ray.config.ConfigError`
(exit 2) naming the file and the field (``members.1.weight: ...``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from clusters.agent.settings import FrozenModel
from clusters.k8s.config import K8sConfig, load_k8s_config
from clusters.ray.config import LiveConfig, load_live_config
from dl2ray.config import ConfigError, ExperimentConfig, format_validation_error, load_config, read_yaml

LEARNER_RAY = "learner"
"""A ``ray`` member's ``backend.address`` naming the learner's own Ray cluster."""


class RayPlace(FrozenModel):
    """Where the learner's Ray runs."""

    address: str | None = Field(default=None, description="host:port of a running head; null: up starts one")
    num_cpus: int = Field(default=2, ge=1, description="CPUs of the head up starts")


class HttpSettings(FrozenModel):
    """The learner's HTTP endpoint for members in other Ray clusters (:mod:`clusters.federation.http`)."""

    enabled: bool = True
    host: str = Field(default="127.0.0.1", description="address the endpoint binds")
    port: int = Field(default=8471, ge=0, le=65535, description="its port (0: any free one; recorded)")
    token_file: str = Field(default="federation.token",
                            description="file holding the shared token (created by up when missing)")


class Learning(FrozenModel):
    """How the learner and the learning members work (A3C settings, as ``train rl --agents``)."""

    steps_per_update: int | None = Field(default=None, ge=1,
                                         description="decision steps per gradient; null: policy.minibatch")
    max_grad_norm: float | None = Field(default=10.0, gt=0, description="per-network clip; null: none")
    critic: bool = True
    exploration: bool = True
    pull_every: int = Field(default=1, ge=1, description="a member pulls weights with every n-th push")
    threads: int = Field(default=1, ge=1, description="torch threads per actor")
    twin: Literal["config", "observed"] = Field(
        default="observed", description="shape policy: where a member simulates its counterfactual tries: "
        "observed = a twin it fits from episodes its own cluster ran (dl2ray.learn.shape.twin); config = "
        "operator-world episodes of its config's workload")
    twin_window: int = Field(default=8, ge=1, description="observed twin: the newest episodes it replays")
    observe_every: int = Field(default=1, ge=1,
                               description="observed twin: pushes per episode of its cluster")
    algo: Literal["counterfactual", "pg"] = Field(
        default="counterfactual", description="shape policy: how a member computes a push: counterfactual "
        "tries in its twin, or pg: online, on-policy episodes of its own cluster through the live agent's "
        "interface (dl2ray.envs.cluster_env) against its own value baseline")
    credit: Literal["job", "slot"] = Field(default="job", description="pg: a job choice's return "
                                           "(dl2ray.learn.shape.pg)")


class Learner(FrozenModel):
    config: str = Field(description="experiment YAML whose policy group every member uses")
    init: str | None = Field(default=None, description="checkpoint to start from; null: random from seed")
    seed: int = Field(default=0, ge=0)
    out: str = Field(default="../runs/federation", description="folder of checkpoint, logs, state")
    checkpoint_every: int = Field(default=20, ge=1, description="global updates between checkpoints")
    ray: RayPlace = RayPlace()
    http: HttpSettings = HttpSettings()
    learning: Learning = Learning()


class SimBackendSpec(FrozenModel):
    kind: Literal["sim"]
    config: str = Field(description="experiment YAML of the simulated cluster")
    overrides: dict[str, Any] = Field(default_factory=dict,
                                      description="config groups merged over it (cluster, workload, ...)")


class RayBackendSpec(FrozenModel):
    """A live Ray cluster (:mod:`clusters.ray.agent`): the member is that cluster's agent."""

    kind: Literal["ray"]
    address: str = Field(description="host:port of the live cluster's Ray head; 'learner': the learner's Ray")
    config: str = Field(description="live config (configs/live-*.yaml): slot length, guardrail, log folder, "
                                    "agent name; its scheduler, shadow and learn fields are the member's now")

    @field_validator("address")
    @classmethod
    def _host_port(cls, v: str) -> str:
        host, sep, port = v.rpartition(":")
        if v != LEARNER_RAY and not (sep and host and port.isdigit() and 0 < int(port) < 65536):
            raise ValueError(f"{v!r}: expected HOST:PORT of a Ray head, or {LEARNER_RAY!r}")
        return v


class K8sBackendSpec(FrozenModel):
    """A Kubernetes cluster (:mod:`clusters.agent.loop`) reached through a kubeconfig context."""

    kind: Literal["k8s"]
    context: str = Field(min_length=1, description="context in the config's kubernetes.kubeconfig file")
    config: str = Field(description="Kubernetes agent config (configs/k8s-cluster.yaml): namespace, slot "
                                    "length, guardrail, kubeconfig; its scheduler is the member's now")


class Member(FrozenModel):
    name: str = Field(min_length=1, max_length=40, pattern=r"^[a-z0-9][a-z0-9-]*$",
                      description="lower-case letters, digits, '-'")
    backend: SimBackendSpec | RayBackendSpec | K8sBackendSpec = Field(discriminator="kind")
    ray_address: str | None = Field(default=None,
                                    description="null: the learner's Ray (actor); host:port: another (HTTP)")
    mode: Literal["learn", "shadow", "serve-only"] = "learn"
    weight: float = Field(default=1.0, gt=0, le=10, description="gradient multiplier")
    staleness: int = Field(default=8, ge=0, description="largest accepted update lag of a gradient")
    traces: int = Field(default=20, ge=1, description="training traces of its own")
    val_traces: int = Field(default=2, ge=1, description="validation traces of its own")
    val_every: int = Field(default=20, ge=1, description="own pushes (pulls if not learning) per validation")
    pull_interval_s: float = Field(default=2.0, gt=0,
                                   description="shadow/serve-only: seconds between weight pulls")
    steps_per_update: int | None = Field(default=None, ge=1,
                                         description="its decision steps per gradient; null: the learner's")
    joins_after: int = Field(default=0, ge=0, description=(
        "simulated learn member: a cluster that joins a running federation. It takes the global weights "
        "at once but pushes only once the learner has applied this many updates (until then it pulls "
        "every pull_interval_s); 0: from the start"))

    @model_validator(mode="after")
    def _late_learner(self) -> Member:
        if self.joins_after and (self.mode != "learn" or not isinstance(self.backend, SimBackendSpec)):
            raise ValueError(f"joins_after: {self.joins_after}: only a simulated learn member joins late "
                             f"(this one is a {self.backend.kind!r} {self.mode!r} member)")
        return self


class FederationFile(FrozenModel):
    name: str = Field(min_length=1, max_length=40, pattern=r"^[a-z0-9][a-z0-9-]*$")
    learner: Learner
    members: tuple[Member, ...] = Field(min_length=1)
    base_dir: str = Field(default=".", description="set by the loader: the file's folder")

    @field_validator("members")
    @classmethod
    def _unique(cls, members: tuple[Member, ...]) -> tuple[Member, ...]:
        seen: set[str] = set()
        for m in members:
            if m.name in seen:
                raise ValueError(f"member name {m.name!r} used twice")
            seen.add(m.name)
        return members

    @model_validator(mode="after")
    def _http_for_remote(self) -> FederationFile:
        for i, m in enumerate(self.members):
            if isinstance(m.backend, RayBackendSpec) and m.ray_address is not None:
                raise ValueError(f"members.{i}.ray_address: a ray member's agent runs in the Ray cluster of "
                                 "its backend.address; leave ray_address out")
        remote = [m.name for m in self.members if self.where(m) is not None]
        if remote and not self.learner.http.enabled:
            raise ValueError(f"members {remote} are in other Ray clusters: learner.http.enabled must be true")
        return self

    def resolve(self, relative: str) -> Path:
        p = Path(relative)
        return p if p.is_absolute() else Path(self.base_dir) / p

    def where(self, m: Member) -> str | None:
        """The Ray cluster a member's agent runs in: None for the learner's (actor calls), else its
        ``host:port`` (the member talks HTTP). A ``ray`` member runs in its own cluster."""
        if isinstance(m.backend, RayBackendSpec):
            own = m.backend.address
            return None if own == LEARNER_RAY or own == self.learner.ray.address else own
        return m.ray_address

    @property
    def out(self) -> Path:
        return self.resolve(self.learner.out)

    @property
    def checkpoint(self) -> Path:
        return self.out / "global.pt"

    @property
    def state_file(self) -> Path:
        return self.out / "state.json"

    @property
    def actor_prefix(self) -> str:
        """Names of this federation's actors in the ``dl2ray`` namespace: ``fed-NAME-...``."""
        return f"fed-{self.name}"

    def member(self, name: str) -> Member:
        for m in self.members:
            if m.name == name:
                return m
        raise ConfigError(f"no member {name!r}; members: {[m.name for m in self.members]}")


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def learner_config(fed: FederationFile) -> ExperimentConfig:
    return load_config(fed.resolve(fed.learner.config))


def member_config(fed: FederationFile, index: int) -> ExperimentConfig:
    """Member ``index``'s experiment: its config, its overrides, the learner's policy group."""
    m = fed.members[index]
    where = f"members.{index}.backend"
    if not isinstance(m.backend, SimBackendSpec):
        raise ConfigError(f"{where}.kind: {m.backend.kind!r} members run no simulated experiment")
    path = fed.resolve(m.backend.config)
    raw = read_yaml(path, "config", ConfigError) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: <root>: expected a mapping of config groups")
    base = learner_config(fed)
    raw = _merge(raw, m.backend.overrides)
    raw = {**raw, "base_dir": str(path.resolve().parent)}
    return _with_learners_policy(raw, m.name, base, where, f"{fed.base_dir}: {where}.overrides")


def _with_learners_policy(raw: dict[str, Any], name: str, base: ExperimentConfig, where: str,
                          context: str) -> ExperimentConfig:
    """A member's experiment (``raw``, named ``name``) with the learner's ``policy`` group: one policy needs
    one catalogue, so the member's job types must be the learner's. ConfigError naming ``where``."""
    raw = {**raw, "name": name, "policy": base.policy.model_dump(mode="python")}
    try:
        cfg = ExperimentConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(context, exc)) from exc
    if tuple(cfg.catalogue.names) != tuple(base.catalogue.names):
        raise ConfigError(f"{where}.config: job types {list(cfg.catalogue.names)} differ from the learner's "
                          f"{list(base.catalogue.names)}; one policy needs one catalogue")
    return cfg


def live_member_config(fed: FederationFile, index: int) -> tuple[LiveConfig | K8sConfig, ExperimentConfig]:
    """A ``ray`` or ``k8s`` member's cluster config (:class:`~clusters.ray.config.LiveConfig` or
    :class:`~clusters.k8s.config.K8sConfig`) and the experiment its policy decides for: the cluster
    config's experiment with the learner's ``policy`` group (and the member's name)."""
    m = fed.members[index]
    where = f"members.{index}.backend"
    path = fed.resolve(m.backend.config)
    cluster: LiveConfig | K8sConfig
    if isinstance(m.backend, RayBackendSpec):
        cluster = load_live_config(path)
    elif isinstance(m.backend, K8sBackendSpec):
        cluster = load_k8s_config(path)
        if cluster.kubernetes.kubeconfig is None:
            raise ConfigError(f"{where}.config: {path}: kubernetes.kubeconfig is null (in-cluster); a "
                              f"federation member needs a kubeconfig file with context {m.backend.context!r}")
    else:
        raise ConfigError(f"{where}.kind: 'sim' members run a simulated experiment (member_config)")
    raw = cluster.experiment().model_dump(mode="python")
    return cluster, _with_learners_policy(raw, m.name, learner_config(fed), where, str(path))


def load_federation(path: str | Path) -> FederationFile:
    """Load and validate a federation file and every member's experiment (ConfigError naming the field)."""
    path = Path(path)
    raw = read_yaml(path, "federation file", ConfigError)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: <root>: expected a mapping with name, learner, members")
    raw = {**raw, "base_dir": str(path.resolve().parent)}
    try:
        fed = FederationFile.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(str(path), exc)) from exc
    try:
        learner_config(fed)
    except ConfigError as exc:
        raise ConfigError(f"{path}: learner.config: {exc}") from None
    if fed.learner.init is not None and not fed.resolve(fed.learner.init).exists():
        raise ConfigError(f"{path}: learner.init: file not found: {fed.resolve(fed.learner.init)}")
    for i, m in enumerate(fed.members):
        try:
            if isinstance(m.backend, SimBackendSpec):
                member_config(fed, i)
            else:
                live_member_config(fed, i)
        except ConfigError as exc:
            raise ConfigError(f"{path}: members.{i}.backend ({m.name}): {exc}") from None
    return fed
