"""A test kubelet: runs the emulator's pods as local processes (a real elastic MXNet job trains).

It plays the parts of a cluster the emulator lacks, for every node at once:

* **scheduler**: a pending pod is bound to the node of its required node
  affinity (``spec.nodeName``);
* **kubelet**: the container's command runs as a local process with the
  container's environment (``value``, downward-API ``fieldRef`` for
  ``status.podIP``/``metadata.name``, ``$(VAR)`` references expanded as the
  kubelet does, and the service links ``<SVC>_SERVICE_HOST``/``_PORT`` of
  every Service in the namespace); each pod gets its own loopback address
  (``127.77.x.y``: Linux routes all of 127/8 to loopback), so every pod may bind
  the same port as on a real cluster. The pod's status follows: ``Running``
  with ``podIP`` and the ``Ready`` condition (after its ``tcpSocket``
  readiness probe answers, if it has one), then ``Succeeded``/``Failed`` with
  the exit code when the process ends. A deleted pod's process is terminated;
* **kube-proxy**: a Service's host is its (single) Ready endpoint's IP;
* **faults**: :meth:`evict` (the process is killed, the pod ``Failed`` with
  reason ``Evicted``) and :meth:`fail` (the process is killed: exit -9).

The image's environment is this machine's: ``python`` is the venv's (its
``bin`` comes first in ``PATH``), the working directory is the repository.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import kubernetes

REPO = Path(__file__).resolve().parents[3]
_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: known variables replaced, unknown references left as they are."""
    return _REF.sub(lambda m: env.get(m.group(1), m.group(0)), text)


@dataclass
class Running:
    name: str
    ip: str
    proc: subprocess.Popen
    probe_port: int | None
    ready: bool = False
    evicted: bool = False
    ended: bool = False


class TestKubelet:
    """Polls the emulator every ``poll_s`` seconds (module docstring). Use as a context manager."""

    __test__ = False  # not a pytest test class

    def __init__(self, url: str, namespace: str, log_dir: Path, poll_s: float = 0.1) -> None:
        conf = kubernetes.client.Configuration()
        conf.host = url
        self.core = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(conf))
        self.namespace, self.log_dir, self.poll_s = namespace, log_dir, poll_s
        self.pods: dict[str, Running] = {}
        self.started: list[str] = []  # every pod name ever started, in order
        self.exits: dict[str, int] = {}  # pod name → exit code of its process (-9: killed, evicted)
        self._next_ip = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="test-kubelet", daemon=True)

    def __enter__(self) -> TestKubelet:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for run in list(self.pods.values()):
            self._kill(run, grace_s=2.0)

    # ---- faults ----

    def evict(self, name: str) -> None:
        """Evict a pod: its process is killed and the pod is ``Failed`` with reason ``Evicted``."""
        with self._lock:
            run = self.pods[name]
            run.evicted = True
            self._kill(run, grace_s=0.0)

    def fail(self, name: str) -> None:
        """Kill a pod's process (SIGKILL): the pod fails with exit code -9."""
        with self._lock:
            self.pods[name].proc.send_signal(signal.SIGKILL)

    # ---- the loop ----

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._sync()
            except Exception as exc:  # the kubelet survives a bad answer; the test sees its effect
                print(f"test kubelet: {type(exc).__name__}: {exc}", file=sys.stderr)
            self._stop.wait(self.poll_s)

    def _sync(self) -> None:
        pods = {p.metadata.name: p for p in self.core.list_namespaced_pod(self.namespace).items}
        with self._lock:
            for name, run in list(self.pods.items()):
                if name not in pods:  # deleted: stop its process
                    self._kill(run, grace_s=2.0)
                    del self.pods[name]
            for name, pod in pods.items():
                phase = pod.status.phase if pod.status else None
                if name not in self.pods and phase in (None, "Pending"):
                    self._start(pod, pods)
                elif name in self.pods:
                    self._watch(self.pods[name])

    def _node_of(self, pod) -> str | None:
        if pod.spec.node_name:
            return pod.spec.node_name
        try:
            term = pod.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
            return term.node_selector_terms[0].match_fields[0].values[0]
        except (AttributeError, IndexError, TypeError):
            return None

    def _first_node(self) -> str:
        """Where the scheduler puts a pod that is not pinned: the first node by name."""
        return sorted(n.metadata.name for n in self.core.list_node().items)[0]

    def _service_env(self, pods: dict) -> dict[str, str]:
        env = {}
        for svc in self.core.list_namespaced_service(self.namespace).items:
            sel = svc.spec.selector or {}
            ready = [
                r
                for n, r in self.pods.items()
                if r.ready
                and not r.ended
                and all((pods[n].metadata.labels or {}).get(k) == v for k, v in sel.items())
                if n in pods
            ]
            if not ready or not svc.spec.ports:
                continue
            prefix = svc.metadata.name.upper().replace("-", "_")
            env[f"{prefix}_SERVICE_HOST"] = ready[0].ip
            env[f"{prefix}_SERVICE_PORT"] = str(svc.spec.ports[0].port)
        return env

    def _start(self, pod, pods: dict) -> None:
        node = self._node_of(pod) or self._first_node()
        name = pod.metadata.name
        self._next_ip += 1
        ip = f"127.77.{self._next_ip // 250}.{self._next_ip % 250 + 2}"
        c = pod.spec.containers[0]
        env = {
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
            "HOME": str(self.log_dir),
            "PYTHONUNBUFFERED": "1",
            "LANG": "C.UTF-8",
        }
        env.update(self._service_env(pods))
        for e in c.env or []:
            if e.value_from is not None and e.value_from.field_ref is not None:
                path = e.value_from.field_ref.field_path
                env[e.name] = {"status.podIP": ip, "metadata.name": name, "spec.nodeName": node}.get(path, "")
            else:
                env[e.name] = expand(e.value or "", env)
        cmd = [expand(a, env) for a in [*(c.command or []), *(c.args or [])]]
        log = open(self.log_dir / f"{name}.log", "wb")  # noqa: SIM115 (closed with the process)
        proc = subprocess.Popen(
            cmd, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        probe = (
            c.readiness_probe.tcp_socket.port if c.readiness_probe and c.readiness_probe.tcp_socket else None
        )
        self.pods[name] = Running(name, ip, proc, int(probe) if probe is not None else None)
        self.started.append(name)
        self.core.patch_namespaced_pod(name, self.namespace, {"spec": {"nodeName": node}})
        self._status(
            name,
            {
                "phase": "Running",
                "podIP": ip,
                "podIPs": [{"ip": ip}],
                "hostIP": "127.0.0.1",
                "startTime": _now(),
                "conditions": self._conds(False),
            },
        )

    def _watch(self, run: Running) -> None:
        if run.ended:
            return
        code = run.proc.poll()
        if code is not None or run.evicted:
            run.ended = True
            self.exits[run.name] = -9 if run.evicted else code
            status = {
                "phase": "Succeeded" if code == 0 and not run.evicted else "Failed",
                "conditions": self._conds(False),
                "containerStatuses": [
                    {
                        "name": "main",
                        "ready": False,
                        "restartCount": 0,
                        "image": "dl2ray",
                        "imageID": "",
                        "state": {"terminated": {"exitCode": code or 0}},
                    }
                ],
            }
            if run.evicted:
                status.update(reason="Evicted", message="The node was low on resource: memory.")
            self._status(run.name, status)
            return
        if not run.ready and (run.probe_port is None or self._probe(run.ip, run.probe_port)):
            run.ready = True
            self._status(run.name, {"conditions": self._conds(True)})

    @staticmethod
    def _probe(ip: str, port: int) -> bool:
        try:
            with socket.create_connection((ip, port), timeout=0.2):
                return True
        except OSError:
            return False

    @staticmethod
    def _conds(ready: bool) -> list[dict]:
        s = "True" if ready else "False"
        return [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": s},
            {"type": "ContainersReady", "status": s},
        ]

    def _status(self, name: str, status: dict) -> None:
        try:
            self.core.patch_namespaced_pod_status(name, self.namespace, {"status": status})
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                raise

    @staticmethod
    def _kill(run: Running, grace_s: float) -> None:
        if run.proc.poll() is not None:
            return
        try:
            os.killpg(run.proc.pid, signal.SIGTERM if grace_s > 0 else signal.SIGKILL)
            run.proc.wait(timeout=grace_s or 5)
        except subprocess.TimeoutExpired:
            os.killpg(run.proc.pid, signal.SIGKILL)
            run.proc.wait(timeout=5)
        except ProcessLookupError:
            pass
