"""The Kubernetes cluster's config (``configs/k8s-cluster.yaml``): frozen, grouped, units in every field.

::

    kubernetes:
      experiment: testbed.yaml      # catalogue and policy settings the schedulers are built for
      scheduler: drf
      slot_seconds: 10
      namespace: default            # where DL2Jobs, pods and services live
      kubeconfig: null              # null: in-cluster config (the agent's Deployment); else a kubeconfig path
      image: dl2ray:0.1.0           # the image of coordinator, PS and worker pods (Dockerfile)
      api: {timeout_s: 5, attempts: 6, backoff_s: 0.2, backoff_max_s: 5}
      pods: {ready_timeout_s: 120, coordinator_port: 5555, python: python}
      guardrail: {fallback: drf, time_budget_s: 5}
      log_dir: ../runs/k8s

Paths are relative to the config file's folder unless absolute. A file is a
Kubernetes config if its top-level key is ``kubernetes`` (:func:`is_k8s_config`);
``dl2ray cluster up`` dispatches on that.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from clusters.ray.config import Guardrail
from dl2ray.config import ConfigError, ExperimentConfig, format_validation_error, load_config, read_yaml


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ApiSettings(_Frozen):
    """Calls to the Kubernetes API server: per-call timeout and retries with capped exponential backoff."""

    timeout_s: float = Field(default=5.0, gt=0, description="seconds one API call may take")
    attempts: int = Field(default=6, ge=1, description="tries per call on 429/5xx/timeouts (1: no retry)")
    backoff_s: float = Field(default=0.2, ge=0, description="first wait between tries; doubles each time")
    backoff_max_s: float = Field(default=5.0, ge=0, description="longest wait between tries")


class PodSettings(_Frozen):
    """How the job's pods run."""

    ready_timeout_s: float = Field(default=120.0, gt=0, description="new pods must be Ready within")
    release_timeout_s: float = Field(
        default=30.0, gt=0, description="released members must exit within (then their pods are deleted)"
    )
    coordinator_port: int = Field(default=5555, ge=1, le=65535, description="coordinator's TCP port")
    python: str = Field(default="python", description="the interpreter in the image (pod command lines)")
    heartbeat_timeout_s: float = Field(default=5.0, gt=0, description="silent member declared dead after")
    register_timeout_s: float = Field(default=60.0, gt=0, description="new members must register within")


class K8sSettings(_Frozen):
    experiment: str = Field(default="testbed.yaml", description="experiment config (catalogue, policy)")
    scheduler: str = Field(default="drf", description="drf, optimus, dl2:PATH, ... (make_scheduler)")
    slot_seconds: float = Field(default=10.0, gt=0, description="slot length in seconds")
    namespace: str = Field(default="default", description="namespace of DL2Jobs, pods and services")
    kubeconfig: str | None = Field(default=None, description="kubeconfig path; null: in-cluster config")
    context: str | None = Field(default=None, description="kubeconfig context (null: the current one)")
    image: str = Field(default="dl2ray:0.1.0", description="image of the job pods (Dockerfile)")
    image_pull_policy: str = Field(default="IfNotPresent", description="of the job pods")
    api: ApiSettings = ApiSettings()
    pods: PodSettings = PodSettings()
    guardrail: Guardrail = Guardrail()
    parallel_jobs: int = Field(default=8, ge=1, description="jobs reconciled at once in one slot")
    log_dir: str = Field(default="runs/k8s", description="decision log (Parquet)")


class K8sConfig(_Frozen):
    kubernetes: K8sSettings = K8sSettings()
    base_dir: str = "."

    def resolve(self, relative: str) -> Path:
        p = Path(relative)
        return p if p.is_absolute() else (Path(self.base_dir) / p).resolve()

    def experiment(self) -> ExperimentConfig:
        return load_config(self.resolve(self.kubernetes.experiment))

    def kubeconfig_path(self) -> Path | None:
        k = self.kubernetes.kubeconfig
        return None if k is None else self.resolve(str(Path(k).expanduser()))


def is_k8s_config(path: str | Path) -> bool:
    """True if ``path`` is a YAML mapping whose top-level key is ``kubernetes``."""
    try:
        raw = read_yaml(Path(path), "config", ConfigError)
    except ConfigError:
        return False
    return isinstance(raw, dict) and "kubernetes" in raw


def load_k8s_config(path: str | Path) -> K8sConfig:
    """Read and validate a Kubernetes cluster config; :class:`ConfigError` names the file and field."""
    path = Path(path)
    raw = read_yaml(path, "config", ConfigError) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: <root>: expected a mapping")
    try:
        cfg = K8sConfig.model_validate({**raw, "base_dir": str(path.resolve().parent)})
    except ValidationError as exc:
        raise ConfigError(format_validation_error(str(path), exc)) from None
    cfg.experiment()  # validate the experiment reference eagerly
    return cfg
