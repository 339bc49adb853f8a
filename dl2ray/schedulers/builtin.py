"""Registers the built-in schedulers under their CLI names (imported lazily)."""

from __future__ import annotations

from dl2ray.schedulers.base import register


def register_builtin() -> None:
    def drf():
        from dl2ray.schedulers.drf import DRF

        return lambda arg, cfg: DRF()

    def fifo():
        from dl2ray.schedulers.fifo import FIFO

        return lambda arg, cfg: FIFO()

    def srtf():
        from dl2ray.schedulers.srtf import SRTF

        return lambda arg, cfg: SRTF()

    def tetris():
        from dl2ray.schedulers.tetris import Tetris

        return lambda arg, cfg: Tetris()

    def optimus():
        from dl2ray.schedulers.optimus import DEFAULT_GAP, Optimus

        return lambda arg, cfg: Optimus(
            cfg.sim.convergence_gap if cfg is not None else DEFAULT_GAP
        )

    register("drf", drf)
    register("fifo", fifo)
    register("srtf", srtf)
    register("tetris", tetris)
    register("optimus", optimus)

    def dl2():
        from dl2ray.schedulers.dl2 import DL2Scheduler

        return lambda arg, cfg: DL2Scheduler(arg, cfg)

    register("dl2", dl2)
