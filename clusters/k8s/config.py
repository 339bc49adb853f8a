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

The fields every agent has are :class:`~clusters.agent.settings.AgentSettings`;
the groups below are Kubernetes'. Paths are relative to the config file's
folder unless absolute. A file is a Kubernetes config if its top-level key is
``kubernetes`` (:func:`is_k8s_config`); ``dl2ray cluster up`` dispatches on that.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import Field

from clusters.agent.settings import AgentConfig, AgentSettings, FrozenModel, is_config_of, load_agent_config


class ApiSettings(FrozenModel):
    """Calls to the Kubernetes API server: per-call timeout and retries with capped exponential backoff."""

    timeout_s: float = Field(default=5.0, gt=0, description="seconds one API call may take")
    attempts: int = Field(default=6, ge=1, description="tries per call on 429/5xx/timeouts (1: no retry)")
    backoff_s: float = Field(default=0.2, ge=0, description="first wait between tries; doubles each time")
    backoff_max_s: float = Field(default=5.0, ge=0, description="longest wait between tries")


class PodSettings(FrozenModel):
    """How the job's pods run."""

    ready_timeout_s: float = Field(default=120.0, gt=0, description="new pods must be Ready within")
    release_timeout_s: float = Field(
        default=30.0, gt=0, description="released members must exit within (then their pods are deleted)"
    )
    coordinator_port: int = Field(default=5555, ge=1, le=65535, description="coordinator's TCP port")
    python: str = Field(default="python", description="the interpreter in the image (pod command lines)")
    heartbeat_timeout_s: float = Field(default=5.0, gt=0, description="silent member declared dead after")
    register_timeout_s: float = Field(default=60.0, gt=0, description="new members must register within")


class K8sSettings(AgentSettings):
    namespace: str = Field(default="default", description="namespace of DL2Jobs, pods and services")
    kubeconfig: str | None = Field(default=None, description="kubeconfig path; null: in-cluster config")
    context: str | None = Field(default=None, description="kubeconfig context (null: the current one)")
    image: str = Field(default="dl2ray:0.1.0", description="image of the job pods (Dockerfile)")
    image_pull_policy: str = Field(default="IfNotPresent", description="of the job pods")
    api: ApiSettings = ApiSettings()
    pods: PodSettings = PodSettings()
    parallel_jobs: int = Field(default=8, ge=1, description="jobs reconciled at once in one slot")
    log_dir: str = Field(default="runs/k8s", description="decision log (Parquet)")


class K8sConfig(AgentConfig):
    KEY: ClassVar[str] = "kubernetes"
    kubernetes: K8sSettings = K8sSettings()

    def kubeconfig_path(self) -> Path | None:
        k = self.kubernetes.kubeconfig
        return None if k is None else self.resolve(str(Path(k).expanduser()))


def is_k8s_config(path: str | Path) -> bool:
    """True if ``path`` is a YAML mapping whose top-level key is ``kubernetes``."""
    return is_config_of(path, K8sConfig)


def load_k8s_config(path: str | Path) -> K8sConfig:
    """Read and validate a Kubernetes cluster config; :class:`~dl2ray.config.ConfigError` names the file
    and field."""
    return load_agent_config(path, K8sConfig)
