"""Starting member processes on this machine (what a Kubernetes or Ray backend would replace).

The coordinator asks a spawner for new PS and workers when a scale request or
a PS failure needs more than the standby members that registered on their own.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

log = logging.getLogger(__name__)

Role = Literal["ps", "worker"]
COORDINATOR_ENV = "ELASTIC_MXNET_COORDINATOR"


class Spawner(Protocol):
    """Starts one member process of ``role`` that registers with ``coordinator``."""

    def spawn(self, role: Role, coordinator: str) -> None: ...

    def close(self) -> None: ...


@dataclass
class ProcessSpawner:
    """Local subprocesses: PS run ``python -m elastic_mxnet.server``, workers ``worker_cmd``.

    The coordinator address reaches both through ``ELASTIC_MXNET_COORDINATOR``.
    Children stay in the caller's process group; :meth:`close` ends the ones
    still running (by pid, after ``grace_s`` seconds).
    """

    worker_cmd: Sequence[str]
    ps_cmd: Sequence[str] = (sys.executable, "-m", "elastic_mxnet.server")
    grace_s: float = 5.0
    children: list[subprocess.Popen] = field(default_factory=list)

    def spawn(self, role: Role, coordinator: str) -> None:
        cmd = list(self.ps_cmd if role == "ps" else self.worker_cmd)
        env = {**os.environ, COORDINATOR_ENV: coordinator}
        self.children.append(subprocess.Popen(cmd, env=env))
        log.info("spawned %s pid %d: %s", role, self.children[-1].pid, " ".join(cmd))

    def poll_failed(self) -> list[int]:
        """Exit codes of children that ended with an error since the last call (and forget them)."""
        failed = [c.returncode for c in self.children if c.poll() not in (None, 0)]
        self.children = [c for c in self.children if c.poll() is None]
        return failed

    def close(self) -> None:
        for child in self.children:
            try:
                child.wait(timeout=self.grace_s)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def python_cmd(args: Sequence[str]) -> list[str]:
    """``args`` run with this interpreter (for ``-m module`` style commands)."""
    return [sys.executable, *args]
