"""The one scheduler signature and the registry the CLI builds schedulers from.

Every scheduler is ``decide(view: ClusterView) -> Allocation``; heuristics are
short classes with no knowledge of Ray, Kubernetes or MXNet. Schedulers that
keep state across slots implement ``reset(seed)``; the runner calls it at the
start of every run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from dl2ray.errors import UserError
from dl2ray.schedulers.bundles import bundle_limit, dominant_share, fill_bundles
from dl2ray.view import Allocation, ClusterView

__all__ = ["Scheduler", "bundle_limit", "dominant_share", "fill_bundles", "is_reference", "make_scheduler",
           "register", "scheduler_names"]


@runtime_checkable
class Scheduler(Protocol):
    name: str

    def decide(self, view: ClusterView) -> Allocation: ...


Factory = Callable[[str | None, object], Scheduler]
_REGISTRY: dict[str, Callable[[], Factory]] = {}
_REFERENCES: set[str] = set()
_DEPRECATED: set[str] = set()


def register(name: str, loader: Callable[[], Factory], reference: bool = False,
             deprecated: bool = False) -> None:
    """Add scheduler ``name``. A ``reference`` reads the simulator's truth (it is never deployable) and is
    built with the whole config; every other scheduler gets the operator's config
    (:func:`dl2ray.knowledge.hidden.operator_config`), in which the truth cannot be read. A
    ``deprecated`` name (an old name kept for scripts; its loader warns) still builds but is not listed."""
    _REGISTRY[name] = loader
    if reference:
        _REFERENCES.add(name)
    else:
        _REFERENCES.discard(name)
    if deprecated:
        _DEPRECATED.add(name)


def _reads_truth(key: str) -> bool:
    """A registered reference, or a plugin factory that says it reads the truth (``reads_truth = True``:
    an entry point cannot pass ``register``'s flag, so the factory carries it; loaded only when asked)."""
    if key in _REFERENCES:
        return True
    loader = _REGISTRY.get(key)
    return loader is not None and bool(getattr(loader(), "reads_truth", False))


def is_reference(spec: str) -> bool:
    """Is the scheduler of ``spec`` (``name`` or ``name:arg``) a truth-reading reference?"""
    _load_builtin()
    return _reads_truth(spec.partition(":")[0].strip().lower())


def scheduler_names() -> list[str]:
    """Every registered scheduler but the deprecated names."""
    _load_builtin()
    return sorted(set(_REGISTRY) - _DEPRECATED)


def make_scheduler(spec: str, cfg: object, placement: str | None = None) -> Scheduler:
    """Build a scheduler from ``name`` or ``name:argument`` (e.g. ``dl2:models/x.pt``), deciding under
    ``placement`` (``own``: the policy its paper defines; a policy name: that placer; None: the config's
    ``cluster.placement``, ``own`` without a config) — :mod:`dl2ray.schedulers.placed`; on a config with
    ``tenancy:``, inside the queue layer (:class:`dl2ray.schedulers.queued.Queued`)."""
    from dl2ray.schedulers.placed import OWN, with_placement

    _load_builtin()
    name, _, arg = spec.partition(":")
    key = name.strip().lower()
    loader = _REGISTRY.get(key)
    if loader is None:
        raise UserError(f"unknown scheduler {name!r}; known: {scheduler_names()}")
    cluster = getattr(cfg, "cluster", None)
    choice = placement or str(getattr(cluster, "placement", OWN))
    if not _reads_truth(key) and cfg is not None:
        from dl2ray.config import ExperimentConfig
        from dl2ray.knowledge.hidden import operator_config

        if isinstance(cfg, ExperimentConfig):
            cfg = operator_config(cfg)
    return on_cluster(with_placement(loader()(arg or None, cfg), choice), cfg)


def on_cluster(scheduler: Scheduler, cfg: object) -> Scheduler:
    """``scheduler`` as it decides on ``cfg``'s cluster: inside the queue layer
    (:class:`dl2ray.schedulers.queued.Queued`: quotas, borrowing, reclaim; docs/tenancy.md) when the config
    has ``tenancy:``, else as it is. A scheduler built without :func:`make_scheduler` (a policy being
    trained) goes through this too, so it is judged on the cluster it will run on."""
    tenancy = getattr(cfg, "tenancy", None)
    if tenancy is None:
        return scheduler
    from dl2ray.schedulers.queued import Queued

    return Queued(scheduler, tenancy)


PLUGIN_GROUP = "dl2ray.schedulers"
"""Entry-point group of schedulers from packages above the core: ``name = "package.module:factory"``,
``factory(arg, cfg) -> Scheduler`` (e.g. ``serve:URL``, the Serve endpoint's client). Found in every
process that builds schedulers (``compare``'s spawned workers too), imported only when used."""


def _load_builtin() -> None:
    if _REGISTRY:
        return
    from importlib.metadata import entry_points

    from dl2ray.schedulers import builtin

    builtin.register_builtin(register)
    for ep in entry_points(group=PLUGIN_GROUP):
        if ep.name not in _REGISTRY:  # a plugin never shadows a built-in scheduler
            register(ep.name, ep.load)
