"""Harmony's schedulers as the registry finds them: the ``dl2ray.schedulers`` entry points in
``pyproject.toml`` name these factories ``(arg, cfg) -> Scheduler``, the same way ``serve:URL`` is found.
The registry (:mod:`dl2ray.schedulers.base`) imports nothing of ``harmony``: this package sits above it."""

from __future__ import annotations

from dl2ray.harmony.baselines import factory
from dl2ray.harmony.planner import load as harmony_planner
from dl2ray.harmony.policy import load as harmony

__all__ = ["harmony", "harmony_planner", "lb_place", "lif_linear", "pack_place", "random_place",
           "tetris_place"]

# placement baselines in gang mode (dl2ray.gang)
lb_place = factory("lb-place")
tetris_place = factory("tetris-place")
lif_linear = factory("lif-linear")
random_place = factory("random-place")
pack_place = factory("pack-place")
