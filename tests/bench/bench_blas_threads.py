"""numpy's BLAS threads and the online learner's collection: one ``pg`` update's stretches, timed per count.

The collection of one online ``pg`` update (``policy.shape.envs`` stretches of the sampled policy on the
learner's own cluster, as :mod:`bench_pg_update` collects it) from the same weights and the same random
stream, once per BLAS thread count in ``--blas-threads`` (threadpoolctl's limit on numpy's OpenBLAS in
this process), each alone and beside ``--neighbours`` processes that keep a core busy (what a process
pool's other worker does to this one: ``experiment paper`` runs its learners two at a time). Reports, per
case, the collection's seconds, the calls of ``NumpyShapePolicy.logits`` and their mean milliseconds.

    .venv/bin/python tests/bench/bench_blas_threads.py --config configs/testbed-online.yaml \\
        --init models/dl2-testbed.pt --blas-threads 1,2 --neighbours 1

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from contextlib import contextmanager

import numpy as np
from json_out import print_json
from threadpoolctl import threadpool_limits

from dl2ray import seeds as seedsets
from dl2ray.config import load_config
from dl2ray.envs.cluster_env import learning_environment
from dl2ray.learn.shape.pg import OnPolicyCollector, environments
from dl2ray.policy.shape import ShapeEncoding
from dl2ray.policy.shape_net import NumpyShapePolicy, load_shape_checkpoint

BUSY = "while True: pass"


@contextmanager
def neighbours(n: int):
    """``n`` processes that each keep one core busy until the block ends."""
    procs = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(n)]
    try:
        time.sleep(0.5 if n else 0.0)
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


class Timed(NumpyShapePolicy):
    """The numpy policy, counting its ``logits`` calls and their seconds."""

    calls, seconds = 0, 0.0

    def logits(self, x: np.ndarray, g: np.ndarray) -> np.ndarray:
        t0 = time.perf_counter()
        out = super().logits(x, g)
        self.calls += 1
        self.seconds += time.perf_counter() - t0
        return out


def collect(cfg, enc, net, seed: int) -> dict:
    s = cfg.policy.shape
    collector = OnPolicyCollector(environments([learning_environment(cfg, seedsets.training(100))]), enc,
                                  np.random.default_rng([seed, 1]))
    policy = Timed(net)
    t0 = time.perf_counter()
    played = collector.collect(policy, s.envs)
    return {"collect_s": round(time.perf_counter() - t0, 3), "slots": len(played.slots),
            "logits_calls": policy.calls, "logits_ms": round(1000 * policy.seconds / max(policy.calls, 1), 3)}


def run(config: str, init: str, counts: list[int], busy: int, seed: int) -> dict:
    cfg = load_config(config)
    enc = ShapeEncoding.from_config(cfg)
    net = load_shape_checkpoint(init, expect=enc).policy
    collect(cfg, enc, net, seed)  # numba's compile and the first imports, outside the timings
    cases = []
    for n in sorted({0, busy}):
        for threads in counts:
            with neighbours(n), threadpool_limits(limits=threads, user_api="blas"):
                cases.append({"blas_threads": threads, "neighbours": n, **collect(cfg, enc, net, seed)})
    return {"bench": "blas_threads", "config": cfg.name, "init": init, "stretches": cfg.policy.shape.envs,
            "cases": cases}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", "-c", default="configs/testbed-online.yaml")
    p.add_argument("--init", default="models/dl2-testbed.pt", help="a shape checkpoint")
    p.add_argument("--blas-threads", default="1,2", help="comma-separated BLAS thread counts")
    p.add_argument("--neighbours", type=int, default=1, help="busy processes beside it (0: alone only)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    try:
        counts = [int(x) for x in a.blas_threads.split(",") if x.strip()]
    except ValueError:
        p.error(f"--blas-threads: {a.blas_threads!r}: comma-separated integers")
    if not counts or min(counts) < 1 or a.neighbours < 0:
        p.error("--blas-threads must name counts >= 1 and --neighbours must be >= 0")
    return print_json(p, lambda: run(a.config, a.init, counts, a.neighbours, a.seed))


if __name__ == "__main__":
    sys.exit(main())
