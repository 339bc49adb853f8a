"""A DL2Job's ``status.conditions`` and the Events the agent reports, as pure functions of what it read.

The conditions follow the Kubernetes API conventions (``type``, ``status``
True/False, a CamelCase ``reason``, a human ``message``, ``lastTransitionTime``
moved only when ``status`` flips), the way the Kubeflow training operator
(Created, Running, Suspended, Succeeded/Failed) and Kueue (Finished) keep them.
Every DL2Job carries all five, sorted by type:

=========== ==================================================================
type        True when
=========== ==================================================================
Valid       the spec passed validation (False: ``InvalidSpec``, the message
            names the field)
Created     the job's coordinator pod exists (False until its first allocation)
Running     the coordinator's plan has at least one worker (False: Pending,
            Starting, Paused, Suspended, Succeeded, Failed, InvalidSpec)
Suspended   ``spec.suspend`` is true
Finished    the coordinator pod ended (reason ``Succeeded`` or ``Failed``)
=========== ==================================================================

:func:`scale_event` says which Event a scaling action gets (``Started``,
``Scaled``, ``Paused``, ``Suspended``, ``Resumed``; ``ScaleFailed`` as a
Warning).
"""

from __future__ import annotations

from dataclasses import dataclass

from clusters.agent.reports import ScaleAction

TYPES = ("Created", "Finished", "Running", "Suspended", "Valid")


@dataclass(frozen=True)
class Seen:
    """What the conditions are computed from. ``plan``: (ps, workers) in the coordinator's plan;
    ``phase``: the DL2Job's phase (Pending, Running, Suspended, Succeeded, Failed, Invalid)."""

    phase: str
    error: str | None
    created: bool
    suspend: bool
    plan: tuple[int, int]
    epochs: float


def set_condition(
    conds: list[dict], type_: str, status: str, reason: str, message: str, now: str
) -> list[dict]:
    """``conds`` with condition ``type_`` set; its ``lastTransitionTime`` (``now``, RFC 3339) moves only
    when its status changes, and an unchanged condition is kept as it was."""
    old = next((c for c in conds if c.get("type") == type_), None)
    rest = [c for c in conds if c.get("type") != type_]
    if old and (old.get("status"), old.get("reason"), old.get("message")) == (status, reason, message):
        return sorted([*rest, old], key=lambda c: c["type"])
    when = old["lastTransitionTime"] if old and old.get("status") == status else now
    new = {"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": when}
    return sorted([*rest, new], key=lambda c: c["type"])


def _running(seen: Seen) -> tuple[str, str, str]:
    ps, workers = seen.plan
    if seen.error is not None:
        return "False", "InvalidSpec", "the spec is invalid (condition Valid)"
    if seen.phase in ("Succeeded", "Failed"):
        return "False", seen.phase, "the job has finished"
    if seen.suspend:
        return "False", "Suspended", "spec.suspend is true: no worker runs (one PS keeps the parameters)"
    if not seen.created:
        return "False", "Pending", "waiting for the scheduler to allocate PS and workers"
    if workers > 0:
        return "True", "Training", f"{ps} PS and {workers} workers in the coordinator's plan"
    if ps == 0:
        return "False", "Starting", "waiting for the coordinator's first plan to run"
    return "False", "Paused", "allocated no worker: one PS keeps the parameters"


def job_conditions(conds: list[dict], seen: Seen, now: str) -> list[dict]:
    """All five conditions (module docstring) from what was ``seen``; ``now``: RFC 3339."""
    if seen.error is None:
        conds = set_condition(conds, "Valid", "True", "Validated", "the spec is valid", now)
    else:
        conds = set_condition(conds, "Valid", "False", "InvalidSpec", seen.error, now)
    if seen.created:
        created = ("True", "CoordinatorCreated", "the coordinator pod and its Service exist")
    elif seen.error is not None:
        created = ("False", "InvalidSpec", "an invalid job is never started")
    else:
        created = ("False", "WaitingForAllocation", "no PS or worker allocated yet")
    conds = set_condition(conds, "Created", *created, now)
    conds = set_condition(conds, "Running", *_running(seen), now)
    conds = set_condition(
        conds,
        "Suspended",
        "True" if seen.suspend else "False",
        "Suspended" if seen.suspend else "NotSuspended",
        "spec.suspend is " + str(seen.suspend).lower(),
        now,
    )
    if seen.phase in ("Succeeded", "Failed"):
        finished = ("True", seen.phase, f"{seen.epochs:g} epochs trained")
    else:
        finished = ("False", "NotFinished", "the job has not ended")
    return set_condition(conds, "Finished", *finished, now)


def scale_event(action: ScaleAction, suspend: bool) -> tuple[str, str, str]:
    """(type, reason, message) of the Event for one job's scaling action in a slot."""
    (b_ps, b_w), (ps, w) = action.before, action.target
    change = f"PS {b_ps}->{ps}, workers {b_w}->{w}"
    if not action.ok:
        return "Warning", "ScaleFailed", f"{change}: {action.reason}"
    if action.reason == "started":
        return "Normal", "Started", f"started with {ps} PS and {w} workers"
    if w == 0:
        if suspend:
            return "Normal", "Suspended", f"spec.suspend: {change}; the PS keep the parameters"
        return "Normal", "Paused", f"allocated nothing: {change}; the PS keep the parameters"
    if b_w == 0:
        return "Normal", "Resumed", f"{change} ({action.reason})"
    return "Normal", "Scaled", f"{change} ({action.reason})"
