"""Control a running elastic job from the shell.

    python -m elastic_mxnet.ctl ADDRESS scale --ps 3 [--workers 2] [--at-iteration N]
    python -m elastic_mxnet.ctl ADDRESS status
    python -m elastic_mxnet.ctl ADDRESS stop [--at-iteration N]

Prints the coordinator's reply as JSON. Exit codes: 0 done, 1 refused or no
answer (the reason on stderr), 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import sys

from elastic_mxnet.job import ElasticJob, ScaleRefused


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m elastic_mxnet.ctl", description=__doc__.split("\n")[0]
    )
    p.add_argument("address", help="coordinator address, e.g. tcp://127.0.0.1:5555")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for an answer")
    sub = p.add_subparsers(dest="command", required=True)
    scale = sub.add_parser("scale", help="set absolute PS and/or worker counts")
    scale.add_argument("--ps", type=int)
    scale.add_argument("--workers", type=int)
    scale.add_argument("--at-iteration", type=int)
    sub.add_parser("status", help="members, progress, scaling events")
    stop = sub.add_parser("stop", help="stop the job")
    stop.add_argument("--at-iteration", type=int)
    args = p.parse_args(argv)
    if not args.address.startswith("tcp://"):
        p.error(f"address must look like tcp://HOST:PORT, got {args.address!r}")
    if args.command == "scale" and args.ps is None and args.workers is None:
        p.error("scale needs --ps and/or --workers")
    for name in ("ps", "workers", "at_iteration"):
        if (getattr(args, name, None) or 0) < 0:
            p.error(f"--{name.replace('_', '-')} must be >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    with ElasticJob(args.address, timeout_s=args.timeout) as job:
        try:
            if args.command == "scale":
                reply = job.scale(ps=args.ps, workers=args.workers, at_iteration=args.at_iteration)
                out = reply.model_dump(mode="json")
            elif args.command == "status":
                out = job.status(timeout_s=args.timeout).model_dump(mode="json")
            else:
                job.stop(at_iteration=args.at_iteration)
                out = {"ok": True}
        except (ScaleRefused, TimeoutError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
