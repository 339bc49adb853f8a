"""The live Ray cluster's config (``configs/live-*.yaml``): frozen, grouped, every field with unit and
default.

::

    live:
      experiment: testbed.yaml              # the experiment config the schedulers are built for
      scheduler: dl2:../models/dl2-testbed.pt
      slot_seconds: 10
      ray: {num_cpus: 2, dashboard_port: 8265}
      guardrail: {fallback: drf, time_budget_s: 5}
      shadow: false
      learn: {enabled: false, steps_per_update: 32}
      pool: {per_node: 2}                   # warm members per node for scale-ups (0: none)
      reads: {push: true, lead_s: 0.25}     # how the agent reads the jobs each slot
      log_dir: runs/live

The fields every agent has (``experiment``, ``scheduler``, ``slot_seconds``,
``guardrail``, ``log_dir``) are :class:`~clusters.agent.settings.AgentSettings`;
the groups below are the Ray cluster's own. Paths are relative to the config
file's folder unless absolute.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import Field

from clusters.agent.settings import AgentConfig, AgentSettings, FrozenModel, Guardrail, load_agent_config

__all__ = ["Guardrail", "Learn", "LiveConfig", "LiveSettings", "Pool", "RaySettings", "Reads", "Timeouts",
           "load_live_config"]


class RaySettings(FrozenModel):
    """The local Ray head ``dl2ray cluster up`` starts (when no ``--address`` is given)."""

    num_cpus: int | None = Field(default=None, ge=1, description="CPUs of the head (default: all cores)")
    dashboard_port: int = Field(default=8265, ge=1, le=65535, description="Ray jobs API / dashboard port")


class Learn(FrozenModel):
    """Online learning from live slots (``--learn``): gradients to the GlobalPolicy actor."""

    enabled: bool = False
    steps_per_update: int = Field(default=32, ge=1, description="decision steps per gradient push")
    global_policy: str = Field(default="dl2ray-global-policy", description="name of the GlobalPolicy actor")
    seed: int = Field(default=0, ge=0, description="action sampling seed")


class Timeouts(FrozenModel):
    """Member liveness and start-up (seconds)."""

    heartbeat_timeout_s: float = Field(default=5.0, gt=0, description="silent member declared dead after")
    register_timeout_s: float = Field(default=60.0, gt=0, description="new members must register within")
    orphan_timeout_s: float = Field(
        default=120.0, gt=0,
        description="a member whose coordinator is silent this long exits (covers a job host's restart)")


class Pool(FrozenModel):
    """The warm pool (clusters/ray/pool.py): idle member processes, MXNet imported, that scale-ups take."""

    per_node: int = Field(default=2, ge=0, le=32,
                          description="idle members kept per node (0: no pool, every member starts cold)")
    refill_interval_s: float = Field(default=0.5, gt=0, le=60, description="how often the pool refills (s)")


class Reads(FrozenModel):
    """How the agent's view reads the jobs each slot (clusters/ray/readings.py, docs/live.md "The view")."""

    push: bool = Field(default=True, description="hosts push their slot readings, the view reads them in one "
                       "GCS call (false: the view asks every host each slot and waits for the answers)")
    lead_s: float = Field(default=0.25, ge=0,
                          description="hosts close their slot and push this long before each slot starts "
                          "(s; at most half a slot): the margin in which the readings arrive")
    resync_slots: int = Field(default=1, ge=1, description="a job whose reading has been missing this many "
                              "slots is asked directly, without waiting (a host restarted, stuck or gone)")
    nodes_ttl_s: float = Field(default=4.0, ge=0,
                               description="ray.nodes() is read again at most this often (s; 0: every slot)")
    hosts_ttl_s: float = Field(default=4.0, ge=0, description="the job hosts are listed again at most this "
                               "often (s; 0: every slot; a job submitted through the agent is read at once)")


class LiveSettings(AgentSettings):
    agent_name: str = Field(default="dl2ray-agent", description="name of the agent actor")
    ray: RaySettings = RaySettings()
    shadow: bool = Field(default=False, description="decide with the policy, apply the fallback")
    learn: Learn = Learn()
    timeouts: Timeouts = Timeouts()
    pool: Pool = Pool()
    reads: Reads = Reads()
    log_dir: str = Field(default="runs/live", description="decision log (Parquet) and cluster state")


class LiveConfig(AgentConfig):
    KEY: ClassVar[str] = "live"
    live: LiveSettings = LiveSettings()


def load_live_config(path: str | Path) -> LiveConfig:
    """Read and validate a live config; :class:`~dl2ray.config.ConfigError` names the file and field."""
    return load_agent_config(path, LiveConfig)
