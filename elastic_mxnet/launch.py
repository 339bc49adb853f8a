"""Start an elastic job on this machine: a coordinator that spawns its PS and workers.

    python -m elastic_mxnet.launch --ps 2 --workers 2 -- python train.py ...

The coordinator runs in this process and prints its address on stderr (and
into ``--address-file``); PS are ``python -m elastic_mxnet.server`` and
workers run the command after ``--`` with ``ELASTIC_MXNET_COORDINATOR`` set.
Exits 0 when every worker finished (or the job was stopped), 1 if the job
failed, 2 on a usage error. ``--rejoin --port P`` restarts a coordinator on
the port of one that died: it rebuilds membership from the members.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

from elastic_mxnet.config import JobConfig, Limits, Liveness, Sharding
from elastic_mxnet.coordination.coordinator import Coordinator
from elastic_mxnet.coordination.spawner import ProcessSpawner


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Options before ``--`` and the worker command after it."""
    if "--" in argv:
        cut = argv.index("--")
        opts, cmd = argv[:cut], argv[cut + 1 :]
    else:
        opts, cmd = argv, []
    p = argparse.ArgumentParser(
        prog="python -m elastic_mxnet.launch",
        description=__doc__.split("\n")[0],
        usage="%(prog)s [options] -- WORKER_COMMAND ...",
    )
    p.add_argument("--ps", type=int, default=1, help="initial number of PS (default 1)")
    p.add_argument("--workers", type=int, default=1, help="initial number of workers (default 1)")
    p.add_argument("--host", default="127.0.0.1", help="address the coordinator binds")
    p.add_argument("--port", type=int, default=0, help="coordinator port (0: any free port)")
    p.add_argument("--address-file", type=Path, help="write the coordinator address here")
    p.add_argument("--rejoin", action="store_true", help="restart: rebuild from the members")
    p.add_argument("--max-ps", type=int, default=8)
    p.add_argument("--max-workers", type=int, default=16)
    p.add_argument("--heartbeat-interval", type=float, default=0.1, help="seconds")
    p.add_argument("--heartbeat-timeout", type=float, default=2.0, help="seconds")
    p.add_argument(
        "--register-timeout",
        type=float,
        default=60.0,
        help="seconds a scale request waits for its new members to register",
    )
    p.add_argument("--chunk-elems", type=int, default=1 << 17, help="largest chunk (elements)")
    p.add_argument("--snapshot-every", type=int, default=20, help="PS snapshot period (iterations)")
    p.add_argument("--snapshot-dir", default="", help="shared directory (default: a temporary one)")
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(opts)
    if not cmd:
        p.error("no worker command: put it after '--'")
    if args.ps < 1 or args.workers < 1:
        p.error("--ps and --workers must be >= 1")
    if args.ps > args.max_ps or args.workers > args.max_workers:
        p.error("--ps/--workers exceed --max-ps/--max-workers")
    if (
        args.chunk_elems < 1
        or args.snapshot_every < 1
        or args.heartbeat_timeout <= 0
        or args.register_timeout <= 0
    ):
        p.error(
            "--chunk-elems, --snapshot-every, --heartbeat-timeout and --register-timeout "
            "must be positive"
        )
    return args, cmd


def config_from(args: argparse.Namespace) -> JobConfig:
    return JobConfig(
        host=args.host,
        port=args.port,
        initial_ps=args.ps,
        initial_workers=args.workers,
        liveness=Liveness(
            heartbeat_interval_s=args.heartbeat_interval,
            heartbeat_timeout_s=args.heartbeat_timeout,
            rejoin_grace_s=max(1.5, 3 * args.heartbeat_interval),
        ),
        limits=Limits(
            max_ps=args.max_ps,
            max_workers=args.max_workers,
            register_timeout_s=args.register_timeout,
        ),
        sharding=Sharding(
            chunk_elems=args.chunk_elems,
            snapshot_every=args.snapshot_every,
            snapshot_dir=args.snapshot_dir,
        ),
    )


def _terminate(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args, cmd = parse(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(name)s %(message)s",
    )
    spawner = ProcessSpawner(worker_cmd=cmd)
    try:
        coordinator = Coordinator(config_from(args), spawner, rejoin=args.rejoin)
    except OSError as exc:  # zmq.ZMQError is an OSError: port taken, bad host
        print(f"error: cannot bind {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    print(f"coordinator: {coordinator.address}", file=sys.stderr, flush=True)
    if args.address_file:
        tmp = args.address_file.with_suffix(".tmp")
        tmp.write_text(coordinator.address)
        tmp.replace(args.address_file)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        return coordinator.serve()
    except (KeyboardInterrupt, SystemExit):
        spawner.grace_s = 1.0
        return 130


if __name__ == "__main__":
    sys.exit(main())
