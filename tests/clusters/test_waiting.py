"""Where a waiting live job is in the queue and why it waits (clusters.agent.waiting), from hand-built
decisions; and the control loop keeps its last decision for it. No Ray."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from clusters.agent import waiting as w
from clusters.agent.loop import Agent
from clusters.agent.reports import ApplyReport, ScaleAction
from clusters.agent.views import job_id_of, live_job_view
from clusters.ray.config import LiveConfig
from dl2ray.config import load_config
from dl2ray.jobspec import parse_jobspec
from dl2ray.view import Allocation, ClusterView, Tasks

ROOT = Path(__file__).resolve().parents[2]
CATALOGUE = load_config(ROOT / "configs" / "testbed.yaml").catalogue


def spec(name: str, cpu: float = 1.0, workers_min: int = 1) -> dict[str, Any]:
    return parse_jobspec({"name": name, "job_type": "resnext-110", "model": "mlp", "epochs": 3,
                          "samples": 64, "global_batch": 8, "worker": {"cpu": cpu, "gpu": 0, "mem": 1},
                          "ps": {"cpu": 0.5, "gpu": 0, "mem": 1},
                          "workers": {"min": workers_min, "max": 4}}).model_dump(mode="json")


def status(name: str, state: str, t: float, workers: int = 0, busy: bool = False,
           **kw: Any) -> dict[str, Any]:
    return {"name": name, "job_id": job_id_of(name), "state": state, "submitted_at": t, "workers": workers,
            "busy": busy, "spec": spec(name, **kw)}


def decision(statuses: list[dict[str, Any]], free: list[list[float]], tasks: dict[str, Tasks],
             actions: list[ScaleAction] = (), busy: list[str] = (), slot: int = 7) -> w.LastDecision:
    """The view holds every job of ``statuses`` (not finished); ``free`` per node (cpu, gpu, mem GB)."""
    from dl2ray.jobspec import JobSpec

    views = tuple(live_job_view(s["name"], JobSpec.model_validate(s["spec"]), CATALOGUE, 0, 0.0, [], [], [])
                  for s in statuses)
    free_a = np.array(free, float)
    view = ClusterView(slot, 5.0, np.full_like(free_a, 4.0), free_a, views, CATALOGUE)
    alloc = Allocation({job_id_of(n): t for n, t in tasks.items()})
    return w.LastDecision(view, alloc, ApplyReport(slot, list(actions), list(busy)))


def test_waiting_jobs_are_numbered_in_submission_order_and_others_have_no_place() -> None:
    jobs = [status("c", "pending", 3.0), status("a", "running", 1.0, workers=2), status("b", "paused", 2.0),
            status("d", "finished", 0.5)]
    last = decision(jobs[:3], [[4, 0, 8]], {"a": Tasks(2, 1)})
    q = w.queue(jobs, last)
    assert set(q) == {"b", "c"}  # running with workers and finished jobs do not wait
    assert (q["b"]["position"], q["c"]["position"]) == (1, 2)
    assert q["b"]["waiting"] == q["c"]["waiting"] == 2 and q["b"]["slot"] == 7
    assert q["b"]["reason"] == w.PAUSED  # the scheduler gave the paused job nothing
    assert q["c"]["reason"] == w.GIVEN_ZERO  # 1 PS + 1 worker would have fit on the node
    assert all(r["reason"] in w.REASONS for r in q.values())


def test_a_job_submitted_after_the_last_decision_waits_for_its_first_slot() -> None:
    old, new = status("a", "pending", 1.0), status("b", "pending", 2.0)
    assert w.queue([old, new], None)["a"]["reason"] == w.FIRST_SLOT  # no decision yet at all
    q = w.queue([old, new], decision([old], [[4, 0, 8]], {}))
    assert q["b"]["reason"] == w.FIRST_SLOT and q["a"]["reason"] == w.GIVEN_ZERO


@pytest.mark.parametrize(("free", "expected"), [
    ([[0.25, 0, 8], [0.4, 0, 8]], w.NO_RESOURCES),  # no node holds one 0.5-CPU PS
    ([[0.5, 0, 1], [0.25, 0, 8]], w.NO_RESOURCES),  # a PS fits, a 1-CPU worker nowhere
    ([[1.0, 0, 8], [0.5, 0, 8]], w.MIN_DOES_NOT_FIT),  # one PS and one worker fit, but min is 2 workers
    ([[1.0, 0, 8], [1.5, 0, 8]], w.GIVEN_ZERO),  # PS + worker on node 1, the second worker on node 0
])
def test_a_job_given_nothing_is_told_whether_the_room_was_there(free: list[list[float]],
                                                                expected: str) -> None:
    job = status("a", "pending", 1.0, workers_min=2)
    assert w.queue([job], decision([job], free, {}))["a"]["reason"] == expected


def test_a_job_given_tasks_is_starting_refused_or_did_not_fit() -> None:
    job = status("a", "pending", 1.0)
    tasks = {"a": Tasks(2, 1)}
    starting = ScaleAction("a", (0, 0), (1, 2), None, "in progress")
    refused = ScaleAction("a", (0, 0), (1, 2), False, "ActorDiedError")
    assert w.queue([job], decision([job], [[4, 0, 8]], tasks, [starting]))["a"]["reason"] == w.STARTING
    assert w.queue([job], decision([job], [[4, 0, 8]], tasks, busy=["a"]))["a"]["reason"] == w.STARTING
    q = w.queue([job], decision([job], [[4, 0, 8]], tasks, [refused]))["a"]
    assert q["reason"] == w.REFUSED and "ActorDiedError" in q["detail"]
    q = w.queue([job], decision([job], [[0.1, 0, 8]], tasks))["a"]  # given, but placement found no room
    assert q["reason"] == w.MIN_DOES_NOT_FIT and "no room" in q["detail"]
    up = status("a", "running", 1.0, workers=0)  # running, its first members not registered yet
    assert w.queue([up], decision([up], [[4, 0, 8]], tasks))["a"]["reason"] == w.STARTING


def test_first_fit_never_splits_a_task_across_nodes() -> None:
    free = np.array([[0.6, 0, 1], [0.6, 0, 1]])
    assert not w.fits(free, [np.array([1.0, 0, 0.5])])  # 1.2 CPU in total, but 0.6 per node
    assert w.fits(free, [np.array([0.5, 0, 0.5])] * 2)
    assert not w.fits(free, [np.array([0.5, 0, 0.5])] * 3)


def test_the_control_loop_keeps_its_last_decision(tmp_path: Path) -> None:
    from test_agent import ScriptedBackend

    cfg = LiveConfig.model_validate({"live": {"experiment": str(ROOT / "configs" / "testbed.yaml"),
                                              "log_dir": str(tmp_path / "log")}})
    backend = ScriptedBackend(fail_at={1})
    agent = Agent(cfg, backend, "drf")
    assert agent.last_decision is None
    agent.step()
    first = agent.last_decision
    assert first is not None and first.view.slot == 0 and first.allocation is backend.applied[0]
    assert first.report.actions[0].job == "j"
    backend.slot = 1
    agent.step()  # a failed step leaves the decision that was applied last
    assert agent.last_decision is first
    agent.close()


def test_the_room_left_is_the_views_free_less_every_allocated_task_on_its_node() -> None:
    from dl2ray.view import JobPlacement

    a, b = status("a", "running", 1.0, workers=1), status("b", "pending", 2.0)
    last = decision([a, b], [[2, 0, 8], [2, 0, 8]], {"a": Tasks(1, 1)})
    assert w.room_after(last.view, last.allocation).tolist() == [[0.5, 0, 6], [2, 0, 8]]  # first fit
    wished = w.LastDecision(last.view, Allocation({job_id_of("a"): Tasks(1, 1)}, {
        job_id_of("a"): JobPlacement(worker_nodes=(1,), ps_nodes=(0,))}), last.report)
    assert w.room_after(wished.view, wished.allocation).tolist() == [[1.5, 0, 7], [1, 0, 7]]
    assert w.queue([a, b], wished)["b"]["reason"] == w.GIVEN_ZERO  # 1 PS + 1 worker still fit on node 0


@pytest.mark.parametrize(("b_worker_cpu", "expected"), [(1.0, w.NO_RESOURCES), (0.5, w.MIN_DOES_NOT_FIT)])
def test_a_running_job_that_keeps_the_room_makes_the_next_one_wait_for_it(b_worker_cpu: float,
                                                                          expected: str) -> None:
    # node: 2 CPUs; a keeps 1 PS (0.5) + 1 worker (1.0): 0.5 CPU left, b's PS alone (0.5) would fit
    a, b = status("a", "running", 1.0, workers=1), status("b", "pending", 2.0, cpu=b_worker_cpu)
    q = w.queue([a, b], decision([a, b], [[2, 0, 8]], {"a": Tasks(1, 1)}))
    assert set(q) == {"b"} and q["b"]["reason"] == expected and "cpu 0.5" in q["b"]["detail"]


def test_the_agents_brief_of_a_job_from_the_last_snapshot_is_what_the_queue_reads() -> None:
    from clusters.ray.agent import _brief
    from clusters.ray.backend import Member, RayJob
    from dl2ray.jobspec import JobSpec

    running = RayJob("a", "running", JobSpec.model_validate(spec("a")), 1.0, 0.5,
                     [Member("ps", "n1", "member"), Member("worker", "n1", "member")], (), False)
    pending = RayJob("b", "pending", JobSpec.model_validate(spec("b")), 2.0, 0.0, [], (), True)
    briefs = [_brief(running), _brief(pending)]
    assert briefs[0]["workers"] == 1 and briefs[1]["busy"] and briefs[1]["job_id"] == job_id_of("b")
    q = w.queue(briefs, decision(briefs, [[4, 0, 8]], {"a": Tasks(1, 1)}))
    assert set(q) == {"b"} and q["b"]["reason"] == w.STARTING and q["b"]["position"] == 1
