"""Registers the built-in schedulers under their CLI names (imported lazily). The registry
(:mod:`dl2ray.schedulers.base`) hands in its ``register``: this module sits below it."""

from __future__ import annotations

from collections.abc import Callable

from dl2ray.errors import UserError


def register_builtin(register: Callable[..., None]) -> None:
    def drf():
        from dl2ray.schedulers.drf import DRF

        return lambda arg, cfg: DRF()

    def drf_static():
        from dl2ray.schedulers.drf_static import StaticDRF

        return lambda arg, cfg: StaticDRF()

    def optimus_truth():
        from dl2ray.schedulers.optimus.truth import OptimusTruth

        return lambda arg, cfg: OptimusTruth.from_config(cfg)

    def oracle():  # the name optimus-truth had until issue 36: it promised an optimum it is not
        import warnings

        warnings.warn("scheduler 'oracle' is now called 'optimus-truth' (Optimus's greedy on the true "
                      "surfaces, not an optimum); the old name will go", FutureWarning, stacklevel=2)
        return optimus_truth()

    register("drf-static", drf_static)
    register("optimus-truth", optimus_truth, reference=True)
    register("oracle", oracle, reference=True, deprecated=True)
    # fifo/srtf/tetris give a job at most its requested size; *-published fill it to its caps.
    for name in _SIZED:
        register(name, _sized(name, requested=True))
        register(f"{name}-published", _sized(name, requested=False))

    register("drf", drf)
    register("optimus", _optimus)

    register("planner", _planner)
    register("planner-truth", _planner_truth, reference=True)
    register("planner-job-truth", _planner_job_truth, reference=True)

    def dl2():
        from dl2ray.schedulers.dl2 import DL2Scheduler

        return lambda arg, cfg: DL2Scheduler(arg, cfg)

    register("dl2", dl2)
    # SCHED², Harmony and their gang-mode baselines sit above the registry: the dl2ray.schedulers entry
    # points (pyproject.toml) name them, as they name serve:URL.


def _optimus():
    from dl2ray.schedulers.optimus.scheduler import DEFAULT_GAP, Optimus

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


def _planner_job_truth():
    from dl2ray.schedulers.planner import JobTruthPlanner

    def build(arg, cfg):
        if arg is not None:
            raise UserError(f"planner-job-truth:{arg}: takes no argument")
        return JobTruthPlanner(cfg)
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
