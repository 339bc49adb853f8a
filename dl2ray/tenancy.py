"""Shared clusters: queues with quotas, borrowing and lending, priorities, and each slot's entitlements.

The model follows the operators' stacks (docs/tenancy.md gives each anchor and where dl2ray differs):

- a **queue** (Kueue's ClusterQueue, Volcano's queue, a Philly virtual cluster) has a
  ``nominal`` quota per resource (cpu cores, GPUs, GB of memory), an optional
  ``borrowing_limit`` (how much above nominal it may use of what others lend;
  None: no limit), an optional ``lending_limit`` (how much of its unused nominal it
  lends; None: all of it), a fair-sharing ``weight`` and a ``cohort`` it shares
  with;
- a **priority class** (Kubernetes' PriorityClass, KAI's split) has a ``value``
  (who is reclaimed first: the lowest) and, apart from it, ``preemptible``:
  a job of a non-preemptible class is never shrunk or paused for reclaim, and so
  runs within its queue's nominal quota only (it never borrows);
- ``min_run_slots`` (Kueue KEP ``minAdmitDuration``): a job that has run fewer
  slots than this is not shrunk or paused for reclaim — against thrashing.

**Entitlements** (:func:`entitlements`), per slot, per cohort, per resource
``r``, from each queue's demand ``D_q`` (what its jobs ask for; the queue layer,
:mod:`dl2ray.schedulers.queued`, asks the scheduler):

1. guaranteed ``G_q = min(N_q, D_q)`` (``N_q`` nominal);
2. the cohort's lendable pool ``P = Σ_q min(L_q, N_q − G_q)`` (``L_q`` the
   lending limit), the capacity its owners do not need now;
3. each queue's want beyond nominal ``X_q = min(B_q, D_q − G_q)`` (``B_q`` the
   borrowing limit) is served from ``P`` by weighted water-filling: every queue
   with unmet want gets ``P · w_q / Σ w`` of what is left, capped at its want,
   until ``P`` or the wants run out;
4. ``E_q = G_q + borrowed_q``.

So ``E_q ≤ N_q + B_q``, ``Σ_q E_q ≤ Σ_q N_q``, and a queue with demand gets at
least ``min(N_q, D_q)``: its quota back the slot it asks for it.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

RESOURCE_NAMES = ("cpu", "gpu", "mem")
"""The order of a quota's resources in arrays of shape (3,) (as :data:`dl2ray.workload.RESOURCES`)."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Resources(_Frozen):
    """An amount of each resource: cpu cores, GPUs, GB of memory."""

    cpu: float = Field(default=0.0, ge=0)
    gpu: float = Field(default=0.0, ge=0)
    mem: float = Field(default=0.0, ge=0)

    def as_array(self) -> np.ndarray:
        """Shape (3,), float64, in :data:`RESOURCE_NAMES` order."""
        return np.array([self.cpu, self.gpu, self.mem], dtype=np.float64)


class QueueSpec(_Frozen):
    """One tenant's queue (module docstring). ``share``: its part of a *generated* workload's jobs;
    ``priority``: the class of its jobs when a trace names none."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    nominal: Resources
    borrowing_limit: Resources | None = Field(
        default=None, description="most it may use above nominal, of what others lend; None: no limit")
    lending_limit: Resources | None = Field(
        default=None, description="most of its unused nominal it lends; None: all of it")
    weight: float = Field(default=1.0, gt=0, description="fair-sharing weight when borrowing")
    cohort: str = Field(default="default", min_length=1)
    share: float = Field(default=1.0, ge=0, description="part of generated jobs that arrive in this queue")
    priority: str | None = Field(default=None, description="its jobs' class when a trace names none")


class PriorityClass(_Frozen):
    """``value``: reclaimed lowest first; ``preemptible``: may it be shrunk or paused for reclaim."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    value: int = 0
    preemptible: bool = True


class TenancyConfig(_Frozen):
    """The ``tenancy:`` group of a config: the queues, the priority classes and the reclaim guard."""

    queues: tuple[QueueSpec, ...] = Field(min_length=1)
    priority_classes: tuple[PriorityClass, ...] = (PriorityClass(name="normal"),)
    default_priority: str = "normal"
    min_run_slots: int = Field(default=1, ge=0, description="slots a job runs before it may be shrunk "
                               "or paused for reclaim (Kueue's minAdmitDuration)")

    @model_validator(mode="after")
    def _consistent(self) -> TenancyConfig:
        for what, names in (("queues", [q.name for q in self.queues]),
                            ("priority_classes", [p.name for p in self.priority_classes])):
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                raise ValueError(f"{what}: duplicate names {dupes}")
        classes = {p.name for p in self.priority_classes}
        if self.default_priority not in classes:
            raise ValueError(f"default_priority: {self.default_priority!r} is not a priority class "
                             f"(known: {sorted(classes)})")
        for i, q in enumerate(self.queues):
            if q.priority is not None and q.priority not in classes:
                raise ValueError(f"queues.{i}.priority: {q.priority!r} is not a priority class "
                                 f"(known: {sorted(classes)})")
        if sum(q.share for q in self.queues) <= 0:
            raise ValueError("queues: at least one queue needs a share > 0 of the generated jobs")
        return self

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(q.name for q in self.queues)

    def queue_of(self, queue: str | None) -> str:
        """The queue a job naming ``queue`` is in: that one, else (a trace or spec that names none) the
        first queue."""
        return queue if queue is not None else self.queues[0].name

    def queue(self, name: str) -> QueueSpec:
        """The queue ``name``; KeyError naming the known queues."""
        for q in self.queues:
            if q.name == name:
                return q
        raise KeyError(f"unknown queue {name!r}; known: {list(self.names)}")

    def priority_class(self, name: str | None) -> PriorityClass:
        """The class ``name`` (the default class for None); KeyError naming the known classes."""
        name = name or self.default_priority
        for p in self.priority_classes:
            if p.name == name:
                return p
        raise KeyError(f"unknown priority class {name!r}; known: {[p.name for p in self.priority_classes]}")

    def job_priority(self, queue: str, priority: str | None) -> PriorityClass:
        """A job's class: its own, else its queue's, else the default."""
        return self.priority_class(priority or self.queue(queue).priority)

    def check_capacity(self, capacity: np.ndarray) -> None:
        """ValueError if a cohort's nominal quotas add up to more than the cluster has (``capacity``: shape
        (N, 3) or (3,)): a guarantee must be something the cluster can give."""
        total = np.asarray(capacity, dtype=np.float64)
        total = total.sum(axis=0) if total.ndim == 2 else total
        for cohort in sorted({q.cohort for q in self.queues}):
            nominal = sum((q.nominal.as_array() for q in self.queues if q.cohort == cohort), np.zeros(3))
            over = [f"{r} {nominal[k]:g} > {total[k]:g}" for k, r in enumerate(RESOURCE_NAMES)
                    if nominal[k] > total[k] + 1e-9]
            if over:
                raise ValueError(f"queues: cohort {cohort!r}'s nominal quotas exceed the cluster "
                                 f"({', '.join(over)})")


def _limit(r: Resources | None) -> np.ndarray:
    return np.full(3, np.inf) if r is None else r.as_array()


def entitlements(tenancy: TenancyConfig, demand: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per queue: the resources (shape (3,)) it may hold this slot, from each queue's ``demand`` (shape (3,);
    a queue not in ``demand`` asks for nothing). The module docstring gives the rule."""
    out: dict[str, np.ndarray] = {}
    for cohort in dict.fromkeys(q.cohort for q in tenancy.queues):
        queues = [q for q in tenancy.queues if q.cohort == cohort]
        nominal = {q.name: q.nominal.as_array() for q in queues}
        want = {q.name: np.asarray(demand.get(q.name, np.zeros(3)), dtype=np.float64) for q in queues}
        guaranteed = {n: np.minimum(nominal[n], want[n]) for n in nominal}
        unused = {q.name: nominal[q.name] - guaranteed[q.name] for q in queues}
        pool = sum((np.minimum(_limit(q.lending_limit), unused[q.name]) for q in queues), np.zeros(3))
        extra = {q.name: np.minimum(_limit(q.borrowing_limit), want[q.name] - guaranteed[q.name])
                 for q in queues}
        borrowed = {n: np.zeros(3) for n in nominal}
        weights = {q.name: q.weight for q in queues}
        for r in range(3):
            left = float(pool[r])
            open_ = [n for n in nominal if extra[n][r] > 1e-12]
            while left > 1e-12 and open_:
                total_w = sum(weights[n] for n in open_)
                give = {n: left * weights[n] / total_w for n in open_}
                for n in open_:
                    take = min(give[n], extra[n][r] - borrowed[n][r])
                    borrowed[n][r] += take
                    left -= take
                open_ = [n for n in open_ if extra[n][r] - borrowed[n][r] > 1e-12]
        for n in nominal:
            out[n] = guaranteed[n] + borrowed[n]
    return out
