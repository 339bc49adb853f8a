"""The scaling rules both live backends apply (Ray: :mod:`clusters.ray`, Kubernetes:
:mod:`clusters.k8s`), written once.

* :func:`bounded` — the ``(ps, workers)`` a running job gets: the scheduler's counts clamped to its spec's
  ``ps_count`` and ``workers`` bounds;
* :data:`PAUSED_PS` — a paused job (no worker) keeps one PS, which holds its parameters and optimizer
  state, so it resumes where it stopped;
* :func:`grows` — whether a change starts members: a backend runs a slot's scale-downs (and pauses)
  first, since they free what the scale-ups then take;
* :class:`Changes` — a slot's changes sorted that way, a busy job's left for a later slot.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

from clusters.agent.reports import ApplyReport, ScaleAction
from dl2ray.jobspec import JobSpec

J = TypeVar("J")

PAUSED_PS = 1
"""PS a paused job keeps (its parameters and optimizer state)."""


def bounded(ps: int, workers: int, spec: JobSpec) -> tuple[int, int]:
    """``(ps, workers)`` within ``spec.ps_count`` and ``spec.workers`` (min and max, inclusive)."""
    return (min(max(ps, spec.ps_count.min), spec.ps_count.max),
            min(max(workers, spec.workers.min), spec.workers.max))


def grows(before: tuple[int, int], target: tuple[int, int]) -> bool:
    """Whether going from ``before`` to ``target`` (both ``(ps, workers)``) starts members: more PS or
    more workers, and not a stop (``(0, 0)``)."""
    return target != (0, 0) and (target[0] > before[0] or target[1] > before[1])


@dataclass
class Changes(Generic[J]):
    """One slot's changes of a backend's jobs (``J``: its job record), each as a :class:`ScaleAction`:
    ``downs`` (scale-downs, pauses, stops) to run first, then ``ups``."""

    report: ApplyReport
    downs: list[tuple[J, ScaleAction]] = field(default_factory=list)
    ups: list[tuple[J, ScaleAction]] = field(default_factory=list)

    def add(self, job: J, name: str, before: tuple[int, int], target: tuple[int, int], busy: bool) -> None:
        """Job ``name`` goes from ``before`` to ``target`` (both ``(ps, workers)``, ``target != before``);
        a ``busy`` one (an operation in progress) is left for a later slot (``report.skipped_busy``)."""
        if busy:
            self.report.skipped_busy.append(name)
            return
        action = ScaleAction(name, before, target)
        (self.ups if grows(before, target) else self.downs).append((job, action))
