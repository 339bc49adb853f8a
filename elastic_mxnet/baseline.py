"""Checkpoint-restart scaling with MXNet's own ``dist_sync`` kvstore (the baseline).

Stock MXNet cannot change a running job's servers or workers, so each change
is: save parameters and optimizer state, stop every process, relaunch the
ps-lite scheduler, servers and workers with the new counts on 127.0.0.1,
reload, resume. The interruption is measured like hot scaling's suspension:
from rank 0 reaching the scaling point (its last iteration done, before
saving) to rank 0 of the relaunched job starting its first iteration (after
import, kvstore start and reload), both ``time.time()`` on this machine.

Pitfalls handled: ``update_on_kvstore=False`` so ``Trainer.save_states``
works in distributed mode; ``nd.waitall()`` and a kvstore barrier before
saving and before exit; a fresh ``DMLC_PS_ROOT_PORT`` per launch.

Worker processes run ``python -m elastic_mxnet.baseline worker ...``;
scheduler and servers run ``python -m elastic_mxnet._mx`` (importing MXNet
with ``DMLC_ROLE`` set starts ps-lite and returns when the job ends).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from elastic_mxnet.protocol.wire import free_port


@dataclass(frozen=True)
class Segment:
    """One launch of the dist_sync job: ``servers`` x ``workers``, ``iterations`` iterations."""

    servers: int
    workers: int
    iterations: int = 2


@dataclass(frozen=True)
class Timing:
    """Wall-clock seconds (``time.time()``) rank 0 started training and reached the end."""

    first_iteration: float
    reached_end: float


def run_segment(
    seg: Segment,
    params: int,
    workdir: Path,
    checkpoint_in: Path | None,
    checkpoint_out: Path,
    timeout_s: float = 300.0,
) -> Timing:
    """Launch scheduler, servers and workers; wait for all to exit; return rank 0's timing."""
    port = free_port()
    base = {
        **os.environ,
        "DMLC_PS_ROOT_URI": "127.0.0.1",
        "DMLC_PS_ROOT_PORT": str(port),
        "DMLC_NUM_SERVER": str(seg.servers),
        "DMLC_NUM_WORKER": str(seg.workers),
        "DMLC_NODE_HOST": "127.0.0.1",
        "PS_VERBOSE": "0",
    }
    timing = workdir / f"timing-{port}.json"
    worker_cmd = [
        sys.executable,
        "-m",
        "elastic_mxnet.baseline",
        "worker",
        "--params",
        str(params),
        "--iterations",
        str(seg.iterations),
        "--checkpoint-out",
        str(checkpoint_out),
        "--timing",
        str(timing),
    ]
    if checkpoint_in is not None:
        worker_cmd += ["--checkpoint-in", str(checkpoint_in)]
    mx_cmd = [sys.executable, "-m", "elastic_mxnet._mx"]
    roles = (
        [("scheduler", mx_cmd)]
        + [("server", mx_cmd)] * seg.servers
        + [("worker", worker_cmd)] * seg.workers
    )
    procs = [
        subprocess.Popen(
            cmd,
            env={**base, "DMLC_ROLE": role},
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for role, cmd in roles
    ]
    try:
        deadline = time.monotonic() + timeout_s
        for proc in procs:
            code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            if code != 0:
                raise RuntimeError(f"dist_sync process exited with {code}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    data = json.loads(timing.read_text())
    return Timing(data["first_iteration"], data["reached_end"])


def interruptions_ms(segments: list[Segment], params: int, workdir: Path) -> list[float]:
    """Run ``segments`` back to back through checkpoints; interruption (ms) between each pair."""
    out: list[float] = []
    previous: Timing | None = None
    for i, seg in enumerate(segments):
        ckpt_in = workdir / f"ckpt-{i - 1}" if i else None
        timing = run_segment(seg, params, workdir, ckpt_in, workdir / f"ckpt-{i}")
        if previous is not None:
            out.append((timing.first_iteration - previous.reached_end) * 1e3)
        previous = timing
    return out


# ---- the worker process -----------------------------------------------------


def worker_main(args: argparse.Namespace) -> int:
    """One dist_sync worker: (reload), train, (rank 0) checkpoint, barrier, exit."""
    from elastic_mxnet._mx import mx
    from elastic_mxnet.training import models
    from elastic_mxnet.training.sharder import DataSharder

    kv = mx.kv.create("dist_sync")
    net = models.build("mlp-params", args.params)
    models.init_params(net, seed=0)
    start = 0
    if args.checkpoint_in:
        net.load_parameters(f"{args.checkpoint_in}.params")
        start = int(Path(f"{args.checkpoint_in}.iter").read_text())
    trainer = mx.gluon.Trainer(
        net.collect_params(),
        "sgd",
        {"learning_rate": 0.01, "momentum": 0.9},
        kvstore=kv,
        update_on_kvstore=False,
    )
    if args.checkpoint_in:
        trainer.load_states(f"{args.checkpoint_in}.states")
    x, y = models.synthetic_data("mlp-params", 256, seed=1)
    sharder = DataSharder(256, args.global_batch, seed=0)
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    timing: dict[str, float] = {}
    for it in range(start, start + args.iterations):
        if it == start:
            kv._barrier()  # every worker loaded: the job is ready to train
            timing["first_iteration"] = time.time()
        idx = sharder.indices(it, kv.rank, kv.num_workers)
        with mx.autograd.record():
            loss = loss_fn(net(mx.nd.array(x[idx])), mx.nd.array(y[idx]))
        loss.backward()
        trainer.step(args.global_batch)  # kvstore sums the workers' means of their shares
    mx.nd.waitall()
    timing["reached_end"] = time.time()
    if kv.rank == 0:
        net.save_parameters(f"{args.checkpoint_out}.params")
        trainer.save_states(f"{args.checkpoint_out}.states")
        Path(f"{args.checkpoint_out}.iter").write_text(str(start + args.iterations))
        Path(args.timing).write_text(json.dumps(timing))
    mx.nd.waitall()
    kv._barrier()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m elastic_mxnet.baseline", description=__doc__.split("\n")[0]
    )
    sub = p.add_subparsers(dest="command", required=True)
    w = sub.add_parser("worker", help="(internal) one dist_sync worker; needs the DMLC_* variables")
    w.add_argument("--params", type=int, required=True)
    w.add_argument("--iterations", type=int, default=2)
    w.add_argument("--global-batch", type=int, default=32)
    w.add_argument("--checkpoint-in")
    w.add_argument("--checkpoint-out", required=True)
    w.add_argument("--timing", required=True)
    args = p.parse_args(argv)
    if "DMLC_ROLE" not in os.environ:
        p.error("run by run_segment(), which sets the DMLC_* variables")
    return worker_main(args)


if __name__ == "__main__":
    sys.exit(main())
