"""What co-location is worth for real elastic MXNet PS training, against the simulator's placement factor.

    sudo .venv/bin/python tests/bench/bench_colocation.py --json > colocation.json       # full run, ~23 min
    sudo .venv/bin/python tests/bench/bench_colocation.py --json --quick                  # ~40 s
    .venv/bin/python tests/bench/bench_colocation.py --fit colocation.json --out configs/speed/placement.json
    .venv/bin/python tests/bench/bench_colocation.py --evaluate colocation.json \
        --calibration configs/speed/placement.json                                        # the table again

(``sudo``: root is needed for namespaces and ``tc``; ``--fit`` and ``--evaluate`` need neither.)

**Testbed.** Emulated nodes are Linux network namespaces ``<prefix>-n<i>`` joined to a switch namespace
``<prefix>-sw`` (a bridge) by veth pairs created directly inside the namespaces (nothing is added to the
host's own namespace; MTU 9000). Every node link is rate-limited *per direction* — a ``tbf`` qdisc on the
node's ``eth0`` (upload) and one on the switch-side end (download), 20 ms of queue, 64 KB burst — to a
catalogue type's ``bw_inter_mbps``: a full-duplex NIC, as Linux gives it. Inside a node, tasks reach each
other on that namespace's loopback (a PS binds its node's address, which the kernel routes over ``lo``),
limited by one ``tbf`` on ``lo`` to the type's ``bw_intra_mbps`` — one queue for both directions, since
loopback traffic leaves and enters through the same device. The coordinator (control traffic only) runs
in ``<prefix>-ctl`` behind an unlimited switch port. The prefix is ``dlco<pid>``; everything is removed
in ``finally``, on SIGINT and SIGTERM, and namespaces of an earlier run whose process is gone (with any
process still inside them) are removed at start.

**Jobs.** ``python -m elastic_mxnet.server --host <node address>`` PS and ``python -m
elastic_mxnet.demo_train --model mlp-params --params N`` workers (global batch 32, one OMP thread each,
no PS snapshots), each started with ``ip netns exec <node>`` by the :class:`NetnsSpawner` of a
coordinator that runs in the control namespace (this script re-run with ``--helper``). Per catalogue
rate, model size, ``(PS, workers)`` shape and layout (:func:`plan_layouts`: every task on its own node —
the *spread* reference —, all on one node, a PS with a worker on each of ``min(p, w)`` nodes, Optimus's
even spread, workers on one node and PS on another), one job runs ``--warmup`` iterations, then
``--windows`` windows of at least ``--window-s`` seconds and two iterations each. Speed = iterations/s of
the coordinator's ``version`` (updates every PS applied, timed at each change it sees), the median over
the windows (and over ``--rounds`` runs). ``/proc/loadavg`` is recorded at the start and the end of
every window set. All processes share this machine's cores whatever the layout: only the network is
emulated.

**Factors with the testbed's own constants.** ``model_mb`` = parameters × 4 bytes / 1e6; ``bw_inter``
= the tc rate (MB/s, 1 MB = 1e6 bytes); ``bw_intra`` = the loopback rate set; ``compute_s`` = the seconds
per iteration of a ``compute`` run (all tasks on one node, loopback at ``COMPUTE_LOOPBACK_MBPS`` = 500
MB/s, several times the catalogue's intra-node rates, so communication is a small, known part) less its
loopback bytes ``2·(M/p)·w·p`` at that rate. Then ``model factor = t(spread) / t(layout)`` with ``t =
compute_s + comm``, ``comm`` from :class:`dl2ray.speed.PlacementModel` — the analytic model, and with
``--calibration`` the calibrated one too; ``measured factor = speed(layout) / speed(spread)``; ``ratio =
measured / model``. Probes (one ZeroMQ stream across two links, one over a node's loopback at each
loopback setting) are recorded with each rate as a check of the emulation.

``--json`` prints exactly one JSON object on stdout (progress on stderr). ``--fit FILE...`` fits the
calibrated model's parameters to result files (:func:`dl2ray.speed.fit_placement`, scipy) and writes
them with the command (``--out``).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the helpers run inside the namespaces import elastic_mxnet only
    from dl2ray.speed import Layout, PlacementModel

NS_PATTERN = re.compile(r"^dlco(\d+)-")
"""Namespaces this benchmark creates: ``dlco<pid of the run>-<role>``."""
SUBNET = "10.213.0"
CTL_HOST = 254
MTU = 9000
TBF_BURST = "64kb"
"""Bytes a link may pass at once after idling: small (a 1 M model's phase moves 2-8 MB), ≥ 7 jumbo frames."""
LO_BURST = "128kb"
"""The loopback's: above its 64 KiB packets (a packet larger than the burst is dropped, not delayed)."""
TBF_LATENCY = "20ms"
"""Longest a packet may queue in a limit: ~1.8 MB at 91.875 MB/s, a switch port's buffer, not a bloat."""
COMPUTE_LOOPBACK_MBPS = 500.0
"""Loopback rate of the ``compute`` run: well above the catalogue's intra-node rates used here, well below
what one stream reaches on this machine's loopback (~1500 MB/s), so the qdisc, not the CPU, sets it."""
GLOBAL_BATCH = 32
SAMPLES = 256
BYTES_PER_PARAM = 4

CATALOGUE_RATES: dict[str, tuple[float, float]] = {
    # name: (bw_inter_mbps, bw_intra_mbps), MB/s, from configs/jobtypes.yaml
    "resnet-50": (91.875, 306.5),
    "cnn-text-classification": (60.75, 159.625),
    "seq2seq": (120.125, 181.125),
    "vgg-16": (233.0, 427.75),
    "dssm": (92.125, 65.625),
}


def log(msg: str) -> None:
    print(f"[colocation {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- layouts (pure) ------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayoutPlan:
    """Where the tasks of one job go: the emulated node (index) of every PS and of every worker."""

    name: str
    ps_nodes: tuple[int, ...]
    worker_nodes: tuple[int, ...]

    @property
    def layout(self) -> Layout:
        """The simulator's layout: sorted (workers, PS) per node used."""
        from dl2ray.speed import layout_of

        return layout_of(self.worker_nodes, self.ps_nodes)

    @property
    def nodes(self) -> int:
        """Emulated nodes this plan needs (indices 0 .. nodes - 1)."""
        return max(self.ps_nodes + self.worker_nodes) + 1


def plan_layouts(ps: int, workers: int) -> list[LayoutPlan]:
    """The layouts measured for one shape, distinct by :attr:`LayoutPlan.layout`, ``spread`` first.

    - ``spread``: every task on its own node (the reference: the testbed measurements' setting);
    - ``one-node``: every task on node 0 (packing);
    - ``ps+worker``: PS ``i`` and worker ``i`` share node ``i`` for ``i < min(p, w)``, the other tasks
      alone (load balancing on an empty cluster whose nodes hold a PS and a worker each);
    - ``even``: Optimus's principle, the PS and workers spread evenly over ``min(p, w)`` nodes
      (PS ``i`` and workers ``i, i + p, ...`` on node ``i``);
    - ``split``: all workers on node 0, all PS on node 1.
    """
    if ps < 1 or workers < 1:
        raise ValueError("a job needs at least one PS and one worker")
    k = min(ps, workers)
    cands = [
        LayoutPlan("spread", tuple(range(ps)), tuple(range(ps, ps + workers))),
        LayoutPlan("one-node", (0,) * ps, (0,) * workers),
        LayoutPlan(
            "ps+worker",
            tuple(range(ps)),
            tuple(i if i < k else ps + i - k for i in range(workers)),
        ),
        LayoutPlan("even", tuple(i % k for i in range(ps)), tuple(i % k for i in range(workers))),
        LayoutPlan("split", (1,) * ps, (0,) * workers),
    ]
    out: list[LayoutPlan] = []
    for plan in cands:
        if plan.layout not in {o.layout for o in out}:
            out.append(plan)
    return out


def compute_plan(ps: int, workers: int) -> LayoutPlan:
    """The ``compute`` run: every task on node 0 (run with an unlimited loopback)."""
    return LayoutPlan("compute", (0,) * ps, (0,) * workers)


def intra_bytes_mb(layout: Layout, model_mb: float) -> float:
    """MB crossing the busiest node's loopback per iteration: ``2 (M / p) w_n p_n`` (push and pull)."""
    p = sum(n[1] for n in layout)
    return max(2.0 * model_mb / p * wn * pn for wn, pn in layout)


def compute_seconds(iteration_s: float, layout: Layout, model_mb: float, loopback_mbps: float) -> float:
    """``compute_s`` of the module docstring: the ``compute`` run's seconds per iteration less its loopback
    bytes at the loopback's rate ``loopback_mbps`` (kept at ≥ 5 % of the iteration)."""
    return max(iteration_s - intra_bytes_mb(layout, model_mb) / loopback_mbps, 0.05 * iteration_s)


def placement_factor(model: PlacementModel, layout: Layout, compute_s: float, model_mb: float,
                     bw_inter: float, bw_intra: float) -> float:
    """``t(spread) / t(layout)`` with ``t = compute_s + model.comm_time(...)`` (the testbed's constants)."""
    from dl2ray.speed import spread_layout

    w, p = sum(n[0] for n in layout), sum(n[1] for n in layout)
    ref = spread_layout(w, p)
    return (compute_s + model.comm_time(ref, model_mb, bw_inter, bw_intra)) / (
        compute_s + model.comm_time(layout, model_mb, bw_inter, bw_intra))


def evaluate(rows: list[dict], calibration: PlacementModel | None) -> list[dict]:
    """``rows`` with their analytic (and, given a calibration, calibrated) factors and ratios set."""
    from dl2ray.speed import ANALYTIC_PLACEMENT

    out = []
    for r in rows:
        lay = tuple(tuple(n) for n in r["layout"])
        consts = (r["compute_s"], r["model_mb"], r["bw_inter_mbps"], r["bw_intra_mbps"])
        a = placement_factor(ANALYTIC_PLACEMENT, lay, *consts)  # type: ignore[arg-type]
        row = {**r, "analytic_factor": round(a, 4), "ratio": round(r["measured_factor"] / a, 4),
               "calibrated_factor": None, "calibrated_ratio": None}
        if calibration is not None:
            c = placement_factor(calibration, lay, *consts)  # type: ignore[arg-type]
            row.update(calibrated_factor=round(c, 4), calibrated_ratio=round(r["measured_factor"] / c, 4))
        out.append(row)
    return out


# -- the emulated testbed (commands pure, running them is not) ------------------------------------


@dataclass(frozen=True)
class Topology:
    """``nodes`` emulated nodes, a switch and a control namespace; per-direction link limits.

    Rates in MB/s (1e6 bytes); tc is given bits (``rate × 8`` mbit). ``intra_mbps`` None: no limit on
    the nodes' loopback.
    """

    prefix: str
    nodes: int
    inter_mbps: float

    def node_ns(self, i: int) -> str:
        return f"{self.prefix}-n{i}"

    @property
    def switch_ns(self) -> str:
        return f"{self.prefix}-sw"

    @property
    def ctl_ns(self) -> str:
        return f"{self.prefix}-ctl"

    @property
    def namespaces(self) -> list[str]:
        return [self.switch_ns, self.ctl_ns] + [self.node_ns(i) for i in range(self.nodes)]

    @staticmethod
    def node_ip(i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    @property
    def ctl_ip(self) -> str:
        return f"{SUBNET}.{CTL_HOST}"


def _tbf(ns: str, dev: str, mbps: float, burst: str = TBF_BURST) -> list[str]:
    rate = f"{mbps * 8:.3f}mbit"
    return ["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
            "burst", burst, "latency", TBF_LATENCY]


def setup_commands(topo: Topology) -> list[list[str]]:
    """``ip``/``tc`` argv lists that build the testbed (run in order, as root)."""
    sw = topo.switch_ns
    cmds = [["ip", "netns", "add", ns] for ns in topo.namespaces]
    cmds += [
        ["ip", "-n", sw, "link", "add", "br0", "mtu", str(MTU), "type", "bridge"],
        ["ip", "-n", sw, "link", "set", "br0", "up"],
    ]
    ends = [(topo.ctl_ns, "ctl", topo.ctl_ip)] + [
        (topo.node_ns(i), f"n{i}", topo.node_ip(i)) for i in range(topo.nodes)
    ]
    for ns, port, ip in ends:
        cmds += [
            ["ip", "link", "add", "eth0", "netns", ns, "mtu", str(MTU), "type", "veth",
             "peer", "name", port, "netns", sw, "mtu", str(MTU)],
            ["ip", "-n", sw, "link", "set", port, "master", "br0"],
            ["ip", "-n", sw, "link", "set", port, "up"],
            ["ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0"],
            ["ip", "-n", ns, "link", "set", "eth0", "up"],
            ["ip", "-n", ns, "link", "set", "lo", "up"],
        ]
        if port != "ctl":  # the node's NIC: each direction limited
            cmds += [_tbf(ns, "eth0", topo.inter_mbps), _tbf(sw, port, topo.inter_mbps)]
    return cmds


def loopback_commands(topo: Topology, intra_mbps: float | None) -> list[list[str]]:
    """Set (or, with None, remove) the loopback limit of every node."""
    if intra_mbps is None:
        return [["tc", "-n", topo.node_ns(i), "qdisc", "del", "dev", "lo", "root"] for i in range(topo.nodes)]
    return [_tbf(topo.node_ns(i), "lo", intra_mbps, LO_BURST) for i in range(topo.nodes)]


def stale_namespaces(names: Sequence[str], alive: Any = None) -> list[str]:
    """Namespaces of this benchmark whose run (the pid in the name) is no longer alive."""
    alive = alive or _pid_alive
    return [n for n in names if (m := NS_PATTERN.match(n)) and not alive(int(m.group(1)))]


def _pid_alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def list_namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def remove_namespaces(names: Sequence[str]) -> None:
    """Kill every process inside each namespace, then delete it (errors ignored: best effort)."""
    for ns in names:
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
    for ns in names:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _run_all(cmds: list[list[str]], check: bool = True) -> None:
    for cmd in cmds:
        r = subprocess.run(cmd, capture_output=True, text=True)
        if check and r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {r.stderr.strip()}")


@contextlib.contextmanager
def testbed(nodes: int, inter_mbps: float) -> Iterator[Topology]:
    """Build the namespaces and links; remove them on exit (also on errors and signals)."""
    stale = stale_namespaces(list_namespaces())
    if stale:
        log(f"removing {len(stale)} namespaces left by an earlier run: {' '.join(stale)}")
        remove_namespaces(stale)
    topo = Topology(f"dlco{os.getpid()}", nodes, inter_mbps)
    try:
        _run_all(setup_commands(topo))
        yield topo
    finally:
        remove_namespaces([ns for ns in topo.namespaces if ns in set(list_namespaces())])


# -- helpers run inside the namespaces -----------------------------------------------------------


@dataclass
class NetnsSpawner:
    """An :class:`elastic_mxnet.coordination.spawner.Spawner` that starts each member in its emulated node.

    ``ps_slots`` / ``worker_slots``: (namespace, address) of the next PS / worker to start, in order.
    A PS binds its node's address, so traffic to it from another node crosses both nodes' links and
    traffic from its own node stays on that node's loopback.
    """

    worker_args: list[str]
    ps_slots: list[tuple[str, str]]
    worker_slots: list[tuple[str, str]]
    env: dict[str, str]
    children: list[subprocess.Popen] = field(default_factory=list)
    closed: bool = False

    def spawn(self, role: str, coordinator: str) -> None:
        if self.closed:
            return
        slots = self.ps_slots if role == "ps" else self.worker_slots
        if not slots:
            raise RuntimeError(f"no emulated node left for another {role}")
        ns, ip = slots.pop(0)
        member = (["-m", "elastic_mxnet.server", "--host", ip] if role == "ps" else self.worker_args)
        env = {**self.env, "ELASTIC_MXNET_COORDINATOR": coordinator}
        self.children.append(
            subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, *member], env=env,
                             stdout=subprocess.DEVNULL, stderr=sys.stderr)
        )

    def close(self) -> None:
        self.closed = True
        for child in self.children:
            with contextlib.suppress(ProcessLookupError):
                child.kill()
        for child in self.children:
            child.wait()


def window_rates(seen: list[tuple[float, int]], windows: int) -> list[float]:
    """Iterations/s of ``windows`` consecutive windows, equal in iterations, through the seen changes.

    ``seen``: (seconds, version) at each version change observed, in order. Window ``j`` runs from the
    first observation at or past its start version to the first at or past its end version.
    """
    v0, v1 = seen[0][1], seen[-1][1]
    bounds = [v0 + (v1 - v0) * j / windows for j in range(windows + 1)]
    points = [next(pt for pt in seen if pt[1] >= b) for b in bounds]
    return [
        (b[1] - a[1]) / (b[0] - a[0]) for a, b in itertools.pairwise(points) if b[0] > a[0]
    ]


def _measure(spec: dict, job: Any) -> tuple[list[tuple[float, int]], list[list[float]]]:
    """Wait for the warm-up, then record version changes until the windows are complete."""
    deadline = time.monotonic() + spec["timeout_s"]
    poll = 0.02
    seen: list[tuple[float, int]] = []
    loads = [list(os.getloadavg())]
    start_version: int | None = None
    while time.monotonic() < deadline:
        st = job.status(timeout_s=30)
        now = time.monotonic()
        if st.state == "running":
            if start_version is None:
                start_version = st.version + spec["warmup"]
            elif st.version >= start_version and (not seen or st.version > seen[-1][1]):
                seen.append((now, st.version))
        elif st.state in ("done", "failed"):
            raise RuntimeError(f"job ended ({st.state}) before the measurement")
        if len(seen) >= 2:
            span, iters = seen[-1][0] - seen[0][0], seen[-1][1] - seen[0][1]
            if span >= spec["windows"] * spec["window_s"] and iters >= 2 * spec["windows"]:
                loads.append(list(os.getloadavg()))
                return seen, loads
        time.sleep(poll)
    raise TimeoutError(f"measurement not complete within {spec['timeout_s']} s ({len(seen)} changes seen)")


def helper_job(spec: dict) -> dict:
    """Run one job (inside the control namespace) and measure it; see the module docstring."""
    from elastic_mxnet.config import JobConfig, Limits, Liveness, Sharding
    from elastic_mxnet.coordination.coordinator import Coordinator
    from elastic_mxnet.job import ElasticJob

    env = {**os.environ, "OMP_NUM_THREADS": "1", "MXNET_CPU_WORKER_NTHREADS": "1"}
    spawner = NetnsSpawner(spec["worker_args"], [tuple(s) for s in spec["ps_slots"]],
                           [tuple(s) for s in spec["worker_slots"]], env)
    config = JobConfig(
        host=spec["host"],
        initial_ps=len(spec["ps_slots"]),
        initial_workers=len(spec["worker_slots"]),
        liveness=Liveness(heartbeat_interval_s=0.05, heartbeat_timeout_s=30.0, orphan_timeout_s=30.0),
        limits=Limits(max_ps=16, max_workers=16, register_timeout_s=120.0),
        sharding=Sharding(snapshot_every=1_000_000),  # no periodic snapshot writes during the windows
    )
    coordinator = Coordinator(config, spawner)
    threading.Thread(target=coordinator.serve, daemon=True).start()
    job = ElasticJob(coordinator.address, timeout_s=30)
    t0 = time.monotonic()
    try:
        seen, loads = _measure(spec, job)
    finally:
        spawner.close()
        shutil.rmtree(coordinator.snapshot_dir, ignore_errors=True)
    rates = window_rates(seen, spec["windows"])
    return {
        "iterations_per_s": statistics.median(rates),
        "window_rates": rates,
        "iterations": seen[-1][1] - seen[0][1],
        "seconds": seen[-1][0] - seen[0][0],
        "wall_s": time.monotonic() - t0,
        "loadavg": loads,
    }


def helper_probe(spec: dict) -> dict:
    """One side of a throughput probe: ``recv`` binds and times ``count`` messages, ``send`` sends them."""
    import numpy as np
    import zmq

    ctx = zmq.Context()
    if spec["side"] == "recv":
        sock = ctx.socket(zmq.PULL)
        sock.bind(spec["address"])
        sock.recv()  # the sender is connected
        t0, total = time.perf_counter(), 0
        for _ in range(spec["count"]):
            total += len(sock.recv(copy=False).buffer)
        dt = time.perf_counter() - t0
        return {"mbps": total / dt / 1e6, "seconds": dt}
    sock = ctx.socket(zmq.PUSH)
    sock.connect(spec["address"])
    payload = np.ones(spec["mb"] * 250_000, np.float32).tobytes()
    sock.send(b"go")
    for _ in range(spec["count"]):
        sock.send(payload, copy=False)
    sock.close(linger=-1)
    ctx.term()
    return {}


def _helper_cmd(ns: str, spec: dict) -> list[str]:
    return ["ip", "netns", "exec", ns, sys.executable, str(Path(__file__).resolve()), "--helper",
            json.dumps(spec)]


def _run_helper(ns: str, spec: dict, timeout_s: float) -> dict:
    proc = subprocess.Popen(_helper_cmd(ns, spec), stdout=subprocess.PIPE, stderr=sys.stderr, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    if proc.returncode != 0:
        raise RuntimeError(f"helper in {ns} exited {proc.returncode}")
    return json.loads(out.strip().splitlines()[-1])


def probe(topo: Topology, mb: int = 8, count: int = 6) -> dict:
    """Payload MB/s of one ZeroMQ stream node 0 → node 1 (across two links) and on node 0's loopback."""
    out = {}
    for name, dst_ns, ip, port in (("link", topo.node_ns(1), topo.node_ip(1), 47001),
                                   ("loopback", topo.node_ns(0), topo.node_ip(0), 47002)):
        addr = f"tcp://{ip}:{port}"
        recv = subprocess.Popen(_helper_cmd(dst_ns, {"kind": "probe", "side": "recv", "address": addr,
                                                     "count": count}),
                                stdout=subprocess.PIPE, text=True, start_new_session=True)
        try:
            time.sleep(0.5)
            _run_helper(topo.node_ns(0), {"kind": "probe", "side": "send", "address": addr, "mb": mb,
                                          "count": count}, 120)
            res, _ = recv.communicate(timeout=120)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(recv.pid, signal.SIGKILL)
            recv.wait()
        out[name] = round(json.loads(res.strip().splitlines()[-1])["mbps"], 2)
    return out


# -- the benchmark --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """What to measure: per catalogue rate, the model sizes (parameters); every size at every shape."""

    grid: tuple[tuple[str, tuple[int, ...]], ...]
    shapes: tuple[tuple[int, int], ...]
    warmup: int
    windows: int
    window_s: float
    rounds: int
    job_timeout_s: float


FULL = Settings(grid=(("resnet-50", (1_000_000, 5_000_000, 25_000_000)), ("dssm", (5_000_000,))),
                shapes=((1, 1), (1, 2), (2, 2), (2, 4)), warmup=2, windows=3, window_s=2.0, rounds=1,
                job_timeout_s=300)
QUICK = Settings(grid=(("resnet-50", (200_000,)),), shapes=((1, 2),), warmup=2, windows=2, window_s=0.5,
                 rounds=1, job_timeout_s=120)


def _worker_args(params: int) -> list[str]:
    return ["-m", "elastic_mxnet.demo_train", "--model", "mlp-params", "--params", str(params),
            "--iterations", "0", "--global-batch", str(GLOBAL_BATCH), "--samples", str(SAMPLES)]


def run_layout(topo: Topology, plan: LayoutPlan, params: int, s: Settings) -> dict:
    spec = {
        "kind": "job",
        "host": topo.ctl_ip,
        "ps_slots": [(topo.node_ns(n), topo.node_ip(n)) for n in plan.ps_nodes],
        "worker_slots": [(topo.node_ns(n), topo.node_ip(n)) for n in plan.worker_nodes],
        "worker_args": _worker_args(params),
        "warmup": s.warmup,
        "windows": s.windows,
        "window_s": s.window_s,
        "timeout_s": s.job_timeout_s,
    }
    return _run_helper(topo.ctl_ns, spec, s.job_timeout_s + 60)


def actual_params(params: int) -> int:
    """Parameters of ``mlp-params`` sized for ``params`` (the width is rounded), without MXNet."""
    from elastic_mxnet.training.models import mlp_hidden_for

    in_units, classes = 32, 10
    h = mlp_hidden_for(params, in_units, classes)
    return in_units * h + h + h * h + h + h * classes + classes


def measure_shape(topo: Topology, rate: str, params: int, shape: tuple[int, int], s: Settings) -> list[dict]:
    """Rows of one (rate, size, shape): the compute run, then every layout ``s.rounds`` times."""
    ps, workers = shape
    inter, intra = CATALOGUE_RATES[rate]
    n_params = actual_params(params)
    model_mb = n_params * BYTES_PER_PARAM / 1e6
    _run_all(loopback_commands(topo, COMPUTE_LOOPBACK_MBPS))
    free = run_layout(topo, compute_plan(ps, workers), params, s)
    one = compute_plan(ps, workers).layout
    compute_s = compute_seconds(1.0 / free["iterations_per_s"], one, model_mb, COMPUTE_LOOPBACK_MBPS)
    log(f"{rate} {params} {ps}x{workers}: compute run {1 / free['iterations_per_s']:.3f} s/it "
        f"-> compute_s {compute_s:.3f}")
    _run_all(loopback_commands(topo, intra))
    plans = plan_layouts(ps, workers)
    runs: dict[str, list[dict]] = {p.name: [] for p in plans}
    for _ in range(s.rounds):
        for plan in plans:
            runs[plan.name].append(run_layout(topo, plan, params, s))
            r = runs[plan.name][-1]
            log(f"{rate} {params} {ps}x{workers} {plan.name} {list(plan.layout)}: "
                f"{r['iterations_per_s']:.3f} it/s (load {r['loadavg'][0][0]:.2f})")
    speed = {name: statistics.median(r["iterations_per_s"] for r in rs) for name, rs in runs.items()}
    return [
        {
            "rate": rate, "bw_inter_mbps": inter, "bw_intra_mbps": intra,
            "params": params, "actual_params": n_params, "model_mb": round(model_mb, 4),
            "ps": ps, "workers": workers, "layout_name": plan.name, "layout": [list(n) for n in plan.layout],
            "compute_s": round(compute_s, 5), "compute_run": free,
            "iterations_per_s": round(speed[plan.name], 5),
            "measured_factor": round(speed[plan.name] / speed["spread"], 4),
            "runs": runs[plan.name],
        }
        for plan in plans
    ]


def run(s: Settings, calibration: PlacementModel | None) -> dict:
    """Every measurement of ``s``; the JSON document ``--json`` prints."""
    from clusters.profile_live import machine

    nodes = max(2, max(p + w for p, w in s.shapes))
    t0 = time.monotonic()
    rows: list[dict] = []
    rates_info = []
    for rate, sizes in s.grid:
        inter, intra = CATALOGUE_RATES[rate]
        with testbed(nodes, inter) as topo:
            _run_all(loopback_commands(topo, intra))
            limited = probe(topo)
            _run_all(loopback_commands(topo, COMPUTE_LOOPBACK_MBPS))
            fast = probe(topo)
            _run_all(loopback_commands(topo, None), check=False)
            free = probe(topo)
            rates_info.append({"rate": rate, "bw_inter_mbps": inter, "bw_intra_mbps": intra,
                               "probe_mbps": {"link": limited["link"], "loopback": limited["loopback"],
                                              "loopback_compute_run": fast["loopback"],
                                              "loopback_unlimited": free["loopback"]}})
            log(f"{rate}: tc {inter} / {intra} MB/s; probe {rates_info[-1]['probe_mbps']}")
            for params in sizes:
                for shape in s.shapes:
                    rows += measure_shape(topo, rate, params, shape, s)
    return {
        "bench": "colocation",
        "command": " ".join(["tests/bench/bench_colocation.py", *sys.argv[1:]]),
        "machine": machine(),
        "settings": {**asdict(s), "global_batch": GLOBAL_BATCH, "mtu": MTU, "tbf_burst": TBF_BURST,
                     "lo_burst": LO_BURST, "tbf_latency": TBF_LATENCY,
                     "compute_loopback_mbps": COMPUTE_LOOPBACK_MBPS},
        "calibration": None if calibration is None else asdict(calibration),
        "rates": rates_info,
        "results": evaluate(rows, calibration),
        "wall_s": round(time.monotonic() - t0, 1),
        "namespaces_left": [n for n in list_namespaces() if n.startswith(f"dlco{os.getpid()}-")],
    }


def summary_table(rows: list[dict]) -> str:
    """A Markdown table of the rows: measured and model factors and their ratios."""
    lines = ["| rate | params | PS×W | layout | measured | analytic | ratio | calibrated | ratio |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cal = ("—", "—") if r["calibrated_factor"] is None else (
            f"{r['calibrated_factor']:.3f}", f"**{r['calibrated_ratio']:.3f}**")
        lines.append(
            f"| {r['rate']} | {r['params'] / 1e6:g} M | {r['ps']}×{r['workers']} | {r['layout_name']} "
            f"{'+'.join(f'{w}w{p}p' for w, p in r['layout'])} | {r['measured_factor']:.3f} | "
            f"{r['analytic_factor']:.3f} | {r['ratio']:.3f} | {cal[0]} | {cal[1]} |")
    return "\n".join(lines)


def _parse_shapes(text: str) -> tuple[tuple[int, int], ...]:
    out = []
    for item in text.split(","):
        p, w = item.lower().split("x")
        out.append((int(p), int(w)))
    return tuple(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench_colocation.py", description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--quick", action="store_true", help="one small model, one shape, short windows")
    p.add_argument("--sizes", help="comma-separated parameter counts, at every rate (default: 1M, 5M and "
                                    "25M at resnet-50's bandwidths, 5M at dssm's)")
    p.add_argument("--shapes", help="comma-separated PSxWORKERS (default 1x1,1x2,2x2,2x4)")
    p.add_argument("--rates", help=f"comma-separated catalogue types whose bandwidths to emulate "
                                    f"({', '.join(CATALOGUE_RATES)}; default resnet-50,dssm)")
    p.add_argument("--rounds", type=int, help="runs per layout (median)")
    p.add_argument("--windows", type=int, help="windows per run (median)")
    p.add_argument("--window-s", type=float, help="least seconds per window")
    p.add_argument("--calibration", type=Path, default=None,
                   help="placement calibration JSON: also report calibrated factors")
    p.add_argument("--fit", type=Path, nargs="+", help="fit the calibration to these result files")
    p.add_argument("--evaluate", type=Path, nargs="+",
                   help="print the factors of these result files again (with --calibration: calibrated too)")
    p.add_argument("--out", type=Path, help="with --fit: where to write the calibration")
    p.add_argument("--helper", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.helper:
        spec = json.loads(args.helper)
        out = helper_job(spec) if spec["kind"] == "job" else helper_probe(spec)
        print(json.dumps(out), flush=True)
        os._exit(0)  # the coordinator's thread is a daemon mid-poll: do not wait for it
    if args.fit:
        return fit_command(args.fit, args.out)
    if args.evaluate:
        return evaluate_command(args.evaluate, args.calibration, args.json)
    s = QUICK if args.quick else FULL
    try:
        rates = args.rates.split(",") if args.rates else [r for r, _ in s.grid]
        sizes = [tuple(int(x) for x in args.sizes.split(","))] * len(rates) if args.sizes else (
            [dict(s.grid).get(r, s.grid[0][1]) for r in rates])
        s = Settings(
            grid=tuple(zip(rates, sizes, strict=True)),
            shapes=_parse_shapes(args.shapes) if args.shapes else s.shapes,
            warmup=s.warmup, windows=args.windows or s.windows, window_s=args.window_s or s.window_s,
            rounds=args.rounds or s.rounds, job_timeout_s=s.job_timeout_s,
        )
    except ValueError as exc:
        p.error(f"bad --sizes/--shapes: {exc}")
    if any(r not in CATALOGUE_RATES for r, _ in s.grid):
        p.error(f"--rates must name some of {', '.join(CATALOGUE_RATES)}")
    if any(ps < 1 or w < 1 for ps, w in s.shapes) or min(min(z) for _, z in s.grid) < 1000:
        p.error("shapes need >= 1 PS and worker; sizes >= 1000")
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
        print("error: needs root and the ip and tc commands (network namespaces)", file=sys.stderr)
        return 2
    calibration = _load(args.calibration)
    from clusters.profile_live import terminate_raises

    with terminate_raises():  # SIGTERM (and SIGINT, as usual) raise, so ``finally`` removes the testbed
        result = run(s, calibration)
    if args.json:
        print(json.dumps(result))
    else:
        print(summary_table(result["results"]))
    return 0


def _load(path: Path | None) -> PlacementModel | None:
    from dl2ray.speed import load_placement

    return load_placement(path) if path else None


def evaluate_command(paths: list[Path], calibration: Path | None, as_json: bool) -> int:
    """Re-evaluate result files' factors (with a calibration, if given); print a table or the rows."""
    cal = _load(calibration)
    rows = evaluate([r for path in paths for r in json.loads(path.read_text())["results"]], cal)
    if as_json:
        print(json.dumps({"calibration": None if cal is None else asdict(cal), "results": rows}))
    else:
        print(summary_table(rows))
    return 0


def fit_command(paths: list[Path], out: Path | None) -> int:
    """Fit the calibrated placement model to result files; write it to ``out`` (with the command)."""
    from dl2ray.speed import fit_placement, save_placement

    rows = [r for path in paths for r in json.loads(path.read_text())["results"]]
    cal, report = fit_placement(rows)
    source = " ".join(["tests/bench/bench_colocation.py", "--fit", *map(str, paths)]
                      + (["--out", str(out)] if out else []))
    if out:
        save_placement(cal, out, source=source, fit=report)
    print(json.dumps({"calibration": asdict(cal), "fit": report}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
