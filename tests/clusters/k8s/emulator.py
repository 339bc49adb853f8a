"""A local Kubernetes API server for the tests: kmock's KubernetesEmulator over real HTTP, in a thread.

kmock's emulator is a stateful in-memory API server (create, list, get,
merge-patch, delete, watch) without controllers, admission or garbage
collection. :class:`apiserver.ApiServer` (a subclass) adds what the real
kubectl needs and kmock lacks: uids and creation timestamps, CRDs that
register their resources, correct discovery, typed lists with label and field
selectors, and server-side Table output from a CRD's printer columns.
:class:`Emulator` runs it on its own event loop in a
daemon thread (a synchronous client inside kmock's async fixture would
deadlock), declares the resources the backend uses, and offers what a test
needs besides: nodes, a kubeconfig file for the official client, a DL2Job
"kubectl apply" that assigns a uid as a real API server would, and fault
injection through kmock reactions (status codes, delayed answers).
Note that kmock applies a write before a reaction answers it, so an injected
error on a create or delete is a *lost answer*: the object was created or
deleted, the client saw an error — exactly the case where a retry must not
make a duplicate.

Cost per request (kmock 0.8, measured; docs/BENCHMARKS.md): kmock logs every
request it serves (for assertions) and decides which reaction answers a new
request by testing, reaction after reaction, whether the request is among the
logged requests that reaction's filter selects — a walk over the whole log,
applying the filter's criteria to each logged request. Serving therefore costs
about 40 µs per request served before (a GET after 2,000 requests: 86 ms),
whatever the number of objects: quadratic over a run. Stored objects cost far
less (each request scans them once; patches keep old versions in memory, but
only the last is read). :class:`Emulator` with ``fresh_log_every=N`` (the
benchmark) bounds the log: after every N requests it moves the objects, last
versions only, into a fresh ``KubernetesEmulator`` through kmock's public
``objects`` and ``resources`` and serves from that one — between two requests,
never while one is being served. The tests keep the default (one emulator, the
full log, the reactions of :meth:`Emulator.react`).
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from pathlib import Path
from typing import Any

import aiohttp.test_utils
import aiohttp.web
import yaml
from apiserver import ApiServer
from kmock import KubernetesEmulator, ResourceInfo, Server, resource

DL2JOBS = ("dl2ray.io", "v1alpha1", "dl2jobs")
RESOURCES = {
    ("", "v1", "pods"): ResourceInfo(kind="Pod", namespaced=True, subresources={"status"}),
    ("", "v1", "services"): ResourceInfo(kind="Service", namespaced=True),
    ("", "v1", "events"): ResourceInfo(kind="Event", namespaced=True),
    ("", "v1", "nodes"): ResourceInfo(kind="Node", namespaced=False),
    DL2JOBS: ResourceInfo(kind="DL2Job", namespaced=True, subresources={"status"}),
    # what configs/k8s/ holds besides, for `kubectl apply -f configs/k8s/`
    ("", "v1", "serviceaccounts"): ResourceInfo(kind="ServiceAccount", namespaced=True),
    ("", "v1", "configmaps"): ResourceInfo(kind="ConfigMap", namespaced=True),
    ("apps", "v1", "deployments"): ResourceInfo(kind="Deployment", namespaced=True, subresources={"status"}),
    ("apiextensions.k8s.io", "v1", "customresourcedefinitions"): ResourceInfo(
        kind="CustomResourceDefinition", namespaced=False, shortnames={"crd", "crds"}, subresources={"status"}
    ),
    ("rbac.authorization.k8s.io", "v1", "roles"): ResourceInfo(kind="Role", namespaced=True),
    ("rbac.authorization.k8s.io", "v1", "rolebindings"): ResourceInfo(kind="RoleBinding", namespaced=True),
    ("rbac.authorization.k8s.io", "v1", "clusterroles"): ResourceInfo(kind="ClusterRole", namespaced=False),
    ("rbac.authorization.k8s.io", "v1", "clusterrolebindings"): ResourceInfo(
        kind="ClusterRoleBinding", namespaced=False
    ),
}


class FreshLog:
    """An aiohttp handler that serves every request with a KubernetesEmulator and, after every ``every``
    requests, moves the objects into a fresh one (module docstring: kmock's log makes each request
    cost time in proportion to the requests served before it).

    The move waits until no request is being served (new ones wait for it) and copies the last version
    of each live object; reactions and object histories are not carried over, and a watch (a request
    that never ends) would hold the move off for ever: no watches with this handler.
    """

    def __init__(self, km: KubernetesEmulator, every: int) -> None:
        self.km, self.every = km, every
        self.served = 0  # requests answered since the last move
        self.moves = 0
        self._busy = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._open = asyncio.Event()
        self._open.set()
        self._moving: asyncio.Task[None] | None = None

    async def __call__(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        await self._open.wait()
        self._busy += 1
        self._idle.clear()
        try:
            return await self.km(raw)
        finally:
            self._busy -= 1
            self.served += 1
            if not self._busy:
                self._idle.set()
            if self.served >= self.every and self._moving is None:
                self._moving = asyncio.create_task(self._move())

    async def _move(self) -> None:
        self._open.clear()
        old = self.km
        try:
            await self._idle.wait()
            new = type(old)()
            await new.__aenter__()
            for res, info in old.resources.items():
                new.resources[res] = info
            for (res, namespace, name), obj in old.objects.items():
                if not obj.deleted:
                    new.objects[res, namespace, name] = obj.raw
            self.km, self.served = new, 0
            self.moves += 1
        finally:  # a failed move leaves the old emulator serving, never a server that waits for ever
            self._moving = None
            self._open.set()
        await old.__aexit__(None, None, None)


class Emulator:
    """The emulator on ``url`` until :meth:`close`; ``km`` is the kmock handler (objects, reactions).

    ``fresh_log_every``: None (the tests) serves everything from one KubernetesEmulator; N moves the
    objects into a fresh one after every N requests (:class:`FreshLog`; then ``km`` is the first one
    only, and :meth:`react` is not available). ``dl2jobs``: True serves DL2Jobs from the start (as if
    the CRD were installed); False serves them once ``configs/k8s/crd.yaml`` is applied, as a real
    API server does.
    """

    def __init__(self, fresh_log_every: int | None = None, dl2jobs: bool = True) -> None:
        self.fresh_log_every, self.dl2jobs = fresh_log_every, dl2jobs
        self.front: FreshLog | None = None
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
        km = ApiServer()
        for key, info in RESOURCES.items():
            if key != DL2JOBS or self.dl2jobs:
                km.resources[resource(*key)] = info
        self.km = km
        if self.fresh_log_every is None:
            async with km, Server(km) as srv:
                self.url = str(srv.url).rstrip("/")
                self._ready.set()
                await self._stop.wait()
            return
        await km.__aenter__()
        self.front = FreshLog(km, self.fresh_log_every)
        async with aiohttp.test_utils.RawTestServer(self.front, host="127.0.0.1") as srv:
            self.url = str(srv.make_url("")).rstrip("/")
            self._ready.set()
            await self._stop.wait()
        await self.front.km.__aexit__(None, None, None)

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
        if self.front is not None:
            raise RuntimeError(
                "reactions do not survive FreshLog moves: use Emulator() without fresh_log_every"
            )

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
    """``obj`` with a uid derived from its name (the server assigns a random one to an object sent
    without): the same uid in every run."""
    obj = {**obj, "metadata": {**obj["metadata"]}}
    obj["metadata"].setdefault("uid", str(uuid.uuid5(uuid.NAMESPACE_URL, obj["metadata"]["name"])))
    return obj


def main() -> None:
    """``python tests/clusters/k8s/emulator.py [--fresh-log-every N]``: the emulator in its own process
    (benchmarks); prints its URL."""
    import argparse
    import signal
    import sys

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--fresh-log-every", type=int, default=None, metavar="N", help="see FreshLog")
    emu = Emulator(fresh_log_every=p.parse_args().fresh_log_every)
    print(emu.url, flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    emu.close()
    sys.exit(0)


if __name__ == "__main__":
    main()
