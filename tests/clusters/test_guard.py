"""Guardrail and shadow mode: the wrapper between decide and apply, on real simulator views."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from support import CONFIGS

from clusters.agent.guard import DecisionLog, GuardedScheduler, violation
from clusters.agent.report import allocation_difference, live_report
from dl2ray.config import load_config
from dl2ray.errors import Refused
from dl2ray.schedulers.base import make_scheduler
from dl2ray.view import Allocation, ClusterView, JobPlacement, Tasks
from dl2ray.world import build_simulator


@pytest.fixture(scope="module")
def view() -> ClusterView:
    sim = build_simulator(load_config(CONFIGS / "testbed.yaml"))
    v = sim.reset(0)
    while len(v.jobs) < 3:
        v = sim.step(make_scheduler("drf", None).decide(v)).view
    return v


class Raising:
    name = "raising"

    def decide(self, view):
        raise RuntimeError("policy bug")


class Slow:
    name = "slow"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def decide(self, view):
        time.sleep(self.seconds)
        return Allocation.empty()


class Fixed:
    def __init__(self, alloc: Allocation, name: str = "fixed") -> None:
        self.alloc, self.name = alloc, name

    def decide(self, view):
        return self.alloc


def _guard(policy, tmp_path: Path, **kw) -> GuardedScheduler:
    return GuardedScheduler(
        policy, make_scheduler("drf", None), decisions=DecisionLog(tmp_path / "decisions.parquet"), **kw
    )


def test_a_raising_policy_falls_back_to_drf(view, tmp_path) -> None:
    g = _guard(Raising(), tmp_path)
    alloc = g.decide(view)
    assert alloc.tasks == make_scheduler("drf", None).decide(view).tasks
    assert g.fallbacks == {"error": 1}
    row = g.decisions.rows[-1]
    assert row["applied"] == "fallback" and "policy bug" in row["reason"] and row["policy_alloc"] == "null"


class Overloaded:
    """A remote policy that refuses every other view, as an overloaded endpoint does (serve:URL)."""

    name = "overloaded"

    def __init__(self) -> None:
        self.asked = 0

    def decide_or_refuse(self, view):
        self.asked += 1
        if self.asked % 2:
            raise Refused("endpoint answered 503", 1.0)
        return Allocation.empty()

    def decide(self, view):  # its own local fallback, which the guardrail must not use
        raise AssertionError("the guardrail asks decide_or_refuse")


def test_a_refusal_is_decided_by_the_fallback_and_counted_not_an_error(view, tmp_path) -> None:
    g = _guard(Overloaded(), tmp_path)
    drf = make_scheduler("drf", None).decide(view)
    assert g.decide(view).tasks == drf.tasks  # refused: this slot is the fallback's
    assert g.decide(view).tasks == {}  # answered: the policy's (empty) allocation is applied
    assert g.fallbacks == {"refused": 1}
    rows = g.decisions.rows
    assert [r["applied"] for r in rows] == ["fallback", "policy"] and "503" in rows[0]["reason"]
    g.close()


def test_a_late_policy_falls_back_and_is_not_asked_again_while_running(view, tmp_path) -> None:
    g = _guard(Slow(1.0), tmp_path, time_budget_s=0.05)
    g.decide(view)
    g.decide(view)  # the first call is still sleeping: no second one is started
    assert g.fallbacks == {"timeout": 2}
    assert "still running" in g.decisions.rows[-1]["reason"]
    g.close()


def test_an_invalid_allocation_is_replaced(view, tmp_path) -> None:
    job = view.jobs[0]
    over_caps = Allocation({job.job_id: Tasks(job.max_workers + 1, 1)})
    g = _guard(Fixed(over_caps), tmp_path)
    assert g.decide(view).tasks == make_scheduler("drf", None).decide(view).tasks
    assert g.fallbacks == {"invalid": 1}
    assert "exceed its caps" in g.decisions.rows[-1]["reason"]
    unknown = Allocation({123456789: Tasks(1, 1)})
    assert "not in the view" in violation(view, unknown)


def test_capacity_is_checked_per_node_with_placement(view) -> None:
    job = view.jobs[0]
    n = int(np.ceil(view.free[0, 0] / job.worker_demand[0])) + 1  # more workers than node 0 has cores for
    n = min(n, job.max_workers)
    alloc = Allocation({job.job_id: Tasks(n, 1)}, {job.job_id: JobPlacement((0,) * n, (0,))})
    fits = (n * job.worker_demand + job.ps_demand <= view.free[0] + 1e-9).all()
    assert (violation(view, alloc) is None) == bool(fits)
    bad_node = Allocation({job.job_id: Tasks(1, 1)}, {job.job_id: JobPlacement((view.num_nodes,), (0,))})
    assert "no node" in violation(view, bad_node)
    mismatch = Allocation({job.job_id: Tasks(2, 1)}, {job.job_id: JobPlacement((0,), (0,))})
    assert "does not match" in violation(view, mismatch)


def test_shadow_applies_the_fallback_and_logs_both(view, tmp_path) -> None:
    job = view.jobs[0]
    policy = Fixed(Allocation({job.job_id: Tasks(1, 1)}), "one-bundle")
    g = _guard(policy, tmp_path, shadow=True)
    applied = g.decide(view)
    drf = make_scheduler("drf", None).decide(view)
    assert applied.tasks == drf.tasks and not g.fallbacks
    row = g.decisions.rows[-1]
    assert row["applied"] == "fallback" and row["reason"] == "shadow"
    assert json.loads(row["policy_alloc"]) == {str(job.job_id): [1, 1]}
    g.decisions.write()
    rep = live_report(tmp_path)
    expected = allocation_difference(json.loads(row["policy_alloc"]), json.loads(row["fallback_alloc"]))
    assert rep["compared_slots"] == 1 and rep["mean_task_difference"] == expected
    assert rep["differing_slots"] == int(expected > 0) and rep["applied_fallback"] == 1


def test_a_valid_policy_is_applied_unchanged(view, tmp_path) -> None:
    alloc = make_scheduler("srtf", None).decide(view)
    g = _guard(Fixed(alloc), tmp_path)
    assert g.decide(view) is alloc and not g.fallbacks


def test_allocation_difference_by_hand() -> None:
    assert allocation_difference({"1": [1, 2], "2": [1, 1]}, {"1": [2, 2], "3": [1, 0]}) == 1 + 2 + 1
