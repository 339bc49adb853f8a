"""The real ``kubectl`` binary against the test API server (tests/clusters/k8s/apiserver.py), for the tests.

kubectl reads the kubeconfig the emulator writes, keeps its discovery cache in
the test's own directory (``--cache-dir``; a cache shared between servers would
answer for the wrong one) and runs with ``HOME`` there too, so nothing of the
user's ``~/.kube`` is read. ``kubectl apply`` runs with ``--validate=false``:
validation needs the server's OpenAPI documents (``/openapi/v3``, to learn
whether the server validates fields, else ``/openapi/v2`` to validate on the
client), which the test server does not publish; the manifests are validated
offline against the Kubernetes schemas instead (test_k8s_manifests.py).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

BINARY = shutil.which("kubectl")

requires_kubectl = pytest.mark.skipif(
    BINARY is None and not os.environ.get("CI"),
    reason="no kubectl on PATH (`make kubectl` installs Debian's kubernetes-client; CI installs it)",
)
"""Skip without the binary, except on CI (CI=true), where its absence fails the test."""


class Kubectl:
    """``kubectl`` against one emulator: ``run(*args)`` returns the completed process."""

    def __init__(self, kubeconfig: Path, home: Path) -> None:
        if BINARY is None:
            raise RuntimeError("kubectl is not on PATH: run `make kubectl` (Debian's kubernetes-client)")
        self.kubeconfig, self.home = kubeconfig, home
        home.mkdir(parents=True, exist_ok=True)

    def run(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "HOME": str(self.home)}
        assert BINARY is not None
        proc = subprocess.run(
            [BINARY, "--cache-dir", str(self.home / "cache"), "--request-timeout", "20s", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}")
        return proc

    def out(self, *args: str) -> str:
        return self.run(*args).stdout

    def table(self, *args: str) -> list[dict[str, str]]:
        """``kubectl get ...`` printed as a table, parsed into rows keyed by the header: kubectl aligns
        each column under its header (headers are apart by two or more spaces; a cell may be empty)."""
        lines = [ln for ln in self.out("get", *args).splitlines() if ln.strip()]
        cols = [(m.group(), m.start()) for m in re.finditer(r"\S+(?: \S+)*", lines[0])]
        bounds = [(name, start, cols[i + 1][1] if i + 1 < len(cols) else None) for i, (name, start) in
                  enumerate(cols)]
        return [{name: ln[a:b].strip() for name, a, b in bounds} for ln in lines[1:]]
