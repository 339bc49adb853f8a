"""The job spec messages shared by every way a job reaches dl2ray (pydantic, written once).

``dl2ray submit JOB.yaml``, the ``DL2Job`` custom resource and the job part of
the Serve request schema (:mod:`serve.schemas`) all describe a job's tasks with
the models defined here, so a field means the same thing everywhere and is
validated the same way.

Resources are ``(cpu, gpu, mem)`` in cores, GPUs and GB, as in
:data:`dl2ray.workload.RESOURCES`.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field


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
