"""The learner over HTTP, for members in other Ray clusters: routes, the gateway actor, the client link.

Routes (every one needs ``Authorization: Bearer TOKEN``; without it, or with
another token, the answer is 401 and the learner is not called). TOKEN is the
federation's shared token (the operator's: every route, for any member) or a
member's own, :func:`member_token` — an HMAC of its name under the shared token,
sent with ``X-Federation-Member: NAME``. A member's token speaks for that member
only: a join, push, pull or report naming another member is refused (403) before
the learner sees it, so no member can push gradients in another cluster's name.

- ``POST /v1/fed/join``   JSON ``{"member"}`` → frame ``{"updates", "boot"}`` + weights
- ``POST /v1/fed/push``   frame ``{"member", "version", "boot", "pull", "row", "bytes_last"}`` + gradient
  → frame ``{"updates", "boot", "accepted", "lag"}`` + weights (when sent)
- ``POST /v1/fed/pull``   JSON ``{"member", "since", "boot"}`` → frame ``{"updates", "boot"}`` + weights
- ``GET  /v1/fed/version`` → JSON ``{"updates", "boot"}`` (the policy version)
- ``POST /v1/fed/report`` JSON ``{"member", "update", "val_jct", "drf_jct"}``
- ``GET  /v1/fed/status`` → the learner's :meth:`~clusters.federation.learner.FederatedPolicyImpl.status`

A *frame* is ``uint32 little-endian header length | JSON header | float32 array``
(the flat parameter vector or gradient, :func:`~clusters.a3c.training._params_vector`
order); an empty array part means "no weights". Errors: unknown member → 404,
malformed frame or JSON → 400, learner unreachable → 503 (the member retries).

:class:`FedGatewayImpl` serves these routes with uvicorn in a thread of a
detached Ray actor beside the learner (it calls the learner by name, so a
learner restart is invisible to it apart from the wait). It is not the Serve
decision app: that one answers inference requests from any client; this one
carries a learner's gradients and weights and is closed to all but members.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import struct
import threading
import time
from typing import Any

import numpy as np
from fastapi import Request  # at module level: the route's annotation must resolve (postponed annotations)

from clusters.runtime import actor_class
from dl2ray.learn.records import update_record

FRAME_HEAD = struct.Struct("<I")


def encode_frame(header: dict[str, Any], array: np.ndarray | None) -> bytes:
    h = json.dumps(header).encode()
    body = b"" if array is None else np.ascontiguousarray(array, dtype=np.float32).tobytes()
    return FRAME_HEAD.pack(len(h)) + h + body


def decode_frame(data: bytes) -> tuple[dict[str, Any], np.ndarray | None]:
    """``(header, array or None)``; ValueError on a malformed frame."""
    if len(data) < FRAME_HEAD.size:
        raise ValueError("frame shorter than its length prefix")
    (n,) = FRAME_HEAD.unpack_from(data)
    if FRAME_HEAD.size + n > len(data):
        raise ValueError("frame header longer than the body")
    header = json.loads(data[FRAME_HEAD.size:FRAME_HEAD.size + n])
    if not isinstance(header, dict):
        raise ValueError("frame header is not a JSON object")
    rest = data[FRAME_HEAD.size + n:]
    if len(rest) % 4:
        raise ValueError("array part is not float32")
    return header, (np.frombuffer(rest, dtype=np.float32) if rest else None)


class LearnerCalls:
    """What the routes call: the named learner actor (the gateway) or a plain object (tests)."""

    def __init__(self, target: Any, timeout_s: float = 60.0) -> None:
        self.target, self.timeout_s = target, timeout_s

    def __call__(self, method: str, *args: Any) -> Any:
        import ray

        if isinstance(self.target, str):
            from clusters.runtime import NAMESPACE

            actor = ray.get_actor(self.target, namespace=NAMESPACE)
            return ray.get(getattr(actor, method).remote(*args), timeout=self.timeout_s)
        return getattr(self.target, method)(*args)


class FedEndpoint:
    """The routes' logic on bytes and dicts (no FastAPI): each returns a reply dict (``weights`` → frame)."""

    def __init__(self, call: LearnerCalls) -> None:
        self.call = call

    def join(self, raw: bytes) -> dict[str, Any]:
        return self.call("join", str(_json(raw)["member"]))

    def push(self, raw: bytes) -> dict[str, Any]:
        header, grad = decode_frame(raw)
        if grad is None:
            raise ValueError("push without a gradient")
        try:  # an actor-critic or a counterfactual update's record, told apart by its fields
            row = update_record(dict(header["row"]))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"row: not an update record: {exc}") from None
        return self.call("push_member", str(header["member"]), grad, row, int(header["version"]),
                         int(header["boot"]), bool(header.get("pull", True)),
                         int(header.get("bytes_last", 0)))

    def pull(self, raw: bytes) -> dict[str, Any]:
        doc = _json(raw)
        return self.call("pull_member", str(doc["member"]), int(doc.get("since", -1)),
                         int(doc.get("boot", -1)))

    def report(self, raw: bytes) -> dict[str, Any]:
        doc = _json(raw)
        self.call("report", str(doc["member"]), int(doc["update"]), float(doc["val_jct"]),
                  float(doc["drf_jct"]))
        return {"ok": True}

    def version(self, raw: bytes) -> dict[str, Any]:
        return self.call("version")

    def status(self, raw: bytes) -> dict[str, Any]:
        return self.call("status")


ROUTES = {"/v1/fed/join": ("POST", "join", True), "/v1/fed/push": ("POST", "push", True),
          "/v1/fed/pull": ("POST", "pull", True), "/v1/fed/report": ("POST", "report", False),
          "/v1/fed/version": ("GET", "version", False), "/v1/fed/status": ("GET", "status", False)}
"""path -> (method, FedEndpoint method, reply as a frame)."""


def _json(raw: bytes) -> dict[str, Any]:
    doc = json.loads(raw or b"{}")
    if not isinstance(doc, dict):
        raise ValueError("body is not a JSON object")
    return doc


def answer(endpoint: FedEndpoint, name: str, as_frame: bool, raw: bytes) -> tuple[int, bytes, str]:
    """``(status, body, media type)`` of one request; every refusal is turned into a response here."""
    try:
        reply = getattr(endpoint, name)(raw)
    except (ValueError, KeyError, TypeError) as exc:
        code = 404 if "unknown member" in str(exc) else 400
        return code, json.dumps({"detail": f"{exc}"[:500]}).encode(), "application/json"
    except Exception as exc:  # the learner is restarting or gone: the member retries
        return 503, json.dumps({"detail": f"learner unavailable: {type(exc).__name__}"}).encode(), \
            "application/json"
    if as_frame:
        weights = reply.pop("weights", None)
        return 200, encode_frame(reply, weights), "application/octet-stream"
    return 200, json.dumps(reply).encode(), "application/json"


MEMBER_HEADER = "X-Federation-Member"
"""The header naming the member whose own token a request carries."""
MEMBER_ROUTES = ("join", "push", "pull", "report")
"""The routes that speak for a member (the ``member`` field of their body)."""


def member_token(shared: str, member: str) -> str:
    """Member ``member``'s own token: HMAC-SHA256 of its name under the federation's shared token (hex).
    The learner recomputes it; a member given only its own cannot make another's."""
    name = f"dl2ray-federation-member:{member}".encode()
    return hmac.new(shared.encode(), name, hashlib.sha256).hexdigest()


def authorized(header: str, token: str) -> bool:
    scheme, _, value = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), token.encode())


def body_member(name: str, raw: bytes) -> str | None:
    """The member a request of route ``name`` speaks for (None: a route that names none, or a body the route
    itself will refuse as malformed)."""
    if name not in MEMBER_ROUTES:
        return None
    try:
        doc = decode_frame(raw)[0] if name == "push" else _json(raw)
        return str(doc["member"])
    except (ValueError, KeyError, TypeError):
        return None


def make_app(endpoint: FedEndpoint, token: str):
    """The FastAPI app of :data:`ROUTES` over ``endpoint``; the token is checked before anything else, and a
    member's token against the member its request names (module docstring)."""
    import anyio
    from fastapi import FastAPI, Response

    app = FastAPI(title="dl2ray federation learner")

    def refuse(code: int, detail: str) -> Response:
        headers = {"WWW-Authenticate": "Bearer"} if code == 401 else None
        return Response(json.dumps({"detail": detail}), status_code=code, media_type="application/json",
                        headers=headers)

    def route(name: str, as_frame: bool):
        async def handler(request: Request) -> Response:
            header = request.headers.get("authorization", "")
            who = request.headers.get(MEMBER_HEADER)
            operator = authorized(header, token)
            if not operator and not (who and authorized(header, member_token(token, who))):
                return refuse(401, "missing or wrong federation token")
            raw = await request.body()
            named = body_member(name, raw)
            if not operator and named is not None and named != who:
                return refuse(403, f"member {who!r}'s token cannot speak for member {named!r}")
            code, body, media = await anyio.to_thread.run_sync(answer, endpoint, name, as_frame, raw)
            return Response(body, status_code=code, media_type=media)
        return handler

    for path, (method, name, as_frame) in ROUTES.items():
        app.add_api_route(path, route(name, as_frame), methods=[method])
    return app


class FedGatewayImpl:
    """uvicorn serving :func:`make_app` in a thread; behind :data:`FedGateway`. ``url()`` once it listens."""

    def __init__(self, learner: Any, token: str, host: str, port: int) -> None:
        """``learner``: the learner actor's name (in a Ray cluster) or a plain learner object (tests)."""
        import socket

        import uvicorn

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))  # bound here, so a taken port fails the constructor, not a thread
        self.host, self.port = host, sock.getsockname()[1]
        config = uvicorn.Config(make_app(FedEndpoint(LearnerCalls(learner)), token), log_level="warning",
                                access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started and time.monotonic() < deadline and self.thread.is_alive():
            time.sleep(0.05)
        if not self.server.started:
            raise RuntimeError(f"federation endpoint did not start on {host}:{self.port}")

    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def gateway_actor() -> Any:
    """The endpoint's Ray actor class (made on first use: this module imports no Ray)."""
    return actor_class(FedGatewayImpl, num_cpus=0, max_restarts=-1, max_task_retries=-1)


class HttpLink:
    """A member's link to the learner over HTTP (:class:`~clusters.federation.learner.Link`).

    ``bytes_last``: request plus reply body bytes of the latest push (what one update costs on the wire,
    headers excluded); sent to the learner with the next push.
    """

    def __init__(self, url: str, token: str, timeout_s: float = 60.0, member: str | None = None) -> None:
        """``token``: the shared token (an operator's link), or with ``member`` that member's own
        (:func:`member_token`), which the learner accepts for that member only."""
        import requests

        self.url, self.timeout_s = url.rstrip("/"), timeout_s
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"
        if member is not None:
            self.session.headers[MEMBER_HEADER] = member
        self.bytes_last = 0

    def _post(self, path: str, data: bytes | None = None, doc: dict | None = None):
        import requests

        from clusters.federation.links import LinkDown

        try:
            resp = self.session.post(self.url + path, data=data, json=doc, timeout=self.timeout_s)
        except requests.RequestException as exc:
            raise LinkDown(f"{self.url}: {type(exc).__name__}") from exc
        if resp.status_code in (502, 503, 504):
            raise LinkDown(f"{self.url}{path}: {resp.status_code} {resp.text[:200]}")
        if resp.status_code != 200:
            raise RuntimeError(f"{self.url}{path}: {resp.status_code} {resp.text[:300]}")
        return resp

    def _reply(self, resp) -> dict[str, Any]:
        header, arr = decode_frame(resp.content)
        header["weights"] = arr
        return header

    def join(self, name: str) -> dict[str, Any]:
        return self._reply(self._post("/v1/fed/join", doc={"member": name}))

    def push(self, name, flat_grad, row, version, boot, pull):
        body = encode_frame({"member": name, "version": int(version), "boot": int(boot), "pull": bool(pull),
                             "row": dataclasses.asdict(row), "bytes_last": self.bytes_last}, flat_grad)
        resp = self._post("/v1/fed/push", data=body)
        self.bytes_last = len(body) + len(resp.content)
        return self._reply(resp)

    def pull(self, name, since, boot):
        return self._reply(self._post("/v1/fed/pull", doc={"member": name, "since": since, "boot": boot}))

    def report(self, name, update, val_jct, drf_jct):
        self._post("/v1/fed/report", doc={"member": name, "update": update, "val_jct": val_jct,
                                          "drf_jct": drf_jct})

    def status(self) -> dict[str, Any]:
        """``GET /v1/fed/status``: the learner's members and their staleness (the agent's dashboard)."""
        return self._get("/v1/fed/status")

    def version(self) -> dict[str, int]:
        return self._get("/v1/fed/version")

    def _get(self, path: str) -> Any:
        """``GET path`` as JSON; a connection failure is a :class:`~clusters.federation.links.LinkDown`."""
        import requests

        from clusters.federation.links import LinkDown

        try:
            resp = self.session.get(self.url + path, timeout=self.timeout_s)
        except requests.RequestException as exc:
            raise LinkDown(str(exc)) from exc
        resp.raise_for_status()
        return resp.json()
