"""The no-op floor (``ServeSettings.noop``): the same app and request path, one fixed answer, no decision.

``dl2ray bench serve`` measures it beside each Serve mode (``serve-MODE-noop``); it must parse and
validate every request as the endpoint does and answer every valid one with the same allocation.
"""

from __future__ import annotations

import requests
from serve_support import SHIPPED, TESTBED, Endpoint

from serve.bench import floor_ratios
from serve.convert import from_view


def test_noop_answers_one_fixed_allocation_and_still_validates(views):
    ep = Endpoint({"config": str(TESTBED), "checkpoint": str(SHIPPED), "reload_every_s": 0, "noop": True})
    try:
        bodies = [{"view": from_view(v).model_dump(mode="json"), "scheduler": "dl2"} for v in views]
        answers = [requests.post(f"{ep.url}/v1/decide", json=b) for b in bodies]
        assert all(r.status_code == 200 for r in answers)
        first = answers[0].json()
        assert all(r.json() == first for r in answers)  # every request: the first one's answer
        bad = requests.post(f"{ep.url}/v1/decide", json={"view": {}, "scheduler": "dl2"})
        assert bad.status_code == 422  # parsed and validated as always
    finally:
        ep.close()


def test_floor_ratios_pair_each_server_with_its_noop():
    summary = {"serve-direct": {"p50_ms": 3.0, "p99_ms": 6.0, "max_rps_p99_under_50ms": 300},
               "serve-direct-noop": {"p50_ms": 2.0, "p99_ms": 4.0, "max_rps_p99_under_50ms": 400},
               "uvicorn": {"p50_ms": 1.0, "p99_ms": 2.0, "max_rps_p99_under_50ms": 500}}
    assert floor_ratios(summary) == {"serve-direct": {
        "noop": "serve-direct-noop", "p50_over_noop": 1.5, "p99_over_noop": 1.5,
        "max_rps_over_noop": 0.75}}
