"""What every cluster agent's config holds, written once: frozen models, the guardrail, the shared fields.

A backend's config file has one top-level key (``live:`` for a Ray cluster,
``kubernetes:`` for a Kubernetes cluster) whose settings extend
:class:`AgentSettings` with the backend's own groups; the file's model extends
:class:`AgentConfig` (``base_dir``, path resolution, the experiment it names).
:func:`load_agent_config` reads any of them. Paths in a config (``experiment``,
a ``dl2:PATH`` scheduler, ``log_dir``) are relative to the config file's folder
unless absolute.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from dl2ray.config import ConfigError, ExperimentConfig, format_validation_error, load_config, read_yaml


class FrozenModel(BaseModel):
    """A settings group: immutable, unknown fields refused (a typo names its field)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class Guardrail(FrozenModel):
    """Fallback heuristic for a policy that errs, is late or proposes an invalid allocation."""

    fallback: str = Field(default="drf", description="heuristic used instead (make_scheduler name)")
    time_budget_s: float = Field(default=5.0, gt=0, description="seconds the policy may take per slot")


class Dashboard(FrozenModel):
    """The agent's HTTP server: the operator's dashboard, its JSON and Prometheus metrics
    (:mod:`clusters.agent.http`)."""

    enabled: bool = Field(default=True, description="serve the dashboard and /metrics")
    host: str = Field(default="127.0.0.1", description="address to bind (0.0.0.0: every interface)")
    port: int = Field(default=8266, ge=0, le=65535, description="port; a free one if taken (0: always)")

    @field_validator("host")
    @classmethod
    def _an_address(cls, host: str) -> str:
        import ipaddress

        if host != "localhost":
            try:
                ipaddress.IPv4Address(host)
            except ValueError:
                raise ValueError(f"{host!r} is not an IPv4 address to bind (127.0.0.1, 0.0.0.0) "
                                 "or localhost") from None
        return host


class AgentSettings(FrozenModel):
    """The settings every agent has, whatever its backend."""

    experiment: str = Field(default="testbed.yaml", description="experiment config (catalogue, policy)")
    scheduler: str = Field(default="drf", description="drf, optimus, dl2:PATH, ... (make_scheduler)")
    slot_seconds: float = Field(default=10.0, gt=0, description="slot length in seconds")
    guardrail: Guardrail = Guardrail()
    dashboard: Dashboard = Dashboard()
    log_dir: str = Field(default="runs/agent", description="decision log (Parquet) and cluster state")


AgentConfigT = TypeVar("AgentConfigT", bound="AgentConfig")


class AgentConfig(FrozenModel):
    """A config file: its backend's settings under :attr:`KEY`, and the folder paths are relative to."""

    KEY: ClassVar[str] = ""
    base_dir: str = "."

    @property
    def agent(self) -> AgentSettings:
        """The settings under the file's top-level key."""
        settings = getattr(self, self.KEY)
        assert isinstance(settings, AgentSettings)
        return settings

    def resolve(self, relative: str) -> Path:
        p = Path(relative)
        return p if p.is_absolute() else (Path(self.base_dir) / p).resolve()

    def experiment(self) -> ExperimentConfig:
        return load_config(self.resolve(self.agent.experiment))

    def log_dir(self) -> Path:
        return self.resolve(self.agent.log_dir)

    def scheduler_spec(self, spec: str | None = None) -> str:
        """``spec`` (default: the config's) with a ``dl2:PATH`` made absolute (the agent may run elsewhere):
        a path that exists from here is taken as it is, else it is relative to the config's folder."""
        spec = spec or self.agent.scheduler
        name, _, arg = spec.partition(":")
        if name.strip().lower() == "dl2" and arg:
            here = Path(arg)
            path = here if here.is_absolute() or here.exists() else self.resolve(arg)
            return f"dl2:{path.resolve()}"
        return spec

    def with_agent(self: AgentConfigT, **changes: Any) -> AgentConfigT:
        """A copy with some agent settings replaced (``slot_seconds=2``, ``log_dir=...``)."""
        return self.model_copy(update={self.KEY: self.agent.model_copy(update=changes)})


def is_config_of(path: str | Path, cls: type[AgentConfig]) -> bool:
    """True if ``path`` is a YAML mapping whose top-level key is ``cls.KEY``."""
    try:
        raw = read_yaml(Path(path), "config", ConfigError)
    except ConfigError:
        return False
    return isinstance(raw, dict) and cls.KEY in raw


def load_agent_config(path: str | Path, cls: type[AgentConfigT]) -> AgentConfigT:
    """Read and validate an agent config of class ``cls``; :class:`ConfigError` names the file and field.
    The experiment it names is loaded too (a wrong reference fails here, not in the agent)."""
    path = Path(path)
    raw = read_yaml(path, "config", ConfigError) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: <root>: expected a mapping")
    try:
        cfg = cls.model_validate({**raw, "base_dir": str(path.resolve().parent)})
    except ValidationError as exc:
        raise ConfigError(format_validation_error(str(path), exc)) from None
    cfg.experiment()
    return cfg
