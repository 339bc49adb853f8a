"""The scaling rules both live backends share (clusters/agent/plan.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from clusters.agent.plan import PAUSED_PS, Changes, bounded, grows
from clusters.agent.reports import ApplyReport
from dl2ray.jobspec import JobSpec

SPEC = JobSpec.model_validate({"name": "j", "job_type": "resnet-50", "epochs": 1,
                               "workers": {"min": 2, "max": 4}, "ps_count": {"min": 1, "max": 2}})


@given(st.integers(0, 20), st.integers(0, 20))
def test_bounded_counts_lie_within_the_specs_bounds_and_keep_what_already_does(ps: int, workers: int) -> None:
    p, w = bounded(ps, workers, SPEC)
    assert 1 <= p <= 2 and 2 <= w <= 4
    assert (p == ps) == (1 <= ps <= 2) and (w == workers) == (2 <= workers <= 4)


def test_a_change_grows_when_it_adds_a_member_and_never_when_it_stops() -> None:
    assert grows((1, 2), (2, 2)) and grows((1, 2), (1, 3)) and grows((0, 0), (1, 1))
    assert grows((2, 1), (1, 2))  # one role up is a member to start, whatever the other does
    assert not grows((2, 2), (1, 2)) and not grows((2, 2), (2, 2))
    assert not grows((2, 2), (0, 0)) and not grows((2, 2), (PAUSED_PS, 0))


def test_both_backends_use_the_shared_rules() -> None:
    """No copy of the rules in either backend: each imports them from clusters.agent.plan."""
    import clusters.k8s.reconciler as k8s
    import clusters.ray.backend as ray_backend
    import clusters.ray.job as ray_job

    assert k8s.bounded is bounded and k8s.Changes is Changes and k8s.PAUSED_PS == PAUSED_PS
    assert ray_job.bounded is bounded and ray_backend.Changes is Changes


def test_a_slots_changes_put_downs_before_ups_and_leave_busy_jobs_alone() -> None:
    report = ApplyReport(3)
    changes: Changes[str] = Changes(report)
    changes.add("a", "a", (1, 2), (1, 4), busy=False)
    changes.add("b", "b", (2, 2), (1, 2), busy=False)
    changes.add("c", "c", (1, 1), (0, 0), busy=False)
    changes.add("d", "d", (1, 1), (2, 2), busy=True)
    assert [(j, a.before, a.target) for j, a in changes.ups] == [("a", (1, 2), (1, 4))]
    assert [j for j, _ in changes.downs] == ["b", "c"]
    assert report.skipped_busy == ["d"] and report.actions == []  # the backend reports what it runs
