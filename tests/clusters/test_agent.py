"""The agent layer on its own (no Ray, no API server): where new members go, the one control loop over a
backend, and the protocol both live backends implement."""

from __future__ import annotations

import inspect
import threading
from pathlib import Path

import numpy as np
import pytest

from clusters.agent.backend import LiveBackend
from clusters.agent.loop import Agent
from clusters.agent.placement import MemberPlacer, final_target
from clusters.agent.reports import ApplyReport, ScaleAction
from clusters.agent.views import job_id_of, live_job_view
from clusters.k8s.backend import KubernetesBackend
from clusters.ray.backend import RayBackend
from clusters.ray.config import LiveConfig
from dl2ray.config import load_config
from dl2ray.jobspec import parse_jobspec
from dl2ray.view import Allocation, ClusterView, JobPlacement, Observation, Tasks

ROOT = Path(__file__).resolve().parents[2]
CATALOGUE = load_config(ROOT / "configs" / "testbed.yaml").catalogue
PS = np.array([1.0, 0.0, 2.0])
WORKER = np.array([1.0, 1.0, 2.0])
DEMAND = {"ps": PS, "worker": WORKER}


def placer(capacity: list[list[float]], usage: list[list[float]], policy: str = "load_balancing"):
    return MemberPlacer(np.array(capacity, float), np.array(usage, float), policy, CATALOGUE)


def test_the_allocations_node_is_taken_when_it_has_room() -> None:
    p = placer([[4, 2, 8]] * 3, [[0, 0, 0]] * 3)
    wish = JobPlacement(worker_nodes=(2, 1), ps_nodes=(0,))
    new = p.place(7, {"ps": 0, "worker": 0}, {"ps": 1, "worker": 2}, wish, DEMAND)
    assert (new.ps, new.worker) == ([0], [2, 1])
    assert p.usage.tolist() == [[1, 0, 2], [1, 1, 2], [1, 1, 2]]  # charged where they went


def test_running_members_keep_their_nodes_and_only_the_new_ones_follow_the_allocation() -> None:
    # the job runs 1 PS + 1 worker; the allocation lists 2 workers: task 0 runs already, task 1 is new
    p = placer([[4, 2, 8]] * 3, [[0, 0, 0]] * 3)
    wish = JobPlacement(worker_nodes=(0, 2), ps_nodes=(1,))
    new = p.place(7, {"ps": 1, "worker": 1}, {"ps": 1, "worker": 2}, wish, DEMAND)
    assert (new.ps, new.worker) == ([], [2])


def test_a_full_wished_node_falls_back_to_the_views_placement_policy() -> None:
    # node 0 (wished) holds members that stay; load balancing picks the least used of the others
    usage = [[3.5, 2, 7], [2, 1, 4], [0, 0, 0]]
    for policy, expected in (("load_balancing", 2), ("packing", 1)):
        p = placer([[4, 2, 8]] * 3, usage, policy)
        new = p.place(7, {"ps": 1, "worker": 1}, {"ps": 1, "worker": 2},
                      JobPlacement(worker_nodes=(0, 0), ps_nodes=(0,)), DEMAND)
        assert new.worker == [expected], policy


def test_what_fits_nowhere_is_cut_and_can_be_given_back() -> None:
    p = placer([[4, 2, 8]], [[2, 1, 4]])  # room for one PS and one worker more, not for two workers
    have, want = {"ps": 1, "worker": 1}, {"ps": 2, "worker": 3}
    new = p.place(7, have, want, None, DEMAND)
    assert (new.ps, new.worker) == ([0], [0]) and final_target(have, want, new) == (2, 2)
    assert p.usage.tolist() == [[4, 2, 8]]
    p.give_back(new, DEMAND)
    assert p.usage.tolist() == [[2, 1, 4]]
    # shrinking is never cut
    assert final_target({"ps": 2, "worker": 3}, {"ps": 1, "worker": 1}, p.place(
        7, {"ps": 2, "worker": 3}, {"ps": 1, "worker": 1}, None, DEMAND)) == (1, 1)


def test_a_live_job_view_counts_slots_run_and_caps_progress() -> None:
    spec = parse_jobspec({"name": "j", "job_type": "resnext-110", "model": "mlp", "epochs": 3,
                          "samples": 64, "global_batch": 8})
    hist = [Observation(0, 1, 1, 1.0, 10.0, float("nan")), Observation(1, 1, 0, 0.0, 10.0, float("nan"))]
    v = live_job_view("j", spec, CATALOGUE, 4, 5.0, [0], [1, 1], hist)
    assert v.job_id == job_id_of("j") and v.slots_run == 1 and v.done_epochs == 3.0
    assert (v.ps, v.workers, v.ps_nodes, v.worker_nodes) == (1, 2, (0,), (1, 1))
    assert not v.worker_demand.flags.writeable


# ---- the one control loop, over a backend that records what it is asked -----------------------------------


class ScriptedBackend:
    """A LiveBackend of one node and one job whose snapshot can be made to fail."""

    def __init__(self, fail_at: set[int] | None = None) -> None:
        self.slot, self.fail_at = 0, fail_at or set()
        self.applied: list[Allocation] = []
        spec = parse_jobspec({"name": "j", "job_type": "resnext-110", "model": "mlp", "epochs": 3,
                              "samples": 64, "global_batch": 8})
        self.job = live_job_view("j", spec, CATALOGUE, 0, 0.0, [], [], [])

    def slot_now(self) -> int:
        return self.slot

    def slot_start(self, slot: int) -> float:
        return 0.0

    def adopt(self) -> int:
        return 1

    def snapshot(self) -> ClusterView:
        if self.slot in self.fail_at:
            raise ConnectionError("the cluster did not answer")
        cap = np.array([[8.0, 2.0, 32.0]])
        return ClusterView(self.slot, 10.0, cap, cap.copy(), (self.job,), CATALOGUE)

    def view_parts(self) -> dict[str, float]:
        return {}

    def apply(self, allocation: Allocation) -> ApplyReport:
        self.applied.append(allocation)
        t = allocation.tasks.get(self.job.job_id, Tasks(0, 0))
        return ApplyReport(self.slot, [ScaleAction("j", (0, 0), (t.ps, t.workers), True, "scaled")])

    def submit(self, spec):
        raise NotImplementedError

    def cancel(self, name: str):
        raise NotImplementedError

    def statuses(self) -> dict:
        return {}

    def close(self) -> None:
        pass


def _config(tmp_path: Path) -> LiveConfig:
    return LiveConfig.model_validate({"live": {"experiment": str(ROOT / "configs" / "testbed.yaml"),
                                               "log_dir": str(tmp_path / "log")}})


def test_every_slot_is_snapshot_decide_apply_and_a_failed_step_never_stops_the_loop(tmp_path: Path) -> None:
    from clusters.agent.report import live_report

    backend = ScriptedBackend(fail_at={1})
    agent = Agent(_config(tmp_path), backend, "drf")
    assert agent.adopted == 1 and agent.spec == "drf"
    rows = []
    for slot in range(3):
        backend.slot = slot
        rows.append(agent.step())
    assert [r["slot"] for r in rows] == [0, 1, 2]
    assert "ConnectionError" in rows[1]["error"] and agent.errors == {"ConnectionError": 1}
    assert len(backend.applied) == 2 and rows[2]["events"].startswith("j:(0, 0)->")
    rep = live_report(tmp_path / "log")
    assert rep["slots"] == 3 and rep["decisions"] == 2 and rep["step_errors"] == 1
    agent.close()


def test_run_steps_once_per_slot_until_stopped(tmp_path: Path) -> None:
    backend = ScriptedBackend()
    agent = Agent(_config(tmp_path), backend, "drf")
    stop = threading.Event()
    agent.run(stop, max_slots=1)  # slot 0 only: the loop does not step a slot twice
    assert agent.slots_done == 1 and len(backend.applied) == 1


# ---- both live backends implement the protocol the agent is typed against -------------------------------


@pytest.mark.parametrize("cls", [RayBackend, KubernetesBackend])
def test_both_backends_implement_every_method_of_the_live_backend_protocol(cls: type) -> None:
    for name, proto in inspect.getmembers(LiveBackend, inspect.isfunction):
        if name.startswith("_"):
            continue
        impl = getattr(cls, name, None)
        assert impl is not None, f"{cls.__name__} lacks {name}"
        want = [p for p in inspect.signature(proto).parameters.values() if p.name != "self"]
        have = inspect.signature(impl).parameters
        for p in want:  # every parameter the agent passes is accepted, by position
            assert p.name in have, f"{cls.__name__}.{name} has no parameter {p.name}"
        extra = [q for n, q in have.items() if n != "self" and n not in {p.name for p in want}]
        assert all(q.default is not inspect.Parameter.empty for q in extra), (cls.__name__, name, extra)
