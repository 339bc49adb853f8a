"""The gRPC ``Decider/Decide`` call (``serve/proto/decide.proto``) of a :class:`~serve.service.DecisionCore`:
the same checks as ``POST /v1/decide``, errors as status codes (INVALID_ARGUMENT with the field's path,
RESOURCE_EXHAUSTED when refused under overload). Serve's gRPC proxy or the replica's own gRPC server
calls it through :meth:`serve.app.DecisionService.Decide`.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from serve.convert import ViewError
from serve.service import DecisionCore


async def decide_call(service: DecisionCore, request: Any, grpc_context: Any = None) -> Any:
    """A ``decide_pb2.DecideRequest`` → ``decide_pb2.DecideResponse``.

    Errors set the call's status code (Serve passes ``grpc_context``): INVALID_ARGUMENT with the
    field's path for a request the HTTP endpoint answers with 422, RESOURCE_EXHAUSTED when refused
    under overload (:mod:`serve.overload`). Without a context (a plain handle call) they raise.
    """
    from serve.grpc.messages import request_from_proto, response_to_proto
    from serve.proto import decide_pb2

    def work() -> tuple[str, str] | decide_pb2.DecideResponse:
        try:
            return response_to_proto(service.decide_now(request_from_proto(request)))
        except ValidationError as exc:
            return "INVALID_ARGUMENT", _first_error(exc)
        except ViewError as exc:
            return "INVALID_ARGUMENT", str(exc)

    out = await service.admitted(work)
    if out is None:
        return _grpc_status(grpc_context, decide_pb2.DecideResponse(), "RESOURCE_EXHAUSTED",
                            f"overloaded: no answer within {service.admission.bound_s * 1e3:g} ms; "
                            f"decide locally, retry after {service.admission.retry_after_s} s")
    if isinstance(out, tuple):
        return _grpc_status(grpc_context, decide_pb2.DecideResponse(), *out)
    return out


def _first_error(exc: ValidationError) -> str:
    """``view.jobs.3.job_type: Input should be …`` (the gRPC details of a schema error)."""
    e = exc.errors(include_url=False)[0]
    return f"{'.'.join(map(str, e['loc'])) or 'request'}: {e['msg']}"


def _grpc_status(context, empty, code: str, details: str):
    """Set ``code`` (a ``grpc.StatusCode`` name) and ``details`` on Serve's gRPC context; ``empty``."""
    if context is None:
        raise (ViewError(("request",), details) if code == "INVALID_ARGUMENT" else RuntimeError(details))
    import grpc

    context.set_code(getattr(grpc.StatusCode, code))
    context.set_details(details)
    return empty
