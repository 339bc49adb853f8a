"""Schema round trips: ClusterView → request JSON → ClusterView, Allocation → response JSON → Allocation."""

from __future__ import annotations

import numpy as np
import pytest

from dl2ray.policy.shape import SLOWNESS_SLOTS
from dl2ray.schedulers.drf import DRF
from dl2ray.view import Allocation, ClusterView, JobPlacement, JobView, Tasks
from serve.client import ServeScheduler
from serve.convert import ViewError, from_allocation, from_view, to_allocation, to_view
from serve.schemas import DecideRequest, DecideResponse, ViewIn


def _job_fields(j: JobView) -> tuple:
    return (j.job_id, j.job_type, j.type_index, j.arrival_slot, j.slots_run, j.est_epochs, j.done_epochs,
            j.workers, j.ps, j.worker_nodes, j.ps_nodes, tuple(j.worker_demand), tuple(j.ps_demand),
            j.max_workers, j.max_ps, j.history, j.requested_bundles)


def _same_view(a: ClusterView, b: ClusterView) -> None:
    assert (a.slot, a.slot_seconds, a.placement) == (b.slot, b.slot_seconds, b.placement)
    np.testing.assert_array_equal(a.capacity, b.capacity)
    np.testing.assert_array_equal(a.free, b.free)
    assert [_job_fields(j) for j in a.jobs] == [_job_fields(j) for j in b.jobs]


def _through_json(view: ClusterView, history: bool = True) -> ClusterView:
    body = ViewIn.model_validate_json(from_view(view, history).model_dump_json()).model_dump_json()
    return to_view(ViewIn.model_validate_json(body), view.catalogue, "packing", 10_000)


def test_view_round_trip_is_exact(views):
    assert any(j.history and j.worker_nodes for v in views for j in v.jobs)  # the views exercise every field
    for view in views:
        _same_view(_through_json(view), view)


def test_view_with_partly_free_nodes_round_trips(views):
    v = views[-1]
    free = v.capacity.copy()
    free[0] = free[0] / 2
    free[-1, 1] = 0.0
    partial = ClusterView(v.slot, v.slot_seconds, v.capacity, free, v.jobs, v.catalogue, "optimus")
    _same_view(_through_json(partial), partial)


def test_client_body_sends_dl2_only_the_recent_observations_that_trained(views):
    """The DL2 policies read at most the last SLOWNESS_SLOTS trained observations: the body carries those."""
    view = views[-1]
    assert any(len(j.history) > SLOWNESS_SLOTS for j in view.jobs)
    dl2 = DecideRequest.model_validate_json(ServeScheduler("http://h:1").body(view))
    drf = DecideRequest.model_validate_json(ServeScheduler("http://h:1", "drf").body(view))
    assert dl2.scheduler == "dl2"
    for sent, job in zip(dl2.view.jobs, view.jobs, strict=True):
        trained = [o for o in job.history if o.epochs > 0 and o.seconds > 0]
        recent = trained[-SLOWNESS_SLOTS:]
        assert [(o.slot, o.epochs) for o in sent.history] == [(o.slot, o.epochs) for o in recent]
    assert drf.scheduler == "drf"
    assert [len(j.history) for j in drf.view.jobs] == [len(j.history) for j in view.jobs]


def test_allocation_round_trip_keeps_order_and_placement(views):
    alloc = DRF().decide(views[-1])
    assert alloc.placement is not None and len(alloc.tasks) > 1
    resp = DecideResponse(allocation=from_allocation(alloc), scheduler="drf", policy_version="heuristic:drf",
                          decision_ms=1.0)
    back = to_allocation(DecideResponse.model_validate_json(resp.model_dump_json()).allocation)
    assert list(back.tasks.items()) == list(alloc.tasks.items())
    assert back.placement == alloc.placement


def test_allocation_without_placement_round_trips():
    alloc = Allocation({3: Tasks(2, 1), 1: Tasks(0, 1)})
    back = to_allocation(from_allocation(alloc))
    assert list(back.tasks.items()) == list(alloc.tasks.items()) and back.placement is None
    placed = Allocation({3: Tasks(1, 1)}, {3: JobPlacement((0,), (2,))})
    assert to_allocation(from_allocation(placed)).placement == placed.placement


def test_inconsistent_view_names_the_field(views):
    view = views[-1]
    body = from_view(view).model_dump(mode="json")
    job = next(i for i, j in enumerate(body["jobs"]) if j["workers"] > 0)
    body["jobs"][job]["worker_nodes"] = [view.num_nodes] * body["jobs"][job]["workers"]
    with pytest.raises(ViewError) as err:
        to_view(ViewIn.model_validate(body), view.catalogue, "packing", 100)
    assert err.value.loc == ("view", "jobs", job, "worker_nodes", 0)


def test_identical_nodes_travel_as_one_entry_with_a_count(views):
    v = views[-1]
    assert [n.count for n in from_view(v).nodes] == [v.num_nodes]  # the testbed: 13 nodes of one kind
    free = v.capacity.copy()
    free[3] = 0.0
    mixed = ClusterView(v.slot, v.slot_seconds, v.capacity, free, v.jobs, v.catalogue, v.placement)
    assert [n.count for n in from_view(mixed).nodes] == [3, 1, v.num_nodes - 4]
    _same_view(_through_json(mixed), mixed)


def test_a_node_index_counts_every_node_of_a_run(views):
    v = views[-1]
    body = from_view(v).model_dump(mode="json")
    job = next(i for i, j in enumerate(body["jobs"]) if j["workers"] > 0)
    body["jobs"][job]["worker_nodes"] = [v.num_nodes - 1] * body["jobs"][job]["workers"]
    assert to_view(ViewIn.model_validate(body), v.catalogue, "packing", 100).jobs[job].worker_nodes[0] == 12
    body["nodes"] = [body["nodes"][0] | {"count": 60_000}] * 2  # each entry valid, 120,000 nodes in all
    with pytest.raises(ViewError) as err:
        to_view(ViewIn.model_validate(body), v.catalogue, "packing", 100)
    assert err.value.loc == ("view", "nodes")
