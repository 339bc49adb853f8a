"""Registers the built-in schedulers under their CLI names (imported lazily)."""

from __future__ import annotations

from dl2ray.errors import UserError
from dl2ray.schedulers.base import register


def register_builtin() -> None:
    def drf():
        from dl2ray.schedulers.drf import DRF

        return lambda arg, cfg: DRF()

    def drf_static():
        from dl2ray.schedulers.drf_static import StaticDRF

        return lambda arg, cfg: StaticDRF()

    def oracle():
        from dl2ray.schedulers.oracle import Oracle

        return lambda arg, cfg: Oracle.from_config(cfg)

    register("drf-static", drf_static)
    register("oracle", oracle, reference=True)
    # fifo/srtf/tetris give a job at most its requested size; *-published fill it to its caps.
    for name in _SIZED:
        register(name, _sized(name, requested=True))
        register(f"{name}-published", _sized(name, requested=False))

    register("drf", drf)
    register("optimus", _optimus)

    register("planner", _planner)
    register("planner-truth", _planner_truth, reference=True)

    def dl2():
        from dl2ray.schedulers.dl2 import DL2Scheduler

        return lambda arg, cfg: DL2Scheduler(arg, cfg)

    register("dl2", dl2)

    # gang mode (dl2ray.gang): SCHED²'s job-selection baselines and its DQN, Harmony's placements
    for name in ("sif", "dsif", "saf", "lrf", "spf", "fifo-gang"):
        register(name, _gang_baseline(name))

    def sched2():
        from dl2ray.sched2.scheduler import load

        return load

    register("sched2", sched2)
    def harmony():
        from dl2ray.harmony.policy import load as load_harmony

        return load_harmony

    register("harmony", harmony)
    register("harmony-planner", _harmony_planner)
    for name in ("lb-place", "tetris-place", "lif-linear", "random-place", "pack-place"):
        register(name, _harmony_baseline(name))


def _optimus():
    from dl2ray.schedulers.optimus import DEFAULT_GAP, Optimus

    def build(arg, cfg):
        if arg not in (None, "type"):
            raise UserError(f"optimus:{arg}: unknown variant; known: optimus (per-job fits), optimus:type")
        return Optimus(cfg.sim.convergence_gap if cfg is not None else DEFAULT_GAP, per_job=arg is None)
    return build


def _planner():
    from dl2ray.schedulers.planner import Planner, operator_cost

    return lambda arg, cfg: Planner(operator_cost(cfg, arg))


def _planner_truth():
    from dl2ray.schedulers.planner import Planner, profiled_cost

    def build(arg, cfg):
        planner = Planner(profiled_cost(cfg, arg or "surfaces"))
        planner.name, planner.reference = "planner-truth", True
        return planner
    return build


_SIZED = {"fifo": "FIFO", "srtf": "SRTF", "tetris": "Tetris"}
"""Module → class of the heuristics that come in a requested-size and a fill-to-caps variant."""


def _sized(module: str, requested: bool):
    """Loader of FIFO, SRTF or Tetris honouring requested sizes (or, for ``*-published``, not)."""
    def load():
        from importlib import import_module

        cls = getattr(import_module(f"dl2ray.schedulers.{module}"), _SIZED[module])
        return lambda arg, cfg: cls(requested)
    return load


def _gang_baseline(name: str):
    def load():
        from dl2ray.sched2.baselines import factory

        return factory(name)
    return load


def _harmony_planner():
    from dl2ray.harmony.planner import load

    return load


def _harmony_baseline(name: str):
    def load():
        from dl2ray.harmony.baselines import factory

        return factory(name)
    return load
