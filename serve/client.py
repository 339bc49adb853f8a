"""``ServeScheduler``: a scheduler whose ``decide(view)`` asks a running decision endpoint over HTTP.

``serve:URL`` wherever a scheduler is named (``dl2ray compare --schedulers
drf,serve:http://127.0.0.1:8000``, the cluster agents): the simulator and the
agents use the endpoint exactly like an in-process scheduler. A query string
picks the scheduler the server runs: ``serve:http://127.0.0.1:8000?scheduler=drf``
(default ``dl2``). The core finds this module through the ``dl2ray.schedulers``
entry point (``pyproject.toml``), never by importing it.

The messages are :mod:`serve.schemas`, converted by :mod:`serve.convert`.
Observations (job histories) are sent unless the server's scheduler is
``dl2``, whose state does not read them.
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit, urlunsplit

from dl2ray.errors import UserError
from dl2ray.view import Allocation, ClusterView
from serve.convert import from_view, to_allocation
from serve.schemas import DecideRequest, DecideResponse


class ServeError(RuntimeError):
    """The endpoint refused a view or could not be reached; the message is the server's."""


class ServeScheduler:
    """``decide(view)`` by ``POST URL/v1/decide`` (one kept-alive connection per instance).

    ``last_version`` is the policy version that decided the latest view.
    """

    name = "serve"

    def __init__(self, url: str, scheduler: str = "dl2", timeout_s: float = 30.0) -> None:
        import requests

        self.url, self.scheduler, self.timeout_s = url.rstrip("/"), scheduler, timeout_s
        self._session = requests.Session()
        self.last_version: str | None = None

    @classmethod
    def from_spec(cls, arg: str | None) -> ServeScheduler:
        """From the part after ``serve:``: ``http://HOST:PORT[?scheduler=NAME]``."""
        if not arg:
            raise UserError("serve needs the endpoint's URL: serve:http://127.0.0.1:8000")
        parts = urlsplit(arg)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise UserError(f"serve:{arg}: not an http(s) URL (e.g. serve:http://127.0.0.1:8000)")
        query = parse_qs(parts.query)
        unknown = sorted(set(query) - {"scheduler"})
        if unknown:
            raise UserError(f"serve:{arg}: unknown query parameter(s) {unknown}; only ?scheduler=NAME")
        scheduler = query.get("scheduler", ["dl2"])[-1]
        return cls(urlunsplit((parts.scheme, parts.netloc, parts.path, "", "")), scheduler)

    def reset(self, seed: int) -> None:
        """Nothing to reset: the server decides each view from the view alone."""

    def check(self) -> dict:
        """``GET /v1/policy``: what the endpoint serves; :class:`UserError` if it cannot be reached."""
        import requests

        try:
            r = self._session.get(f"{self.url}/v1/policy", timeout=self.timeout_s)
        except requests.RequestException as exc:
            raise UserError(f"serve:{self.url}: cannot reach the endpoint ({type(exc).__name__})") from None
        if r.status_code != 200:
            raise UserError(f"serve:{self.url}/v1/policy answered {r.status_code}: {r.text[:200]}")
        return r.json()

    def body(self, view: ClusterView) -> bytes:
        """The request body for ``view`` (JSON)."""
        # the DL2 policies read only the last observation that trained; heuristics may read them all
        req = DecideRequest(view=from_view(view, history="last" if self.scheduler == "dl2" else True),
                            scheduler=self.scheduler)
        return req.model_dump_json(exclude_none=True).encode()

    def decide(self, view: ClusterView) -> Allocation:
        import requests

        try:
            r = self._session.post(f"{self.url}/v1/decide", data=self.body(view), timeout=self.timeout_s,
                                   headers={"content-type": "application/json"})
        except requests.RequestException as exc:
            raise ServeError(f"{self.url}/v1/decide: {type(exc).__name__}: {exc}") from None
        if r.status_code != 200:
            raise ServeError(f"{self.url}/v1/decide answered {r.status_code}: {r.text[:500]}")
        resp = DecideResponse.model_validate_json(r.content)
        self.last_version = resp.policy_version
        return to_allocation(resp.allocation)

    def close(self) -> None:
        self._session.close()


def serve_scheduler(arg: str | None, cfg: object) -> ServeScheduler:
    """The ``dl2ray.schedulers`` entry point ``serve``: ``serve:URL`` → a checked :class:`ServeScheduler`."""
    sched = ServeScheduler.from_spec(arg)
    info = sched.check()
    name = getattr(cfg, "name", None)
    if name is not None and info.get("config") not in (None, name):
        raise UserError(f"serve:{sched.url} serves config {info.get('config')!r}, not {name!r}: "
                        "its catalogue and cluster may differ from this run's")
    if sched.scheduler not in info.get("schedulers", [sched.scheduler]):
        raise UserError(f"serve:{arg}: the endpoint does not serve {sched.scheduler!r}; "
                        f"it serves {info.get('schedulers')}")
    return sched
