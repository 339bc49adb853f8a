"""The DL2Job conditions and scaling events as pure functions (clusters/k8s/conditions.py)."""

from __future__ import annotations

from clusters.agent.reports import ScaleAction
from clusters.k8s.conditions import TYPES, Seen, job_conditions, scale_event, set_condition

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"


def by_type(conds: list[dict]) -> dict[str, dict]:
    return {c["type"]: c for c in conds}


def seen(**over) -> Seen:
    raw = {"phase": "Pending", "error": None, "created": False, "suspend": False, "plan": (0, 0)}
    raw["epochs"] = 0.0
    raw.update(over)
    return Seen(**raw)


def test_every_job_carries_all_five_conditions_sorted_by_type():
    conds = job_conditions([], seen(), T0)
    assert [c["type"] for c in conds] == list(TYPES)
    c = by_type(conds)
    assert c["Valid"]["status"] == "True" and c["Created"]["reason"] == "WaitingForAllocation"
    assert (c["Running"]["status"], c["Running"]["reason"]) == ("False", "Pending")
    assert c["Suspended"]["status"] == "False" and c["Finished"]["status"] == "False"
    assert all(set(x) == {"type", "status", "reason", "message", "lastTransitionTime"} for x in conds)


def test_transition_time_moves_only_when_the_status_flips():
    conds = job_conditions([], seen(phase="Running", created=True, plan=(1, 1)), T0)
    assert by_type(conds)["Running"]["message"] == "1 PS and 1 workers in the coordinator's plan"
    # scaled: the message changes, the status does not — the transition time stays
    conds = job_conditions(conds, seen(phase="Running", created=True, plan=(1, 3)), T1)
    run = by_type(conds)["Running"]
    assert run["status"] == "True" and "3 workers" in run["message"] and run["lastTransitionTime"] == T0
    # paused: Running flips to False at T1; Valid and Created keep T0
    conds = job_conditions(conds, seen(phase="Running", created=True, plan=(1, 0)), T1)
    c = by_type(conds)
    assert (c["Running"]["status"], c["Running"]["reason"], c["Running"]["lastTransitionTime"]) == (
        "False", "Paused", T1)
    assert c["Valid"]["lastTransitionTime"] == T0 and c["Created"]["lastTransitionTime"] == T0


def test_unchanged_condition_is_kept_as_it_was():
    conds = set_condition([], "Valid", "True", "Validated", "ok", T0)
    assert set_condition(conds, "Valid", "True", "Validated", "ok", T1) == conds


def test_invalid_suspended_and_finished_jobs():
    c = by_type(job_conditions([], seen(phase="Invalid", error="spec.workers: min (3) is above max (2)"), T0))
    assert (c["Valid"]["status"], c["Valid"]["reason"]) == ("False", "InvalidSpec")
    assert c["Valid"]["message"].startswith("spec.workers")
    assert c["Created"]["reason"] == "InvalidSpec" and c["Running"]["reason"] == "InvalidSpec"

    c = by_type(job_conditions([], seen(phase="Suspended", created=True, suspend=True, plan=(1, 0)), T0))
    assert c["Suspended"]["status"] == "True" and c["Running"]["reason"] == "Suspended"

    c = by_type(job_conditions([], seen(phase="Succeeded", created=True, epochs=12.0), T0))
    assert (c["Finished"]["status"], c["Finished"]["reason"]) == ("True", "Succeeded")
    assert c["Finished"]["message"] == "12 epochs trained" and c["Running"]["reason"] == "Succeeded"
    c = by_type(job_conditions([], seen(phase="Failed", created=True), T0))
    assert (c["Finished"]["status"], c["Finished"]["reason"]) == ("True", "Failed")


def test_scale_events():
    def ev(before, target, ok=True, reason="scaled", suspend=False):
        return scale_event(ScaleAction("j", before, target, ok, reason), suspend)

    assert ev((0, 0), (1, 2), reason="started") == ("Normal", "Started", "started with 1 PS and 2 workers")
    assert ev((1, 1), (2, 3)) == ("Normal", "Scaled", "PS 1->2, workers 1->3 (scaled)")
    assert ev((1, 2), (1, 0))[:2] == ("Normal", "Paused")
    assert ev((1, 2), (1, 0), suspend=True)[:2] == ("Normal", "Suspended")
    assert ev((1, 0), (1, 1))[:2] == ("Normal", "Resumed")
    kind, reason, message = ev((1, 1), (1, 2), ok=False, reason="TimeoutError: pods not Ready")
    assert (kind, reason) == ("Warning", "ScaleFailed") and message.endswith("TimeoutError: pods not Ready")
