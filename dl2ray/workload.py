"""Job types and jobs: what a trace is made of.

A *job type* is one of the eight models of the DL2 testbed with its per-task
resource demand, its caps and the constants of the analytic speed model. A
*job* (:class:`JobSpec`) is one training run of a type: when it arrives, how
many epochs it really needs and how many its user declared.

Resources are always ordered ``(cpu, gpu, mem)`` in units of cores, GPUs and
GB; :data:`RESOURCES` names that order for arrays of shape ``(..., 3)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

RESOURCES: tuple[str, str, str] = ("cpu", "gpu", "mem")


class Demand(BaseModel):
    """Resources one task (a worker or a PS) holds while it runs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cpu: float = Field(ge=0, description="CPU cores")
    gpu: float = Field(ge=0, description="GPUs")
    mem: float = Field(ge=0, description="memory, GB")

    def as_array(self) -> np.ndarray:
        """Shape (3,), float64, in :data:`RESOURCES` order."""
        return np.array([self.cpu, self.gpu, self.mem], dtype=np.float64)


class JobType(BaseModel):
    """One model of the testbed (see ``configs/jobtypes.yaml`` for the values).

    Speed constants (used by the analytic placement model, see
    :mod:`dl2ray.speed`): per-iteration compute time ``compute_s`` (s), model
    size ``model_size_mb`` (MB) and the bandwidth a worker/PS pair reaches
    across nodes (``bw_inter_mbps``) and on one node (``bw_intra_mbps``), MB/s.
    ``batches_per_epoch`` converts the job speed in mini-batches/s into
    epochs/s; ``base_epochs`` is the typical job length before the workload's
    length distribution is applied.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    worker: Demand
    ps: Demand
    max_workers: int = Field(ge=1)
    max_ps: int = Field(ge=1)
    model_size_mb: float = Field(gt=0)
    compute_s: float = Field(gt=0)
    bw_inter_mbps: float = Field(gt=0)
    bw_intra_mbps: float = Field(gt=0)
    batch_size: int = Field(ge=1, description="samples per mini-batch per worker")
    batches_per_epoch: float = Field(gt=0, description="mini-batches in one epoch")
    base_epochs: float = Field(gt=0, description="typical job length, epochs")


class JobCatalogue(BaseModel):
    """The ordered list of job types; a type's index is its one-hot position."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    types: tuple[JobType, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_names(self) -> JobCatalogue:
        names = [t.name for t in self.types]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate job type names: {dupes}")
        return self

    @cached_property
    def _index(self) -> dict[str, int]:
        return {t.name: i for i, t in enumerate(self.types)}

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.types)

    def __len__(self) -> int:
        return len(self.types)

    def index(self, name: str) -> int:
        """Position of type ``name``; ``KeyError`` naming the known types."""
        try:
            return self._index[name]
        except KeyError:
            raise KeyError(f"unknown job type {name!r}; known: {list(self.names)}") from None

    def get(self, name: str) -> JobType:
        return self.types[self.index(name)]

    @cached_property
    def worker_demand(self) -> np.ndarray:
        """Shape (L, 3): per-type worker demand."""
        return np.stack([t.worker.as_array() for t in self.types])

    @cached_property
    def ps_demand(self) -> np.ndarray:
        """Shape (L, 3): per-type PS demand."""
        return np.stack([t.ps.as_array() for t in self.types])


def load_catalogue(path: str | Path) -> JobCatalogue:
    """Read a catalogue YAML of the form ``{types: [{name: ..., ...}, ...]}``."""
    with open(path, encoding="utf-8") as fh:
        raw = yaml.safe_load(fh)
    return JobCatalogue.model_validate(raw)


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One job of a trace.

    ``arrival_slot`` is the time slot in which the job is submitted (it can be
    served from that slot on). ``true_epochs`` is how long it really trains;
    ``est_epochs`` is what its user declared and what schedulers see.
    ``requested_bundles`` is the size its user asked for, in bundles of
    1 worker + 1 PS (the DL2 paper's "user-defined threshold"; an imported
    job's GPU count), or None when the trace names none — then the config's
    ``workload.requested_bundles`` applies. ``workers``/``ps``: the fixed size of a
    job in gang mode (:mod:`dl2ray.gang`; an all-reduce job has ``ps = 0``), None
    in the DL2 simulator. ``queue``/``priority``: its tenant's queue and its priority
    class on a shared cluster (:mod:`dl2ray.tenancy`), None on one pool.
    """

    job_id: int
    job_type: str
    arrival_slot: int
    true_epochs: float
    est_epochs: float
    requested_bundles: int | None = None
    workers: int | None = None
    ps: int | None = None
    queue: str | None = None
    priority: str | None = None

    def __post_init__(self) -> None:
        if self.arrival_slot < 0:
            raise ValueError(f"job {self.job_id}: arrival_slot must be >= 0")
        if not (self.true_epochs > 0 and self.est_epochs > 0):
            raise ValueError(f"job {self.job_id}: epochs must be > 0")
        if self.requested_bundles is not None and self.requested_bundles < 1:
            raise ValueError(f"job {self.job_id}: requested_bundles must be >= 1")


Trace = tuple[JobSpec, ...]
"""A finite job sequence, sorted by ``(arrival_slot, job_id)``."""


def sort_trace(jobs: list[JobSpec] | tuple[JobSpec, ...]) -> Trace:
    """Sort by arrival then id; reject duplicate job ids."""
    ordered = tuple(sorted(jobs, key=lambda j: (j.arrival_slot, j.job_id)))
    ids = [j.job_id for j in ordered]
    if len(set(ids)) != len(ids):
        raise ValueError("duplicate job_id in trace")
    return ordered
