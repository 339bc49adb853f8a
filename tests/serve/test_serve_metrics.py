"""The Serve app's ``/metrics`` (over real HTTP, plain uvicorn): request latency, decisions, refusals, the
policy served; and the Grafana dashboard's panels against scrapes of the app and of an agent."""

from __future__ import annotations

import json
import re

import requests
from prometheus_client.parser import text_string_to_metric_families
from serve_support import ROOT

from clusters.agent.metrics import METRIC_NAMES as AGENT_METRICS
from clusters.agent.metrics import QUEUE_METRIC_NAMES as QUEUE_METRICS
from clusters.agent.metrics import AgentMetrics
from clusters.agent.queues import QueueRow
from serve.convert import from_view
from serve.metrics import METRIC_NAMES

GRAFANA = ROOT / "configs" / "grafana" / "dl2ray.json"


def _families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _value(family, sample: str, **labels: str) -> float:
    return sum(s.value for s in family.samples
               if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()))


def _names(families: dict) -> set[str]:
    """Every name a query may use: each sample's, and each family's with its type's suffixes."""
    out = {s.name for f in families.values() for s in f.samples}
    for f in families.values():
        out |= {f.name, *(f.name + s for s in ("_total", "_bucket", "_sum", "_count", "_created"))}
    return out


def test_requests_decisions_and_the_served_policy_are_counted(endpoint, views):
    before = _families(requests.get(f"{endpoint.url}/metrics", timeout=30).text)
    decided0 = _value(before["dl2ray_serve_decisions"], "dl2ray_serve_decisions_total", scheduler="dl2")
    ok0 = _value(before["dl2ray_serve_request_seconds"], "dl2ray_serve_request_seconds_count",
                 route="/v1/decide", code="200")
    body = {"view": from_view(views[0]).model_dump(mode="json"), "scheduler": "dl2"}
    for _ in range(3):
        assert requests.post(f"{endpoint.url}/v1/decide", json=body, timeout=60).status_code == 200
    assert requests.post(f"{endpoint.url}/v1/decide", json={"view": {}}, timeout=60).status_code == 422
    assert requests.get(f"{endpoint.url}/no/such/path", timeout=30).status_code == 404
    r = requests.get(f"{endpoint.url}/metrics", timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    m = _families(r.text)
    decided = _value(m["dl2ray_serve_decisions"], "dl2ray_serve_decisions_total", scheduler="dl2")
    assert decided == decided0 + 3
    assert _value(m["dl2ray_serve_request_seconds"], "dl2ray_serve_request_seconds_count",
                  route="/v1/decide", code="200") == ok0 + 3
    assert _value(m["dl2ray_serve_request_seconds"], "dl2ray_serve_request_seconds_count",
                  route="/v1/decide", code="422") >= 1
    assert _value(m["dl2ray_serve_request_seconds"], "dl2ray_serve_request_seconds_count",
                  route="other", code="404") >= 1  # unknown paths share one label: no cardinality blow-up
    assert _value(m["dl2ray_serve_decision_seconds"], "dl2ray_serve_decision_seconds_count") >= 3
    assert _value(m["dl2ray_serve_overload_admitted"], "dl2ray_serve_overload_admitted_total") >= 3
    version = endpoint.service.store.current.version
    assert _value(m["dl2ray_serve_policy_info"], "dl2ray_serve_policy_info", version=version) == 1
    assert set(METRIC_NAMES) <= _names(m)
    assert "/metrics" not in requests.get(f"{endpoint.url}/openapi.json", timeout=30).json()["paths"]


def test_every_grafana_panel_queries_metrics_of_a_scrape(endpoint):
    agent = AgentMetrics(lambda: [])
    agent.watch_queues(lambda: [QueueRow(
        name="prod", cohort="default", weight=1.0, nominal={"cpu": 4, "gpu": 1, "mem": 8},
        borrowing_limit=None, lending_limit=None, used={"cpu": 5, "gpu": 1, "mem": 2},
        borrowed={"cpu": 1, "gpu": 0, "mem": 0}, jobs=2, running=1, waiting=1, slot=3)])
    agent.slot({"total_ms": 5.0}, {"applied": "fallback", "reason": "timeout: late"}, [True], 3)
    scraped = _names(_families(agent.scrape().decode()))
    scraped |= _names(_families(requests.get(f"{endpoint.url}/metrics", timeout=30).text))
    doc = json.loads(GRAFANA.read_text())
    panels = [p for p in doc["panels"] if p["type"] != "row"]
    assert len(panels) >= 15
    queried = set()
    for p in panels:
        assert p["targets"], p["title"]
        for t in p["targets"]:
            names = set(re.findall(r"\b(dl2ray_[a-z_]+)", t["expr"]))
            assert names, (p["title"], t["expr"])
            assert names <= scraped, (p["title"], names - scraped)
            queried |= names
    # every metric the agent and the app export has a panel
    exported = {n.removesuffix("_total") for n in (*METRIC_NAMES, *AGENT_METRICS, *QUEUE_METRICS)}
    assert exported <= {re.sub(r"_(total|bucket|sum|count)$", "", q) for q in queried}
