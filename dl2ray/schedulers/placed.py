"""Placement belongs to the scheduler: each one decides under the placer its paper defines.

Every scheduler decides through ``view.placer()``, which places each task it
adds by the view's placement policy (:mod:`dl2ray.cluster`). :class:`Placed`
hands a scheduler views that name *its* policy:

- ``own`` — the policy the scheduler carries as its ``placement`` attribute
  (docs/schedulers.md, "Placement", gives each one's source): Optimus
  ``optimus``, Tetris ``tetris`` (its alignment score), FIFO, SRTF and DRF
  ``load_balancing`` (the DL2 paper's cluster default, under which it ran
  them), the planner and a DL2 checkpoint the policy chosen on validation;
  a scheduler that carries none gets :data:`FALLBACK`;
- a policy name — that placer, whatever the scheduler's own (``compare
  --placement NAME``, or ``cluster.placement: NAME`` in a config).

The simulator, the live backends and the Serve endpoint build their views with
the cluster's default policy; :func:`dl2ray.schedulers.base.make_scheduler`
wraps every scheduler it builds, so all of them meet their own placer.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from dl2ray.cluster import PLACEMENTS
from dl2ray.errors import UserError
from dl2ray.view import Allocation, ClusterView

OWN = "own"
FALLBACK = "load_balancing"
"""The placement of a scheduler that names none (the DL2 paper's cluster default)."""


def own_placement(scheduler: object) -> str:
    """The placement policy ``scheduler`` carries (its ``placement`` attribute), else :data:`FALLBACK`."""
    return str(getattr(scheduler, "placement", None) or FALLBACK)


def resolve_placement(scheduler: object, choice: str) -> str:
    """``choice`` (``own`` or a policy name) as the policy ``scheduler`` runs under; UserError otherwise."""
    if choice == OWN:
        return own_placement(scheduler)
    if choice not in PLACEMENTS:
        raise UserError(f"--placement: unknown placement {choice!r}; known: own, {', '.join(PLACEMENTS)}")
    return choice


class Placed:
    """``inner`` deciding on views whose ``placement`` is :attr:`placement`; everything else is ``inner``'s.

    ``placement`` is a policy of :data:`dl2ray.cluster.PLACEMENTS`; attributes
    the wrapper does not define (``name``, ``reference``, ``reset``, a DL2
    scheduler's ``policy``) are read from ``inner``.
    """

    def __init__(self, inner: Any, placement: str) -> None:
        if placement not in PLACEMENTS:
            raise UserError(f"unknown placement {placement!r}; known: {', '.join(PLACEMENTS)}")
        self.inner = inner
        self.placement = placement

    def decide(self, view: ClusterView) -> Allocation:
        if view.placement != self.placement:
            view = replace(view, placement=self.placement)
        return self.inner.decide(view)

    def __getattr__(self, attr: str) -> Any:
        # only called for attributes not found on the wrapper itself
        if attr == "inner":
            raise AttributeError(attr)
        return getattr(self.inner, attr)

    @property
    def placement_label(self) -> str:
        """The placement a table names for this scheduler: the inner scheduler's own label when it places
        by its own decisions (a DL2 policy with layouts), else :attr:`placement`."""
        label = getattr(self.inner, "placement_label", None)
        return self.placement if label is None or not label.startswith("policy(") else str(label)

    def __repr__(self) -> str:
        return f"Placed({self.inner!r}, {self.placement!r})"


def with_placement(scheduler: Any, choice: str) -> Placed:
    """``scheduler`` under ``choice`` (``own`` or a policy name); a :class:`Placed` is re-wrapped, not
    nested (its own placement is the one its inner scheduler carries)."""
    inner = scheduler.inner if isinstance(scheduler, Placed) else scheduler
    return Placed(inner, resolve_placement(inner, choice))
