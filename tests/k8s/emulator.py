"""A local Kubernetes API server for the tests: kmock's KubernetesEmulator over real HTTP, in a thread.

kmock's emulator is a stateful in-memory API server (create, list, get,
merge-patch, delete, watch) without controllers, admission or garbage
collection: it assigns no uid, ignores label selectors and keeps no
resourceVersion. :class:`Emulator` runs it on its own event loop in a
daemon thread (a synchronous client inside kmock's async fixture would
deadlock), declares the resources the backend uses, and offers what a test
needs besides: nodes, a kubeconfig file for the official client, a DL2Job
"kubectl apply" that assigns a uid as a real API server would, and fault
injection through kmock reactions (status codes, delayed answers).
Note that kmock applies a write before a reaction answers it, so an injected
error on a create or delete is a *lost answer*: the object was created or
deleted, the client saw an error — exactly the case where a retry must not
make a duplicate.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from pathlib import Path
from typing import Any

import yaml
from kmock import KubernetesEmulator, ResourceInfo, Server, resource

RESOURCES = {
    ("", "v1", "pods"): ResourceInfo(kind="Pod", namespaced=True, subresources={"status"}),
    ("", "v1", "services"): ResourceInfo(kind="Service", namespaced=True),
    ("", "v1", "events"): ResourceInfo(kind="Event", namespaced=True),
    ("", "v1", "nodes"): ResourceInfo(kind="Node", namespaced=False),
    ("dl2ray.io", "v1alpha1", "dl2jobs"): ResourceInfo(
        kind="DL2Job", namespaced=True, subresources={"status"}
    ),
}


class Emulator:
    """The emulator on ``url`` until :meth:`close`; ``km`` is the kmock handler (objects, reactions)."""

    def __init__(self) -> None:
        self._ready = threading.Event()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="kmock", daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the emulator did not start")

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._main())

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        async with KubernetesEmulator() as km, Server(km) as srv:
            self.km, self.url = km, str(srv.url).rstrip("/")
            for (group, version, plural), info in RESOURCES.items():
                km.resources[resource(group, version, plural)] = info
            self._ready.set()
            await self._stop.wait()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)

    def kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        """A kubeconfig for the official client pointing at this server."""
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "kmock",
            "clusters": [{"name": "kmock", "cluster": {"server": self.url}}],
            "users": [{"name": "kmock", "user": {"token": "test"}}],
            "contexts": [
                {"name": "kmock", "context": {"cluster": "kmock", "user": "kmock", "namespace": namespace}}
            ],
        }
        path.write_text(yaml.safe_dump(doc))
        return path

    def react(self, method: str, group: str, version: str, plural: str, payload: Any, times: int) -> None:
        """The next ``times`` ``method`` requests on the resource answer ``payload`` (a status code, or an
        async callable, e.g. one that sleeps past the client's timeout) instead of the stored object."""

        def add() -> None:
            self.km[method, resource(group, version, plural)][:times] << payload

        done = threading.Event()
        self.loop.call_soon_threadsafe(lambda: (add(), done.set()))
        done.wait(5)


def node(name: str, cpu: str = "4", memory: str = "8Gi", gpu: int = 0) -> dict:
    alloc = {"cpu": cpu, "memory": memory, "pods": "110"}
    if gpu:
        alloc["nvidia.com/gpu"] = str(gpu)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {
            "allocatable": alloc,
            "capacity": alloc,
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def with_uid(obj: dict) -> dict:
    """What the API server adds on create and the emulator does not: a uid."""
    obj = {**obj, "metadata": {**obj["metadata"]}}
    obj["metadata"].setdefault("uid", str(uuid.uuid5(uuid.NAMESPACE_URL, obj["metadata"]["name"])))
    return obj


def main() -> None:
    """``python tests/k8s/emulator.py``: the emulator in its own process (benchmarks); prints its URL."""
    import signal
    import sys

    emu = Emulator()
    print(emu.url, flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    emu.close()
    sys.exit(0)


if __name__ == "__main__":
    main()
