"""The scaling rules both live backends apply (Ray: :mod:`clusters.ray`, Kubernetes:
:mod:`clusters.k8s`), written once.

* :func:`bounded` — the ``(ps, workers)`` a running job gets: the scheduler's counts clamped to its spec's
  ``ps_count`` and ``workers`` bounds;
* :data:`PAUSED_PS` — a paused job (no worker) keeps one PS, which holds its parameters and optimizer
  state, so it resumes where it stopped;
* :func:`grows` — whether a change starts members: a backend runs a slot's scale-downs (and pauses)
  first, since they free what the scale-ups then take.
"""

from __future__ import annotations

from dl2ray.jobspec import JobSpec

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
