"""A teacher's allocation as the incremental actions the policy would have taken (pure numpy).

Supervised warm-start imitates a heuristic through the *same* decision loop
as the policy (:func:`dl2ray.policy.decision.run_decision`), so every label
is one ``(state, mask, action)`` step. For each window the teacher's target
counts ``(workers, PS)`` are reached one action at a time:

- the next job is, among those still short of their target, either
  (``order="share"``) the one with the smallest dominant share allocated so
  far (DRF's float64 share; ties: arrival order) — DRF's own filling order —
  or (``order="sequence"``) the first in the teacher's priority order (the
  order of ``Allocation.tasks``, i.e. the order it placed first tasks in),
  job by job — FIFO's and SRTF's filling order;
- it gets a bundle (+1 worker +1 PS) while it is short of both, then single
  workers or single PS for the excess of one over the other;
- when no job is short, the label is **stop** (recorded whenever some other
  action was still allowed, i.e. whenever the policy would have been asked).

Replayed through the placer, the actions reproduce the teacher's counts
when the replay places tasks in the teacher's order; a job whose next task
does not fit in the replay order (the placer then strands GPUs differently
from the teacher) is given up and counted in ``Decomposition.short``.
:func:`decompose` with ``order="auto"`` (the default) labels in share order
and falls back to sequence order for a slot the share order cannot rebuild.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from dl2ray.policy.decision import Decision, run_decision
from dl2ray.policy.encoding import BUNDLE, PS, STOP, WORKER, Encoding, SlotState
from dl2ray.schedulers.base import dominant_share
from dl2ray.view import Allocation, ClusterView, Tasks

Order = Literal["share", "sequence"]


class TeacherChooser:
    """A :class:`~dl2ray.policy.decision.Chooser` that walks towards a fixed allocation."""

    def __init__(self, target: Allocation, enc: Encoding, order: Order = "share") -> None:
        self.target, self.enc, self.order = target, enc, order
        self.short = 0  # tasks of the target the replay could not place
        self._rank = {job_id: r for r, job_id in enumerate(target.tasks)}

    def begin(self, slot: SlotState) -> None:
        zero = Tasks(0, 0)
        self._goal = [self.target.tasks.get(j.job_id, zero) for j in slot.jobs]
        far = len(self._rank)
        self._total = slot.view.total_capacity
        self._per_bundle = [dominant_share(j, 1, 1, self._total) for j in slot.jobs]
        self._priority = [float(self._rank.get(j.job_id, far)) for j in slot.jobs]
        self._given_up: set[int] = set()

    def _action_for(self, slot: SlotState, i: int, mask: np.ndarray) -> int | None:
        """The action that moves row i towards its goal, None if it has none (or none fits)."""
        w, p = slot.counts(i)
        dw, dp = self._goal[i].workers - w, self._goal[i].ps - p
        if dw <= 0 and dp <= 0:
            return None
        for kind, wanted in ((BUNDLE, dw > 0 and dp > 0), (WORKER, dw > 0), (PS, dp > 0)):
            a = self.enc.action(kind, i)
            if wanted and mask[a]:
                return a
        self._given_up.add(i)
        self.short += max(dw, 0) + max(dp, 0)
        return None

    def choose(self, slot: SlotState, mask: np.ndarray) -> int:
        key = self._shares(slot) if self.order == "share" else self._priority
        best: tuple[float, int, int] | None = None
        for i in range(len(slot.jobs)):
            if i in self._given_up:
                continue
            a = self._action_for(slot, i, mask)
            if a is not None and (best is None or (key[i], i) < best[:2]):
                best = (key[i], i, a)
        return self.enc.action(STOP, -1) if best is None else best[2]

    def _shares(self, slot: SlotState) -> list[float]:
        """DRF's own float64 shares, computed as DRF does (bundles × share of one bundle)
        so that ties between types break exactly as in DRF."""
        out = []
        for i, j in enumerate(slot.jobs):
            w, p = slot.counts(i)
            out.append(w * self._per_bundle[i] if w == p else dominant_share(j, w, p, self._total))
        return out

    def applied(self, row: int, delta: np.ndarray) -> None:
        pass


@dataclass
class Decomposition:
    """The replayed decision (its allocation and labelled steps) and the tasks it could not place."""

    decision: Decision
    short: int


def decompose(
    view: ClusterView, target: Allocation, enc: Encoding, record: bool = True,
    order: Order | Literal["auto"] = "auto",
) -> Decomposition:
    """Label one slot: the steps that rebuild ``target`` (see the module docstring)."""
    if order == "auto":
        first = decompose(view, target, enc, record, "share")
        if first.short == 0:
            return first
        second = decompose(view, target, enc, record, "sequence")
        return second if second.short < first.short else first
    chooser = TeacherChooser(target, enc, order)
    decision = run_decision(view, enc, chooser, record=record)
    return Decomposition(decision, chooser.short)
