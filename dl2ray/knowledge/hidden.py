"""What a deployable scheduler may know: the config with the simulator's truth taken out.

A scheduler is *deployable* when every input it has is something an operator
has: the cluster (nodes, placement policy), the job-type catalogue (demands,
caps, batch sizes), the slot length, the policy settings, the operator's speed
profile (:mod:`dl2ray.knowledge.profile`), and what the cluster shows in each
:class:`~dl2ray.view.ClusterView` (declared epochs, observed speeds and
losses). Everything else in an :class:`~dl2ray.config.ExperimentConfig` is the
simulated world's truth or the recipe of its traces:

- ``speed``: the true speed surfaces and their noise, per-job deviation and
  interference (and with them ``surfaces_dir``);
- ``workload.epoch_error``: how wrong the declared epochs are;
- ``gang.interference``: gang mode's hidden co-location model.

:func:`operator_config` returns a copy of the config in which each of these is
a :class:`Hidden` value: reading any attribute of it raises
:class:`TruthAccessError` naming the field. The scheduler registry
(:func:`dl2ray.schedulers.base.make_scheduler`) hands every scheduler that is
not registered as a *reference* this copy, so a deployable scheduler cannot
reach the truth through its config; ``tests/schedulers/test_knowledge.py``
proves it cannot through the view or a file either.
"""

from __future__ import annotations

from dl2ray.config import ExperimentConfig
from dl2ray.errors import UserError


class TruthAccessError(UserError, AttributeError):
    """A deployable scheduler read a field of the simulator's truth."""


class Hidden:
    """Stands in for a config field a deployable scheduler must not read (module docstring)."""

    __slots__ = ("_field",)

    def __init__(self, field: str) -> None:
        object.__setattr__(self, "_field", field)

    def __getattr__(self, name: str):
        raise TruthAccessError(
            f"{object.__getattribute__(self, '_field')}.{name} is the simulator's truth: a deployable "
            "scheduler cannot read it (only references may; dl2ray.knowledge)")

    def __repr__(self) -> str:
        return f"Hidden({object.__getattribute__(self, '_field')!r})"

    def _use(self, *_args):
        raise TruthAccessError(
            f"{object.__getattribute__(self, '_field')} is the simulator's truth: a deployable scheduler "
            "cannot use it (only references may; dl2ray.knowledge)")

    # any use of a hidden scalar (arithmetic, comparison, conversion, formatting) raises too
    __float__ = __int__ = __index__ = __bool__ = __format__ = _use
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _use
    __lt__ = __le__ = __gt__ = __ge__ = __neg__ = __abs__ = __pow__ = __rpow__ = _use


class _OperatorConfig(ExperimentConfig):
    """An :class:`ExperimentConfig` whose truth fields are :class:`Hidden` (never validated again)."""

    @property
    def surfaces_dir(self):
        raise TruthAccessError("speed.surfaces (the true speed surfaces) is the simulator's truth: a "
                               "deployable scheduler reads the operator's profile instead")


def operator_config(cfg: ExperimentConfig) -> ExperimentConfig:
    """``cfg`` as an operator knows it (module docstring); an operator config is returned as it is."""
    if isinstance(cfg, _OperatorConfig):
        return cfg
    workload = cfg.workload.model_copy(update={"epoch_error": Hidden("workload.epoch_error")})
    update: dict = {"speed": Hidden("speed"), "workload": workload}
    if cfg.gang is not None:
        update["gang"] = cfg.gang.model_copy(update={"interference": Hidden("gang.interference")})
    values = {**dict(cfg), **update}
    out = _OperatorConfig.model_construct(**values)
    if "catalogue" in cfg.__dict__:  # keep the catalogue already read (the same operator file)
        out.__dict__["catalogue"] = cfg.__dict__["catalogue"]
    return out


def is_operator_config(cfg: object) -> bool:
    return isinstance(cfg, _OperatorConfig)
