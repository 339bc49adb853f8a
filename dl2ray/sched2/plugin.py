"""SCHED²'s schedulers as the registry finds them: the ``dl2ray.schedulers`` entry points in
``pyproject.toml`` name these factories ``(arg, cfg) -> Scheduler``, the same way ``serve:URL`` is found.
The registry (:mod:`dl2ray.schedulers.base`) imports nothing of ``sched2``: this package sits above it."""

from __future__ import annotations

from dl2ray.sched2.baselines import factory
from dl2ray.sched2.scheduler import load as sched2

__all__ = ["dsif", "fifo_gang", "lrf", "saf", "sched2", "sif", "spf"]

# SCHED²'s job-selection baselines in gang mode (dl2ray.gang)
sif = factory("sif")
dsif = factory("dsif")
saf = factory("saf")
lrf = factory("lrf")
spf = factory("spf")
fifo_gang = factory("fifo-gang")
