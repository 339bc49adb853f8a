"""Settings of one elastic job, grouped, frozen, with units in the names."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Liveness:
    """Heartbeats and timeouts (seconds).

    A member silent for ``heartbeat_timeout_s`` is declared dead. A member whose
    coordinator has not answered for ``orphan_timeout_s`` exits (no orphans).
    After a restart the coordinator collects re-registrations for
    ``rejoin_grace_s`` before it rebuilds the membership.
    """

    heartbeat_interval_s: float = 0.1
    heartbeat_timeout_s: float = 2.0
    orphan_timeout_s: float = 30.0
    rejoin_grace_s: float = 1.5


@dataclass(frozen=True)
class Limits:
    """What a scale request may ask for, and how long an operation may take (seconds)."""

    min_ps: int = 1
    max_ps: int = 8
    min_workers: int = 1
    max_workers: int = 16
    register_timeout_s: float = 60.0
    operation_timeout_s: float = 120.0
    prepare_attempts: int = 5


@dataclass(frozen=True)
class Sharding:
    """How parameters are cut into chunks and snapshotted.

    ``chunk_elems``: largest chunk in elements (float32: 4 bytes each); arrays
    above it are split. ``snapshot_every``: PS write their shards to
    ``snapshot_dir`` every that many updates (``""``: a fresh temporary dir).
    """

    chunk_elems: int = 1 << 17
    snapshot_every: int = 20
    snapshot_dir: str = ""


@dataclass(frozen=True)
class JobConfig:
    """Everything the coordinator needs besides the member processes themselves."""

    host: str = "127.0.0.1"
    port: int = 0
    initial_ps: int = 1
    initial_workers: int = 1
    liveness: Liveness = field(default_factory=Liveness)
    limits: Limits = field(default_factory=Limits)
    sharding: Sharding = field(default_factory=Sharding)
