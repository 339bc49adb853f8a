"""The live cluster's config (``configs/live-*.yaml``): frozen, grouped, every field with unit and default.

::

    live:
      experiment: testbed.yaml              # the experiment config the schedulers are built for
      scheduler: dl2:../models/dl2-testbed.pt
      slot_seconds: 10
      ray: {num_cpus: 2, dashboard_port: 8265}
      guardrail: {fallback: drf, time_budget_s: 5}
      shadow: false
      learn: {enabled: false, steps_per_update: 32}
      log_dir: runs/live

Paths (``experiment``, a ``dl2:PATH`` scheduler, ``log_dir``) are relative to
the config file's folder unless absolute.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dl2ray.config import ConfigError, ExperimentConfig, format_validation_error, load_config


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RaySettings(_Frozen):
    """The local Ray head ``dl2ray cluster up`` starts (when no ``--address`` is given)."""

    num_cpus: int | None = Field(default=None, ge=1, description="CPUs of the head (default: all cores)")
    dashboard_port: int = Field(default=8265, ge=1, le=65535, description="Ray jobs API / dashboard port")


class Guardrail(_Frozen):
    """Fallback heuristic for a policy that errs, is late or proposes an invalid allocation."""

    fallback: str = Field(default="drf", description="heuristic used instead (make_scheduler name)")
    time_budget_s: float = Field(default=5.0, gt=0, description="seconds the policy may take per slot")


class Learn(_Frozen):
    """Online learning from live slots (``--learn``): gradients to the GlobalPolicy actor."""

    enabled: bool = False
    steps_per_update: int = Field(default=32, ge=1, description="decision steps per gradient push")
    global_policy: str = Field(default="dl2ray-global-policy", description="name of the GlobalPolicy actor")
    seed: int = Field(default=0, ge=0, description="action sampling seed")


class Timeouts(_Frozen):
    """Member liveness and start-up (seconds)."""

    heartbeat_timeout_s: float = Field(default=5.0, gt=0, description="silent member declared dead after")
    register_timeout_s: float = Field(default=60.0, gt=0, description="new members must register within")


class LiveSettings(_Frozen):
    experiment: str = Field(default="testbed.yaml", description="experiment config (catalogue, policy)")
    scheduler: str = Field(default="drf", description="drf, optimus, dl2:PATH, ... (make_scheduler)")
    slot_seconds: float = Field(default=10.0, gt=0, description="slot length in seconds")
    agent_name: str = Field(default="dl2ray-agent", description="name of the agent actor")
    ray: RaySettings = RaySettings()
    guardrail: Guardrail = Guardrail()
    shadow: bool = Field(default=False, description="decide with the policy, apply the fallback")
    learn: Learn = Learn()
    timeouts: Timeouts = Timeouts()
    log_dir: str = Field(default="runs/live", description="decision log (Parquet) and cluster state")


class LiveConfig(_Frozen):
    live: LiveSettings = LiveSettings()
    base_dir: str = "."

    def resolve(self, relative: str) -> Path:
        p = Path(relative)
        return p if p.is_absolute() else (Path(self.base_dir) / p).resolve()

    def experiment(self) -> ExperimentConfig:
        return load_config(self.resolve(self.live.experiment))

    def scheduler_spec(self, spec: str | None = None) -> str:
        """``spec`` (default: the config's) with a ``dl2:PATH`` made absolute (the agent runs elsewhere)."""
        spec = spec or self.live.scheduler
        name, _, arg = spec.partition(":")
        if name.strip().lower() == "dl2" and arg:
            here = Path(arg)
            path = here if here.is_absolute() or here.exists() else self.resolve(arg)
            return f"dl2:{path.resolve()}"
        return spec


def load_live_config(path: str | Path) -> LiveConfig:
    """Read and validate a live config; :class:`ConfigError` names the file and field."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: <root>: expected a mapping")
    try:
        cfg = LiveConfig.model_validate({**raw, "base_dir": str(path.resolve().parent)})
    except ValidationError as exc:
        raise ConfigError(format_validation_error(str(path), exc)) from None
    cfg.experiment()  # validate the experiment reference eagerly
    return cfg
