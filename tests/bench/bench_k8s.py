"""Reconcile cost of the KubernetesBackend against the local API server (kmock's emulator over HTTP).

    .venv/bin/python tests/bench/bench_k8s.py [--jobs 100] [--workers 9] [--fresh-log-every 100] [--json]

``--jobs`` DL2Jobs of 1 PS + ``--workers`` workers each (100 x 10 = 1,000 member pods, plus one
coordinator pod per job) on 10 nodes. Five slots, each a snapshot and an apply:

1. *start*: every job gets its coordinator pod, Service and member pods;
2. *settle*: the same allocation again (the statuses take in what the start did);
   *no change*: once more, nothing changed since (target: reads only, no write);
3. *scale up*: every job +1 worker (one pod per job, then the scale call);
4. *scale down*: every job -1 worker (the scale call, then the released pod is deleted).

Printed per slot: wall seconds, the backend's API calls by verb (HTTP requests, retries included),
reads, writes, retries (calls repeated after a 429/5xx/timeout), and per-job milliseconds. What is
timed is the API side alone: the pods are set Running/Ready by an instant kubelet (no processes), and
the coordinators answer in-process (:class:`LedgerCoordinators`: a plan is whatever was last asked
for; a scale-down marks the released member pods Succeeded, as their processes would exit). One-time
work of the machine (thread pools, connections) is not separated out.

The API server is kmock's emulator in a process of its own, which by default moves its objects into a
fresh emulator every 100 requests (``--fresh-log-every``; ``0``: never): kmock walks its log of every
request served so far on each request, so without the moves each request costs about 40 µs per earlier
request and a 100-job run never ends (``tests/clusters/k8s/emulator.py``, docs/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "clusters" / "k8s"))

import kubernetes  # noqa: E402
from emulator import Emulator, node, with_uid  # noqa: E402

from clusters.agent.views import job_id_of  # noqa: E402
from clusters.k8s import objects as ko  # noqa: E402
from clusters.k8s.api import KubeApi  # noqa: E402
from clusters.k8s.backend import KubernetesBackend  # noqa: E402
from clusters.k8s.config import K8sSettings  # noqa: E402
from clusters.k8s.world import Coordinators  # noqa: E402
from dl2ray.config import load_config  # noqa: E402
from dl2ray.jobspec import JobSpec  # noqa: E402
from dl2ray.view import Allocation, Tasks  # noqa: E402
from elastic_mxnet.protocol.messages import MemberInfo, ScaleReply, StatusReply  # noqa: E402

REPO = HERE.parents[1]
NS = "default"
WRITES = ("create", "patch", "delete")


class InstantKubelet:
    """Sets every new pod Running and Ready at once (a fake IP each); ends released pods on request."""

    def __init__(self, url: str) -> None:
        conf = kubernetes.client.Configuration()
        conf.host = url
        self.core = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(conf))
        self.seen: set[str] = set()
        self.ips = 0
        self.coordinator_of: dict[str, tuple[int, int]] = {}  # address → first plan (ps, workers)
        self.to_end: list[str] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self) -> None:
        while not self.stop.is_set():
            pods = self.core.list_namespaced_pod(NS, _preload_content=False)
            for pod in json.loads(pods.data)["items"]:
                name = pod["metadata"]["name"]
                if name in self.seen:
                    continue
                self.seen.add(name)
                self.ips += 1
                ip = f"10.{self.ips // 65536}.{self.ips // 256 % 256}.{self.ips % 256}"
                cmd = pod["spec"]["containers"][0]["command"]
                if "--ps" in cmd:
                    with self.lock:
                        self.coordinator_of[f"tcp://{ip}:5555"] = (
                            int(cmd[cmd.index("--ps") + 1]),
                            int(cmd[cmd.index("--workers") + 1]),
                        )
                self.core.patch_namespaced_pod_status(
                    name,
                    NS,
                    {
                        "status": {
                            "phase": "Running",
                            "podIP": ip,
                            "conditions": [{"type": "Ready", "status": "True"}],
                        }
                    },
                )
            with self.lock:
                ending, self.to_end = self.to_end, []
            for name in ending:
                self.core.patch_namespaced_pod_status(
                    name,
                    NS,
                    {"status": {"phase": "Succeeded", "conditions": [{"type": "Ready", "status": "False"}]}},
                )
            self.stop.wait(0.2)


class LedgerCoordinators(Coordinators):
    """Coordinators that answer in-process: the plan is what was last asked for (module docstring)."""

    def __init__(self, kubelet: InstantKubelet, api: KubeApi) -> None:
        self.kubelet, self.api = kubelet, api
        self.plans: dict[str, tuple[int, int]] = {}

    def status(self, address: str) -> StatusReply | None:
        with self.kubelet.lock:
            plan = self.plans.get(address) or self.kubelet.coordinator_of.get(address)
        if plan is None:
            return None
        members = [
            MemberInfo(member_id=i, role=r, state="member", pid=i, address="", version=0)
            for i, r in enumerate(["ps"] * plan[0] + ["worker"] * plan[1])
        ]
        return StatusReply(
            state="running",
            members=members,
            plan_id=0,
            version=0,
            samples_per_s=0.0,
            epochs_done=0.0,
            last_suspension_ms=None,
            events=[],
        )

    def scale(self, address: str, ps: int, workers: int, timeout_s: float) -> ScaleReply:
        with self.kubelet.lock:
            old = self.plans.get(address) or self.kubelet.coordinator_of[address]
            self.plans[address] = (ps, workers)
        if workers < old[1] or ps < old[0]:  # the released members exit: the highest indexes here
            job = next(j for j, a in self.addresses().items() if a == address)
            pods = [p for p in self.api.pods(job) if (p.get("status") or {}).get("phase") == "Running"]
            for role, keep in (("ps", ps), ("worker", workers)):
                mine = sorted(
                    (int(p["metadata"]["labels"][ko.LABEL_INDEX]), p["metadata"]["name"])
                    for p in pods
                    if p["metadata"]["labels"][ko.LABEL_ROLE] == role
                )
                with self.kubelet.lock:
                    self.kubelet.to_end += [n for _, n in mine[keep:]]
        return ScaleReply(ok=True, reason="scaled", plan_id=1, clock=0)

    def addresses(self) -> dict[str, str]:
        return {js.name: self.backend.address(js) for js in self.backend.jobs.values()}


class ServerProcess:
    """The emulator in a process of its own (``tests/clusters/k8s/emulator.py``), so that the API server
    and the backend do not share one interpreter lock."""

    def __init__(self, fresh_log_every: int | None) -> None:
        cmd = [sys.executable, str(HERE.parent / "clusters" / "k8s" / "emulator.py")]
        if fresh_log_every:
            cmd += ["--fresh-log-every", str(fresh_log_every)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        self.url = self.proc.stdout.readline().strip()  # type: ignore[union-attr]

    def close(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)


def run(jobs: int, workers: int, separate: bool = True, fresh_log_every: int | None = 100) -> dict:
    fresh_log_every = fresh_log_every or None
    emu = ServerProcess(fresh_log_every) if separate else Emulator(fresh_log_every)
    try:
        conf = kubernetes.client.Configuration()
        conf.host = emu.url
        core = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(conf))
        custom = kubernetes.client.CustomObjectsApi(kubernetes.client.ApiClient(conf))
        for i in range(10):
            core.create_node(node(f"node-{i}", cpu="64", memory="256Gi"))
        spec0 = {
            "job_type": "resnext-110",
            "epochs": 10,
            "worker": {"cpu": 0.25, "gpu": 0, "mem": 0.25},
            "ps": {"cpu": 0.25, "gpu": 0, "mem": 0.25},
            "workers": {"min": 1, "max": workers + 1},
            "ps_count": {"min": 1, "max": 1},
        }
        for j in range(jobs):
            spec = JobSpec.model_validate({"name": f"job-{j:03d}", **spec0})
            custom.create_namespaced_custom_object(
                ko.GROUP, ko.VERSION, NS, ko.PLURAL, with_uid(ko.dl2job(spec, NS))
            )
        kubelet = InstantKubelet(emu.url)
        settings = K8sSettings.model_validate(
            {
                "namespace": NS,
                "slot_seconds": 10,
                "parallel_jobs": 8,
                "pods": {"ready_timeout_s": 300, "release_timeout_s": 60},
            }
        )
        conf.retries = False
        api = KubeApi(kubernetes.client.ApiClient(conf), settings.api, NS)
        t_fixed = 1_800_000_000.0  # one slot throughout: "no change" means no new slot either
        # The stand-in coordinators read pods through a client of their own: real coordinators do not
        # call the API server, so these reads are not counted as the backend's.
        ledger = LedgerCoordinators(kubelet, KubeApi(kubernetes.client.ApiClient(conf), settings.api, NS))
        backend = KubernetesBackend(
            api,
            settings,
            load_config(REPO / "configs" / "testbed.yaml").catalogue,
            clock=lambda: t_fixed,
            coordinators=ledger,
        )
        ledger.backend = backend
        ids = [job_id_of(f"job-{j:03d}") for j in range(jobs)]
        rows = []
        for name, w in (
            ("start", workers),
            ("settle", workers),
            ("no change", workers),
            ("scale up", workers + 1),
            ("scale down", workers),
        ):
            before, retried = dict(api.calls), sum(api.retries.values())
            t0 = time.perf_counter()
            backend.snapshot()
            t1 = time.perf_counter()
            report = backend.apply(Allocation({i: Tasks(workers=w, ps=1) for i in ids}))
            t2 = time.perf_counter()
            calls = {k: v - before.get(k, 0) for k, v in api.calls.items() if v - before.get(k, 0)}
            assert not report.errors, report.errors[:3]
            rows.append(
                {
                    "slot": name,
                    "wall_s": round(t2 - t0, 2),
                    "snapshot_s": round(t1 - t0, 2),
                    "apply_s": round(t2 - t1, 2),
                    "actions": len(report.actions),
                    "calls": calls,
                    "reads": sum(v for k, v in calls.items() if k not in WRITES),
                    "writes": sum(v for k, v in calls.items() if k in WRITES),
                    "retries": sum(api.retries.values()) - retried,
                    "per_job_ms": round((t2 - t0) / jobs * 1e3, 1),
                }
            )
        pods = core.list_namespaced_pod(NS, _preload_content=False)
        n_members = sum(
            1
            for p in json.loads(pods.data)["items"]
            if p["metadata"]["labels"].get(ko.LABEL_ROLE) in ko.ROLES
            and (p.get("status") or {}).get("phase") == "Running"
        )
        kubelet.stop.set()
        kubelet.thread.join(timeout=30)  # before the server goes: no listing left half-way
        backend.close()
        return {
            "benchmark": "k8s reconcile",
            "api_server": "kmock emulator, "
            + ("own process" if separate else "thread of this process")
            + (f", fresh log every {fresh_log_every} requests" if fresh_log_every else ", one log"),
            "jobs": jobs,
            "member_pods_running": n_members,
            "coordinator_pods": jobs,
            "nodes": 10,
            "parallel_jobs": settings.parallel_jobs,
            "slots": rows,
        }
    finally:
        emu.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=100)
    p.add_argument("--workers", type=int, default=9, help="workers per job (plus 1 PS)")
    p.add_argument("--in-process", action="store_true", help="the API server in a thread of this process")
    p.add_argument(
        "--fresh-log-every",
        type=int,
        default=100,
        metavar="N",
        help="the emulator moves its objects into a fresh one every N requests (0: never; see module doc)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = p.parse_args(argv)
    doc = run(args.jobs, args.workers, separate=not args.in_process, fresh_log_every=args.fresh_log_every)
    print(json.dumps(doc) if args.json else json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
