"""Early refusal under overload: the admission arithmetic by hand, 503 + Retry-After over real HTTP, and the
serve:URL client deciding a refused view locally with its fallback (counted, never lost)."""

from __future__ import annotations

import dataclasses
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from serve_support import SHIPPED, TESTBED, Endpoint

from dl2ray.errors import Refused
from dl2ray.schedulers.base import make_scheduler
from serve.client import ServeScheduler, serve_scheduler
from serve.overload import Admission


def test_admission_refuses_what_would_wait_past_the_bound():
    a = Admission(bound_s=0.010, service_s=0.003)
    first = a.arrive()
    assert first is not None and first.ahead == 0
    # held 1, 2: (held + 1) × 3 ms = 6, 9 ms ≤ 10 ms → admitted; held 3: 12 ms > 10 ms → refused
    second, third = a.arrive(), a.arrive()
    assert second is not None and third is not None and third.ahead == 2
    assert a.arrive() is None and a.refused_arrival == 1 and a.held == 3
    first.done(0.003)
    assert a.held == 2 and a.arrive() is not None  # room again
    assert not first.late()  # nothing was ahead of it: never late, however long it takes


def test_a_lone_request_is_never_refused_however_slow():
    a = Admission(bound_s=0.010, service_s=1.0)  # one decision takes 100 × the bound
    t = a.arrive()
    assert t is not None and not t.late()


def test_late_tickets_are_refused_and_leave_the_queue():
    a = Admission(bound_s=0.010, service_s=0.001)
    a.arrive()
    t = a.arrive()
    assert t is not None and t.ahead == 1
    t.arrived -= 0.0095  # as if it had waited 9.5 ms: 9.5 + 1 > 10
    assert t.late() and a.refused_late == 0 and a.held == 2  # late() only reads
    a.refuse_late(t)
    assert a.refused_late == 1 and a.held == 1
    t.done()  # done twice changes nothing
    assert a.held == 1


def test_service_time_skips_the_first_decision_and_clips_outliers():
    a = Admission(bound_s=0.010, service_s=0.003, alpha=0.5)
    a.observe(1.5)  # the first decision compiles the loop: not counted
    assert a.service_s == 0.003
    a.observe(1.5)  # counts as the bound: 0.003 + 0.5 × (0.010 − 0.003)
    assert a.service_s == pytest.approx(0.0065)
    off = Admission(bound_s=0.0)
    assert all(off.arrive() is not None for _ in range(1000))


class SlowDRF:
    """DRF that takes ``seconds`` per decision: a slow replica, deterministically."""

    name, arch = "slow-drf", "shape"

    def __init__(self, seconds: float) -> None:
        self.seconds, self.drf = seconds, make_scheduler("drf", None)

    def decide(self, view):
        time.sleep(self.seconds)
        return self.drf.decide(view)


@pytest.fixture
def slow_endpoint():
    ep = Endpoint({"config": str(TESTBED), "checkpoint": str(SHIPPED), "reload_every_s": 0,
                   "overload_bound_ms": 300, "retry_after_s": 2})
    # every decision blocks the event loop for 200 ms: one request fits in the 300 ms bound, two do not
    ep.service.admission.service_s = 0.200
    ep.service.admission.decided = 1
    store = ep.service.store  # the served "dl2" weights replaced by a slow scheduler (one reference swap)
    store._current = dataclasses.replace(store.current, scheduler=SlowDRF(0.200))
    yield ep
    ep.close()


def test_a_burst_gets_early_503s_with_retry_after_and_the_rest_answered(slow_endpoint, views):
    body = ServeScheduler(slow_endpoint.url).body(views[-1])
    url = f"{slow_endpoint.url}/v1/decide"
    barrier = threading.Barrier(12)

    def post(_):
        with requests.Session() as s:
            barrier.wait()
            t0 = time.perf_counter()
            r = s.post(url, data=body, headers={"content-type": "application/json"})
            return r.status_code, r.headers.get("retry-after"), time.perf_counter() - t0

    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(post, range(12)))
    codes = [c for c, _, _ in answers]
    assert set(codes) == {200, 503} and codes.count(200) >= 1, codes
    assert all(ra == "2" for c, ra, _ in answers if c == 503)
    # a refusal is answered at once, not after the queue ahead of it
    assert min(t for c, _, t in answers if c == 503) < 0.200 * codes.count(200)
    info = requests.get(f"{slow_endpoint.url}/v1/policy").json()["overload"]
    assert info["refused_arrival"] + info["refused_late"] == codes.count(503)
    assert info["held"] == 0 and info["bound_ms"] == 300
    assert requests.get(f"{slow_endpoint.url}/healthz").status_code == 200


class FakeTransport:
    """Refuses the first ``refusals`` calls (Retry-After ``retry_s``), then answers with DRF's allocation."""

    url = "http://fake"

    def __init__(self, refusals: int, retry_s: float) -> None:
        self.refusals, self.retry_s, self.calls = refusals, retry_s, 0

    def decide(self, req):
        from serve.convert import from_allocation, to_view
        from serve.schemas import DecideResponse

        self.calls += 1
        if self.calls <= self.refusals:
            raise Refused("503", self.retry_s)
        from dl2ray.config import load_config

        cfg = load_config(TESTBED)
        alloc = make_scheduler("fifo", cfg).decide(to_view(req.view, cfg.catalogue, "load_balancing", 200))
        return DecideResponse(allocation=from_allocation(alloc), scheduler="fifo", policy_version="v",
                              decision_ms=0.1)


def test_the_client_decides_a_refused_view_locally_and_waits_out_retry_after(views, testbed):
    now = [0.0]
    drf_local = make_scheduler("drf", testbed)
    client = ServeScheduler("http://fake", "fifo", fallback=drf_local, clock=lambda: now[0])
    client._transport = FakeTransport(refusals=1, retry_s=2.0)
    view = views[-1]
    drf = make_scheduler("drf", testbed).decide(view)
    assert client.decide(view).tasks == drf.tasks and client.refusals == 1 and client.last_version is None
    now[0] = 1.0  # within Retry-After: decided locally without asking
    assert client.decide(view).tasks == drf.tasks and client.refusals == 2 and client._transport.calls == 1
    now[0] = 2.5
    assert client.decide(view).tasks == make_scheduler("fifo", testbed).decide(view).tasks
    assert client.refusals == 2 and client.last_version == "v" and client._transport.calls == 2
    with pytest.raises(Refused):  # without a fallback, the refusal reaches the caller (the guardrail)
        _refusing_client().decide(view)


def _refusing_client() -> ServeScheduler:
    c = ServeScheduler("http://fake", fallback=None)
    c._transport = FakeTransport(refusals=1, retry_s=1.0)
    return c


def test_spec_fallbacks(endpoint, testbed):
    assert serve_scheduler(endpoint.url, testbed).fallback.name == "drf"
    assert serve_scheduler(f"{endpoint.url}?fallback=fifo", testbed).fallback.name == "fifo"
    assert serve_scheduler(f"{endpoint.url}?fallback=none", testbed).fallback is None
    from dl2ray.errors import UserError

    with pytest.raises(UserError, match="another endpoint"):
        serve_scheduler(f"{endpoint.url}?fallback=serve:http://x", testbed)
    with pytest.raises(UserError, match="unknown query"):
        serve_scheduler(f"{endpoint.url}?retries=3", testbed)
