"""The gRPC ingress without Ray: decide.proto's modules up to date, proto ↔ pydantic round trips, and the
service's Decide method behind a real gRPC server on a free loopback port, used by serve:grpc://."""

from __future__ import annotations

import asyncio
from concurrent import futures

import grpc
import pytest
from serve_support import SHIPPED, TESTBED, free_port

from dl2ray.errors import Refused
from dl2ray.schedulers.base import make_scheduler
from dl2ray.schedulers.dl2 import DL2Scheduler
from serve.app import DecisionService
from serve.client import ServeError, ServeScheduler, serve_scheduler
from serve.grpc.messages import request_from_proto, request_to_proto, response_from_proto, response_to_proto
from serve.proto import HERE, decide_pb2, decide_pb2_grpc, generate


def test_generated_modules_match_the_proto(tmp_path):
    for path in generate(tmp_path):
        assert path.read_text() == (HERE / path.name).read_text(), f"run python -m serve.proto ({path.name})"


def test_request_round_trips_through_the_proto(views):
    for scheduler in ("dl2", "srtf"):  # dl2: last observation only; heuristics: every observation
        for view in views:
            req = ServeScheduler("http://unused", scheduler).request(view)
            wire = request_to_proto(req).SerializeToString()
            assert request_from_proto(decide_pb2.DecideRequest.FromString(wire)) == req


def test_unset_optionals_take_the_schema_defaults():
    msg = decide_pb2.DecideRequest()
    msg.view.slot_seconds = 60.0
    node = msg.view.nodes.add()
    node.capacity.cpu = 4.0
    msg.view.jobs.add(job_id=1, job_type="resnet-50", est_epochs=5.0)
    req = request_from_proto(msg)
    assert req.scheduler == "dl2" and req.view.placement is None
    assert req.view.nodes[0].free is None and req.view.nodes[0].count == 1
    job = req.view.jobs[0]
    assert job.max_workers is None and job.worker_demand is None and job.requested_bundles is None


def test_response_round_trip_keeps_unplaced_jobs_unplaced(endpoint, views):
    resp = endpoint.service.decide_now(ServeScheduler("http://unused").request(views[-1]))
    assert response_from_proto(decide_pb2.DecideResponse.FromString(
        response_to_proto(resp).SerializeToString())) == resp
    bare = [a.model_copy(update={"worker_nodes": None, "ps_nodes": None}) for a in resp.allocation]
    unplaced = resp.model_copy(update={"allocation": bare})
    assert response_from_proto(response_to_proto(unplaced)) == unplaced


class Servicer(decide_pb2_grpc.DeciderServicer):
    """DecisionService.Decide behind a plain gRPC server, as Serve calls it (the call's context)."""

    def __init__(self, service: DecisionService) -> None:
        self.service = service

    def Decide(self, request, context):  # the gRPC method's name
        return asyncio.run(self.service.Decide(request, context))


@pytest.fixture(scope="module")
def grpc_endpoint():
    service = DecisionService({"config": str(TESTBED), "checkpoint": str(SHIPPED), "reload_every_s": 0})
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    decide_pb2_grpc.add_DeciderServicer_to_server(Servicer(service), server)
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    yield f"grpc://127.0.0.1:{port}", service
    server.stop(grace=None)
    service.close()


def test_served_over_grpc_equals_in_process(grpc_endpoint, views, testbed):
    url, service = grpc_endpoint
    client = serve_scheduler(url, testbed)
    local = DL2Scheduler(str(SHIPPED), testbed)
    for view in views:
        served, mine = client.decide(view), local.decide(view)
        assert list(served.tasks.items()) == list(mine.tasks.items()) and served.placement == mine.placement
    assert client.last_version == service.store.current.version and client.refusals == 0
    drf = ServeScheduler(f"{url}", "drf")
    assert drf.decide(views[-1]).tasks == make_scheduler("drf", testbed).decide(views[-1]).tasks


def test_bad_requests_are_invalid_argument_naming_the_field(grpc_endpoint, views):
    url, _ = grpc_endpoint
    stub = decide_pb2_grpc.DeciderStub(grpc.insecure_channel(url.removeprefix("grpc://")))
    msg = request_to_proto(ServeScheduler("http://unused").request(views[-1]))
    msg.view.jobs[0].job_type = "resnet-51"  # consistent with the schema, unknown to the catalogue
    with pytest.raises(grpc.RpcError) as err:
        stub.Decide(msg)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "view.jobs.0.job_type" in err.value.details()
    msg.view.jobs[0].job_type = "resnet-50"
    msg.view.jobs[0].workers = -1  # breaks the schema (ge=0)
    with pytest.raises(grpc.RpcError) as err:
        stub.Decide(msg)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "view.jobs.0.workers" in err.value.details()
    with pytest.raises(ServeError, match="INVALID_ARGUMENT"):
        ServeScheduler(url, "no-such-heuristic").decide(views[-1])


def test_overload_is_resource_exhausted_and_the_client_decides_locally(grpc_endpoint, views, testbed):
    url, service = grpc_endpoint
    client = serve_scheduler(url, testbed)
    a = service.admission
    saved = a.held, a.service_s
    a.held, a.service_s = 10, 0.010  # ten requests ahead, 10 ms each: past the 25 ms bound
    try:
        with pytest.raises(Refused):
            serve_scheduler(f"{url}?fallback=none", testbed).decide_or_refuse(views[-1])
        alloc = client.decide(views[-1])
    finally:
        a.held, a.service_s = saved
    assert alloc.tasks == make_scheduler("drf", testbed).decide(views[-1]).tasks
    assert client.refusals == 1 and client.last_version is None and a.refused_arrival >= 2
