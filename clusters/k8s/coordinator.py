"""The coordinator pod's entry point: an elastic MXNet coordinator that spawns nothing.

    python -m clusters.k8s.coordinator --host $(POD_IP) --port 5555 --ps 1 --workers 2 \\
        --max-ps 2 --max-workers 4

On Kubernetes the members are pods that the agent (:mod:`clusters.k8s.backend`)
creates; each registers with this coordinator on its own and waits as standby
until a scale request takes it into the plan. So the coordinator runs with no
spawner: the first plan starts when ``--ps`` PS and ``--workers`` workers have
registered, a scale request waits for the standby members the agent started,
and a dead PS's chunks go to the surviving PS (restored from the latest
snapshot). Workers may go to 0 (a paused job keeps one PS). Exits 0 when the
job finished, 1 when it failed, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys

from elastic_mxnet.config import JobConfig, Limits, Liveness
from elastic_mxnet.coordination.coordinator import Coordinator


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m clusters.k8s.coordinator", description=__doc__.split("\n")[0])
    p.add_argument("--host", required=True, help="address to bind (the pod IP)")
    p.add_argument("--port", type=int, default=5555)
    p.add_argument("--ps", type=int, default=1, help="PS of the first plan")
    p.add_argument("--workers", type=int, default=1, help="workers of the first plan")
    p.add_argument("--max-ps", type=int, default=8)
    p.add_argument("--max-workers", type=int, default=16)
    p.add_argument("--heartbeat-timeout", type=float, default=5.0, help="seconds")
    p.add_argument("--register-timeout", type=float, default=60.0, help="seconds")
    args = p.parse_args(argv)
    if not 1 <= args.ps <= args.max_ps or not 1 <= args.workers <= args.max_workers:
        p.error("--ps/--workers must be between 1 and --max-ps/--max-workers")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    cfg = JobConfig(
        host=args.host,
        port=args.port,
        initial_ps=args.ps,
        initial_workers=args.workers,
        liveness=Liveness(heartbeat_timeout_s=args.heartbeat_timeout),
        limits=Limits(
            min_ps=1,
            max_ps=args.max_ps,
            min_workers=0,
            max_workers=args.max_workers,
            register_timeout_s=args.register_timeout,
        ),
    )
    try:
        coordinator = Coordinator(cfg, None)
    except OSError as exc:  # zmq.ZMQError: address taken or not ours
        print(f"error: cannot bind {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    print(f"coordinator: {coordinator.address}", file=sys.stderr, flush=True)

    def _terminate(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _terminate)
    try:
        return coordinator.serve()
    except (KeyboardInterrupt, SystemExit):
        return 143


if __name__ == "__main__":
    sys.exit(main())
