"""Command-line user errors: a clear message, exit status 2, no traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    "args, message",
    [
        (["elastic_mxnet.launch", "--ps", "2"], "no worker command"),
        (["elastic_mxnet.launch", "--ps", "0", "--", "true"], "must be >= 1"),
        (["elastic_mxnet.launch", "--ps", "x", "--", "true"], "invalid int"),
        (["elastic_mxnet.ctl", "localhost:1", "status"], "tcp://HOST:PORT"),
        (["elastic_mxnet.ctl", "tcp://127.0.0.1:1", "scale"], "--ps and/or --workers"),
        (["elastic_mxnet.ctl", "tcp://127.0.0.1:1", "scale", "--ps", "-1"], "must be >= 0"),
        (["elastic_mxnet.server"], "--coordinator"),
    ],
)
def test_usage_errors_exit_2_without_traceback(args, message):
    result = _run(*args)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_ctl_without_a_coordinator_fails_cleanly():
    from elastic_mxnet.protocol.wire import free_port

    result = _run(
        "elastic_mxnet.ctl", "--timeout", "0.5", f"tcp://127.0.0.1:{free_port()}", "status"
    )
    assert result.returncode == 1
    assert "no reply" in result.stderr and "Traceback" not in result.stderr
