"""The job spec: one training job as a user submits it (``dl2ray submit JOB.yaml``).

Written once and reused: the live Ray agent takes it from ``dl2ray submit``,
the Kubernetes ``DL2Job`` custom resource uses it as its ``spec``, and the Serve
schemas reuse :class:`TaskDemand`. It imports nothing above the core.

A job spec (YAML; every field below, units in the descriptions)::

    name: mlp-a                 # unique among the cluster's jobs: [a-z0-9-], 1-40 chars
    job_type: resnet-50         # the catalogue type the policy treats it as (configs/jobtypes.yaml)
    model: mlp                  # mlp | cnn | mlp-params (elastic_mxnet.training.models)
    epochs: 4                   # declared epochs to train (over `samples` samples)
    samples: 512                # synthetic data set size (samples per epoch)
    global_batch: 32            # samples per iteration, over all workers
    optimizer: {name: sgd, learning_rate: 0.05, momentum: 0.9}
    worker: {cpu: 0.25, gpu: 0, mem: 0.25}   # per-worker demand: cores, GPUs, GB
    ps: {cpu: 0.25, gpu: 0, mem: 0.25}       # per-PS demand
    workers: {min: 1, max: 4}   # bounds on workers while the job runs
    ps_count: {min: 1, max: 2}  # bounds on PS while the job runs
    seed: 0                     # model init and data order
    sample_delay_s: 0.0         # extra seconds of compute per sample (demos: slows a tiny model)
    output: null                # optional .npz path: the final parameters (by order), from the first worker
    queue: null                 # shared clusters: its queue (a name under the experiment's tenancy:)
    priority: null              # its priority class (null: the queue's, else the cluster's default)

The Serve request schema (:mod:`serve.schemas`) reuses :class:`TaskDemand`:
resources are ``(cpu, gpu, mem)`` in cores, GPUs and GB, as in
:data:`dl2ray.workload.RESOURCES`, so a field means the same thing everywhere.

Validation (:func:`load_jobspec`) names the offending field; :func:`check_spec`
adds what needs the catalogue (unknown job type) and the cluster (a demand
larger than every node).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dl2ray.config import format_validation_error, read_yaml
from dl2ray.errors import UserError

NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$")
"""Job names: lowercase letters, digits and dashes, 1-40 characters (also a valid Kubernetes name part)."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TaskDemand(BaseModel):
    """Resources one task (a worker or a parameter server) holds while it runs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cpu: float = Field(ge=0, allow_inf_nan=False, description="CPU cores")
    gpu: float = Field(ge=0, allow_inf_nan=False, description="GPUs")
    mem: float = Field(ge=0, allow_inf_nan=False, description="memory, GB")

    def as_array(self) -> np.ndarray:
        """Shape (3,), float64, in ``(cpu, gpu, mem)`` order."""
        return np.array([self.cpu, self.gpu, self.mem], dtype=np.float64)

    @classmethod
    def of(cls, values) -> TaskDemand:
        """From a shape-(3,) ``(cpu, gpu, mem)`` sequence or array."""
        cpu, gpu, mem = (float(v) for v in values)
        return cls(cpu=cpu, gpu=gpu, mem=mem)


class Bounds(_Frozen):
    """Lower and upper bound on a task count while the job runs (a paused job has none)."""

    min: int = Field(default=1, ge=1, description="fewest tasks of this role while running")
    max: int = Field(default=4, ge=1, description="most tasks of this role (the scheduler's cap)")

    @model_validator(mode="after")
    def _ordered(self) -> Bounds:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) is above max ({self.max})")
        return self


class OptimizerSpec(_Frozen):
    """The optimizer the PS run (MXNet's parametrisation; ``momentum`` is for SGD only)."""

    name: Literal["sgd", "adam"] = "sgd"
    learning_rate: float = Field(default=0.05, gt=0, description="step size")
    momentum: float = Field(default=0.9, ge=0, lt=1, description="SGD momentum")
    wd: float = Field(default=0.0, ge=0, description="weight decay")


class JobSpec(_Frozen):
    """One elastic MXNet training job (module docstring: the YAML form)."""

    name: str = Field(description="unique job name: [a-z0-9-], 1-40 characters")
    job_type: str = Field(description="job type the policy treats it as (a name in the catalogue)")
    model: Literal["mlp", "cnn", "mlp-params"] = Field(
        default="mlp", description="Gluon model of elastic_mxnet.training.models")
    model_params: int = Field(default=1_000_000, ge=1, description="parameters of mlp-params")
    epochs: float = Field(default=2.0, gt=0, description="declared epochs to train")
    samples: int = Field(default=512, ge=1, description="synthetic data set size (samples per epoch)")
    global_batch: int = Field(default=32, ge=1, description="samples per iteration over all workers")
    optimizer: OptimizerSpec = OptimizerSpec()
    worker: TaskDemand = Field(default=TaskDemand(cpu=1, gpu=0, mem=1), description="per-worker demand")
    ps: TaskDemand = Field(default=TaskDemand(cpu=1, gpu=0, mem=1), description="per-PS demand")
    workers: Bounds = Bounds()
    ps_count: Bounds = Bounds(max=2)
    seed: int = Field(default=0, ge=0, description="model initialisation and data order")
    output: str | None = Field(
        default=None, description="file (.npz) the first worker writes the final parameters to, by order")
    sample_delay_s: float = Field(
        default=0.0, ge=0, le=1.0,
        description="extra seconds of compute per sample of a worker's share (demos and tests)")
    queue: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
                              description="its queue on a shared cluster (docs/tenancy.md); None: the first")
    priority: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
                                 description="its priority class; None: its queue's, else the default")

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not NAME_RE.match(name):
            raise ValueError(f"{name!r}: use lowercase letters, digits and dashes (1-40 characters)")
        return name

    @model_validator(mode="after")
    def _check(self) -> JobSpec:
        if self.global_batch > self.samples:
            raise ValueError(f"global_batch ({self.global_batch}) exceeds samples ({self.samples})")
        return self

    @property
    def iterations(self) -> int:
        """Iterations to train: ``ceil(epochs · samples / global_batch)``."""
        return math.ceil(self.epochs * self.samples / self.global_batch - 1e-9)

    def worker_args(self, iterations: int | None = None) -> list[str]:
        """Arguments of ``python -m elastic_mxnet.demo_train`` for every worker of this job.

        ``iterations``: train that many instead of :attr:`iterations` (0: until the job is stopped,
        as a live profile runs it).
        """
        opt = self.optimizer
        its = self.iterations if iterations is None else iterations
        args = ["--model", self.model, "--params", str(self.model_params),
                "--iterations", str(its), "--global-batch", str(self.global_batch),
                "--samples", str(self.samples), "--optimizer", opt.name, "--lr", repr(opt.learning_rate),
                "--wd", repr(opt.wd), "--seed", str(self.seed)]
        if opt.name == "sgd":
            args += ["--momentum", repr(opt.momentum)]
        if self.output:
            args += ["--out", self.output]
        if self.sample_delay_s:
            args += ["--sample-sleep", repr(self.sample_delay_s)]
        return args


def parse_jobspec(raw: object, source: str = "job spec") -> JobSpec:
    """Validate a parsed YAML/JSON document; :class:`UserError` naming ``source: field: problem``."""
    if not isinstance(raw, dict):
        raise UserError(f"{source}: <root>: expected a mapping of job fields")
    try:
        return JobSpec.model_validate(raw)
    except ValidationError as exc:
        raise UserError(format_validation_error(source, exc)) from None


def load_jobspec(path: str | Path) -> JobSpec:
    """Read and validate a job spec file."""
    path = Path(path)
    return parse_jobspec(read_yaml(path, "job spec", UserError), str(path))


def check_spec(spec: JobSpec, job_types: tuple[str, ...], node_capacity: np.ndarray) -> None:
    """What the spec alone cannot tell: a known ``job_type``, and each task fitting on some node.

    ``node_capacity``: shape (N, 3) per-node (cpu, gpu, mem). Raises :class:`UserError` naming the field.
    """
    if spec.job_type not in job_types:
        raise UserError(f"job_type: unknown job type {spec.job_type!r}; known: {list(job_types)}")
    for role in ("worker", "ps"):
        demand: TaskDemand = getattr(spec, role)
        d = demand.as_array()
        if node_capacity.size == 0 or not (node_capacity >= d - 1e-9).all(axis=1).any():
            largest = node_capacity.max(axis=0) if node_capacity.size else np.zeros(3)
            raise UserError(
                f"{role}: demand (cpu {d[0]:g}, gpu {d[1]:g}, mem {d[2]:g} GB) fits on no node "
                f"(largest: cpu {largest[0]:g}, gpu {largest[1]:g}, mem {largest[2]:g} GB)")
