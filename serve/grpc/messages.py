"""The gRPC messages (``serve/proto/decide.proto``) ↔ the pydantic messages of :mod:`serve.schemas`.

The server turns a ``decide_pb2.DecideRequest`` into the same plain document a
JSON body parses to and validates it with :class:`~serve.schemas.DecideRequest`
(:func:`request_from_proto`), so a gRPC request passes exactly the checks an
HTTP request does, and a :class:`pydantic.ValidationError` names the same
field path. Proto3 ``optional`` fields that are not set are left out of the
document, so they take the schema's defaults. The client goes the other way
(:func:`request_to_proto`, :func:`response_from_proto`).
"""

from __future__ import annotations

from typing import Any

from serve.proto import decide_pb2 as pb
from serve.schemas import DecideRequest, DecideResponse, JobAllocation


def _resources(r: pb.Resources) -> dict[str, float]:
    return {"cpu": r.cpu, "gpu": r.gpu, "mem": r.mem}


def _node(n: pb.NodeState) -> dict[str, Any]:
    d: dict[str, Any] = {"capacity": _resources(n.capacity)}
    if n.HasField("free"):
        d["free"] = _resources(n.free)
    if n.HasField("count"):
        d["count"] = n.count
    return d


_JOB_OPTIONAL = ("max_workers", "max_ps", "requested_bundles")


def _job(j: pb.JobState) -> dict[str, Any]:
    d: dict[str, Any] = {
        "job_id": j.job_id, "job_type": j.job_type, "arrival_slot": j.arrival_slot, "slots_run": j.slots_run,
        "est_epochs": j.est_epochs, "done_epochs": j.done_epochs, "workers": j.workers, "ps": j.ps,
        "worker_nodes": list(j.worker_nodes), "ps_nodes": list(j.ps_nodes),
        "history": [{"slot": o.slot, "ps": o.ps, "workers": o.workers, "epochs": o.epochs,
                     "seconds": o.seconds, "loss": o.loss} for o in j.history]}
    if j.HasField("worker_demand"):
        d["worker_demand"] = _resources(j.worker_demand)
    if j.HasField("ps_demand"):
        d["ps_demand"] = _resources(j.ps_demand)
    for name in _JOB_OPTIONAL:
        if j.HasField(name):
            d[name] = getattr(j, name)
    return d


def request_document(msg: pb.DecideRequest) -> dict[str, Any]:
    """The JSON-shaped document of ``msg`` (what the same request's JSON body parses to)."""
    v = msg.view
    view: dict[str, Any] = {"slot": v.slot, "slot_seconds": v.slot_seconds,
                            "nodes": [_node(n) for n in v.nodes], "jobs": [_job(j) for j in v.jobs]}
    if v.HasField("placement"):
        view["placement"] = v.placement
    doc: dict[str, Any] = {"view": view}
    if msg.HasField("scheduler"):
        doc["scheduler"] = msg.scheduler
    return doc


def request_from_proto(msg: pb.DecideRequest) -> DecideRequest:
    """Validated like a JSON body; :class:`pydantic.ValidationError` with the field's path otherwise."""
    return DecideRequest.model_validate(request_document(msg))


def _set_resources(target: pb.Resources, r) -> None:
    target.cpu, target.gpu, target.mem = r.cpu, r.gpu, r.mem


def request_to_proto(req: DecideRequest) -> pb.DecideRequest:
    """The client's side: every field the pydantic request sets."""
    msg = pb.DecideRequest(scheduler=req.scheduler)
    v, out = req.view, msg.view
    out.slot, out.slot_seconds = v.slot, v.slot_seconds
    if v.placement is not None:
        out.placement = v.placement
    for n in v.nodes:
        node = out.nodes.add(count=n.count)
        _set_resources(node.capacity, n.capacity)
        if n.free is not None:
            _set_resources(node.free, n.free)
    for j in v.jobs:
        job = out.jobs.add(job_id=j.job_id, job_type=j.job_type, arrival_slot=j.arrival_slot,
                           slots_run=j.slots_run, est_epochs=j.est_epochs, done_epochs=j.done_epochs,
                           workers=j.workers, ps=j.ps, worker_nodes=j.worker_nodes, ps_nodes=j.ps_nodes)
        if j.worker_demand is not None:
            _set_resources(job.worker_demand, j.worker_demand)
        if j.ps_demand is not None:
            _set_resources(job.ps_demand, j.ps_demand)
        for name in _JOB_OPTIONAL:
            if (value := getattr(j, name)) is not None:
                setattr(job, name, value)
        for o in j.history:
            job.history.add(slot=o.slot, ps=o.ps, workers=o.workers, epochs=o.epochs, seconds=o.seconds,
                            loss=o.loss)
    return msg


def response_to_proto(resp: DecideResponse) -> pb.DecideResponse:
    msg = pb.DecideResponse(scheduler=resp.scheduler, policy_version=resp.policy_version,
                            decision_ms=resp.decision_ms)
    for a in resp.allocation:
        placed = a.worker_nodes is not None and a.ps_nodes is not None
        msg.allocation.add(job_id=a.job_id, workers=a.workers, ps=a.ps, placed=placed,
                           worker_nodes=a.worker_nodes or (), ps_nodes=a.ps_nodes or ())
    return msg


def response_from_proto(msg: pb.DecideResponse) -> DecideResponse:
    items = [JobAllocation(job_id=a.job_id, workers=a.workers, ps=a.ps,
                           worker_nodes=list(a.worker_nodes) if a.placed else None,
                           ps_nodes=list(a.ps_nodes) if a.placed else None) for a in msg.allocation]
    return DecideResponse(allocation=items, scheduler=msg.scheduler, policy_version=msg.policy_version,
                          decision_ms=msg.decision_ms)
