"""Registers the built-in schedulers under their CLI names (imported lazily)."""

from __future__ import annotations

from dl2ray.schedulers.base import register


def register_builtin() -> None:
    def drf():
        from dl2ray.schedulers.drf import DRF

        return lambda arg, cfg: DRF()

    register("drf", drf)

    def dl2():
        from dl2ray.schedulers.dl2 import DL2Scheduler

        return lambda arg, cfg: DL2Scheduler(arg, cfg)

    register("dl2", dl2)
