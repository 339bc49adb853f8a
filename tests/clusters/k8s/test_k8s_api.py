"""KubeApi's error classification and backoff, computed by hand (no server: the call is a local function)."""

from __future__ import annotations

import pytest
import urllib3
from kubernetes.client import ApiClient, Configuration
from kubernetes.client.exceptions import ApiException

from clusters.k8s.api import ApiGiveUp, Conflict, KubeApi, NotFound
from clusters.k8s.config import ApiSettings


def api(attempts: int = 5) -> tuple[KubeApi, list[float]]:
    slept: list[float] = []
    settings = ApiSettings(timeout_s=1, attempts=attempts, backoff_s=0.1, backoff_max_s=0.3)
    return KubeApi(ApiClient(Configuration()), settings, "default", sleep=slept.append), slept


def failing(*errors: Exception):
    """A call that raises ``errors`` in turn, then answers "ok"; records its keyword arguments."""
    seen: list[dict] = []

    def call(**kw):
        seen.append(kw)
        if len(seen) <= len(errors):
            raise errors[len(seen) - 1]
        return "ok"

    return call, seen


def http(status: int, retry_after: str | None = None) -> ApiException:
    exc = ApiException(status=status, reason="x")
    exc.headers = {"Retry-After": retry_after} if retry_after else {}
    return exc


def test_429_5xx_and_timeouts_are_retried_with_doubling_capped_backoff():
    k, slept = api()
    call, seen = failing(http(500), http(429), urllib3.exceptions.ReadTimeoutError(None, "/", "t"), http(503))
    assert k._call("get", "thing", call) == "ok"
    assert slept == [0.1, 0.2, 0.3, 0.3]
    assert all(kw["_request_timeout"] == 1 for kw in seen)
    assert k.calls["get"] == 5 and k.retries["get"] == 4


def test_retry_after_is_honoured_within_the_cap():
    k, slept = api()
    call, _ = failing(http(429, "0.25"), http(429, "30"))
    assert k._call("get", "thing", call) == "ok"
    assert slept == [0.25, 0.3]


@pytest.mark.parametrize(("error", "raised"), [(http(409), Conflict), (http(404), NotFound)])
def test_409_and_404_go_to_the_caller_at_once(error, raised):
    k, slept = api()
    call, seen = failing(error)
    with pytest.raises(raised):
        k._call("create", "pod p", call)
    assert len(seen) == 1 and slept == []


def test_other_4xx_are_given_up_at_once_and_say_which_call():
    k, slept = api()
    call, seen = failing(http(403))
    with pytest.raises(ApiGiveUp, match="create pod p: 403"):
        k._call("create", "pod p", call)
    assert len(seen) == 1 and slept == []


def test_out_of_attempts_is_given_up():
    k, slept = api(attempts=3)
    call, seen = failing(http(500), http(500), http(500), http(500))
    with pytest.raises(ApiGiveUp, match="after 3 tries"):
        k._call("list", "pods", call)
    assert len(seen) == 3 and slept == [0.1, 0.2]
