"""The decision endpoint's HTTP side: the routes (:data:`ENDPOINTS`, attached to a FastAPI app apart from
the service class, as Ray's LLM ingress does), and :func:`install_errors`, which turns every refusal into
an HTTP response in one place: an inconsistent view → 422 in FastAPI's validation-error format with the
field's path, a body over ``max_body_bytes`` → 413, an overloaded replica → 503 with ``Retry-After``.

``POST /v1/decide`` reads its body itself (:func:`decide_route`): pydantic parses and validates the raw
JSON bytes in one pass and the answer is serialised once, instead of FastAPI's ``json.loads`` +
validation of Python objects + ``response_model`` re-validation (≈ 1 ms of a 4 ms handler here); OpenAPI
still documents the body's schema. :func:`plain_app` puts a service's routes on a FastAPI app: plain
uvicorn runs it (the benchmark's reference), and so does every Serve replica.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from serve.convert import ViewError
from serve.metrics import RequestTimer
from serve.overload import Admission
from serve.schemas import DecideRequest, DecideResponse, Health, PolicyInfo
from serve.service import DecisionCore

_ERRORS: dict[int | str, dict[str, Any]] = {
    413: {"description": "request body larger than the server's max_body_bytes"},
    422: {"description": "the body breaks the schema or is inconsistent; `detail[].loc` names the field"},
    503: {"description": "refused early: the replica is overloaded (decide locally; see Retry-After)",
          "headers": {"Retry-After": {"schema": {"type": "integer"}, "description": "seconds"}}},
}
_REQUEST_BODY = {"requestBody": {"required": True, "content": {
    "application/json": {"schema": {"$ref": "#/components/schemas/DecideRequest"}}}}}


def _json_body(content_type: str | None) -> bool:
    """FastAPI's rule: no content type, ``application/json`` or ``application/*+json``."""
    if not content_type:
        return True
    mime = content_type.split(";", 1)[0].strip().lower()
    return mime == "application/json" or (mime.startswith("application/") and mime.endswith("+json"))


def _schema_error(exc: ValidationError) -> JSONResponse:
    """A pydantic error of the body as FastAPI's 422 (``loc`` starts with ``"body"``)."""
    detail = [{"type": e["type"], "loc": ["body", *e["loc"]], "msg": e["msg"],
               # the raw body of a json_invalid error may not even be UTF-8: not echoed
               "input": None if isinstance(e.get("input"), bytes | bytearray) else e.get("input"),
               **({"ctx": {k: v if isinstance(v, int | float | str) else str(v) for k, v in e["ctx"].items()}}
                  if "ctx" in e else {})} for e in exc.errors(include_url=False)]
    return JSONResponse(status_code=422, content=jsonable_encoder({"detail": detail}))


def _busy(admission: Admission) -> JSONResponse:
    return JSONResponse(status_code=503, headers={"Retry-After": str(admission.retry_after_s)}, content={
        "detail": f"overloaded: no answer within {admission.bound_s * 1e3:g} ms; decide locally, "
                  f"retry after {admission.retry_after_s} s"})


def decide_route(service: DecisionCore) -> Callable:
    """``POST /v1/decide`` of ``service``: admission, then the raw body parsed once, decided, answered."""

    async def decide(request: Request) -> Response:
        if not _json_body(request.headers.get("content-type")):
            return _validation_error((), "request body must be application/json", None)
        body = await request.body()

        def work() -> Response:
            try:
                req = DecideRequest.model_validate_json(body)
            except ValidationError as exc:
                return _schema_error(exc)
            return Response(service.decide_now(req).model_dump_json(), media_type="application/json")

        out = await service.admitted(work)
        return _busy(service.admission) if out is None else out

    decide.__doc__ = DecisionCore.decide_now.__doc__
    return decide


def _attach_decide(app: FastAPI) -> Callable:
    return app.post("/v1/decide", response_model=DecideResponse, responses=_ERRORS,
                    openapi_extra=_REQUEST_BODY, summary="Allocate workers and PS for one slot")


ENDPOINTS: dict[str, Callable[[FastAPI], Callable]] = {
    "decide": _attach_decide,
    "policy": lambda app: app.get("/v1/policy", response_model=PolicyInfo, summary="The served policy"),
    "healthz": lambda app: app.get("/healthz", response_model=Health, summary="Liveness and policy version"),
    "prometheus": lambda app: app.get("/metrics", include_in_schema=False),
}


def _validation_error(loc: tuple, msg: str, value: object) -> JSONResponse:
    detail = [{"type": "json_invalid" if not loc else "value_error", "loc": ["body", *loc], "msg": msg,
               "input": value}]
    return JSONResponse(status_code=422, content=jsonable_encoder({"detail": detail}))


class BodyLimit:
    """ASGI middleware: a request body over ``max_bytes`` (declared or streamed) gets a 413, unread."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await self._reject(send)
            return
        seen, started, refused = 0, False, False

        async def counted():
            # Over the limit: answer 413 here and tell the app the client left (an exception raised into
            # the app would become FastAPI's 400 "error parsing the body").
            nonlocal seen, refused
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes and not refused:
                    refused = True
                    if not started:
                        await self._reject(send)
                    return {"type": "http.disconnect"}
            return message

        async def tracked(message):
            nonlocal started
            if refused:
                return  # the 413 went out; whatever the app answers to the "disconnect" is dropped
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, counted, tracked)

    async def _reject(self, send) -> None:
        body = JSONResponse(status_code=413, content={
            "detail": f"request body larger than {self.max_bytes} bytes"}).body
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def install_errors(app: FastAPI, max_body_bytes: int) -> FastAPI:
    """Every refusal becomes an HTTP response here (413, 422); FastAPI's own 422s keep their format."""

    @app.exception_handler(ViewError)
    async def _view_error(request: Request, exc: ViewError) -> JSONResponse:
        return _validation_error(exc.loc, exc.msg, exc.value)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        # FastAPI answers a body it cannot even decode (not UTF-8, not JSON) with a bare 400; make it the
        # same 422 as any other malformed JSON, so a client handles one format.
        if exc.status_code == 400 and exc.detail == "There was an error parsing the body":
            return _validation_error((), "request body is not valid JSON", None)
        return await http_exception_handler(request, exc)

    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    return app


def fastapi_app(max_body_bytes: int) -> FastAPI:
    """An empty FastAPI app with the endpoint's metadata and error handling (no routes)."""
    app = FastAPI(title="dl2ray decision endpoint", version="1",
                  description="One slot's worker/PS allocation for a cluster view, by the DL2 policy "
                              "or a heuristic. See docs/serve.md.")
    return install_errors(app, max_body_bytes)


def _with_request_schemas(app: FastAPI) -> FastAPI:
    """Put :class:`DecideRequest` and the models it nests into the OpenAPI components (the decide route
    reads its body itself, so FastAPI does not see them)."""
    build_doc = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = build_doc()  # FastAPI keeps it as app.openapi_schema: the components added below stay
        schema = DecideRequest.model_json_schema(ref_template="#/components/schemas/{model}")
        components = doc.setdefault("components", {}).setdefault("schemas", {})
        for name, sub in {**schema.pop("$defs", {}), "DecideRequest": schema}.items():
            components.setdefault(name, sub)
        return doc

    app.openapi = openapi  # type: ignore[method-assign]
    return app


def plain_app(service: DecisionCore) -> FastAPI:
    """``service``'s routes on a FastAPI app for plain uvicorn (or an in-process test client)."""
    app = fastapi_app(service.settings.max_body_bytes)
    for name, route in ENDPOINTS.items():
        route(app)(decide_route(service) if name == "decide" else getattr(service, name))
    app.add_middleware(RequestTimer, metrics=service.metrics)  # outermost: 413s and 503s are timed too
    return _with_request_schemas(app)
