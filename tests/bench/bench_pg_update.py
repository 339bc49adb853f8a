"""One online ``pg`` update of the shape policy, timed: the collection of its stretches and the update itself.

From a checkpoint (``--init``) on a config: ``policy.shape.envs`` stretches of the sampled policy on the
learner's own cluster (what one update collects), then :func:`~dl2ray.learn.shape.pg.pg_update` on them
(``policy.shape.epochs`` Adam steps, the KL stop), ``--repeats`` times on the same experience from the
same weights; torch on ``--threads`` threads. Reports the experience's size (slots, job decisions, the
largest slot) and the seconds of each part (the update's median over the repeats).

    .venv/bin/python tests/bench/bench_pg_update.py --config configs/testbed-online.yaml \\
        --init models/dl2-testbed.pt --repeats 3

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time

import numpy as np
import torch
from json_out import print_json

from dl2ray import seeds as seedsets
from dl2ray.config import load_config
from dl2ray.envs.cluster_env import learning_environment
from dl2ray.learn.shape.pg import OnPolicyCollector, build_job_value, environments, pg_update
from dl2ray.policy.shape import ShapeEncoding
from dl2ray.policy.shape_net import NumpyShapePolicy, load_shape_checkpoint


def run(config: str, init: str, repeats: int, threads: int, seed: int) -> dict:
    torch.set_num_threads(threads)
    cfg = load_config(config)
    enc, s = ShapeEncoding.from_config(cfg), cfg.policy.shape
    net = load_shape_checkpoint(init, expect=enc).policy
    collector = OnPolicyCollector(environments([learning_environment(cfg, seedsets.training(100))]), enc,
                                  np.random.default_rng([seed, 1]))
    t0 = time.perf_counter()
    played = collector.collect(NumpyShapePolicy(net), s.envs)
    collect_s = time.perf_counter() - t0
    update_s = []
    for _ in range(repeats):
        trial = copy.deepcopy(net)
        value = build_job_value(enc, s.head, seed)
        opt = torch.optim.Adam(trial.parameters(), lr=s.lr)
        value_opt = torch.optim.Adam(value.parameters(), lr=s.lr)
        t0 = time.perf_counter()
        row = pg_update(trial, value, opt, value_opt, played, s.epochs, s.trust, s.entropy_weight)
        update_s.append(time.perf_counter() - t0)
    sizes = [len(x.actions) for x in played.slots]
    return {"bench": "pg_update", "config": cfg.name, "init": init, "threads": threads,
            "stretches": played.episodes, "slots": len(played.slots), "decisions": sum(sizes),
            "largest_slot": max(sizes, default=0), "menu_rows": enc.num_shapes,
            "collect_s": round(collect_s, 3), "update_s": round(statistics.median(update_s), 3),
            "update_s_all": [round(x, 3) for x in update_s], "steps": row.steps}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", "-c", default="configs/testbed-online.yaml")
    p.add_argument("--init", default="models/dl2-testbed.pt", help="a shape checkpoint")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if a.repeats < 1 or a.threads < 1:
        p.error("--repeats and --threads must be >= 1")
    return print_json(p, lambda: run(a.config, a.init, a.repeats, a.threads, a.seed))


if __name__ == "__main__":
    sys.exit(main())
