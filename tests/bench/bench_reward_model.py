"""Harmony's reward-prediction model against its training data and steps (the notebook's sweep, issue 15).

For each number of training traces N of ``--traces`` and each number of Adam steps S of ``--steps``:
placements of random / LB / Tetris logged on N training traces (:func:`dl2ray.harmony.linear.log_placements`),
the model fitted by :func:`dl2ray.harmony.train.fit_reward_model`, and its relative error ``|ŷ − y| / y``
(:func:`dl2ray.harmony.train.relative_errors`) on the same schedulers' placements on ``--val-traces``
validation traces (held out) and on ``lif-linear``'s placements there (a scheduler never in the training
data). Prints one JSON object: one row per (N, S).

    .venv/bin/python tests/bench/bench_reward_model.py --config configs/harmony.yaml --traces 3,10,20 \
        --steps 4000,8000
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np
from json_out import print_json

from dl2ray import seeds
from dl2ray.config import load_config
from dl2ray.errors import UserError
from dl2ray.harmony.linear import FIT_SCHEDULERS, log_placements
from dl2ray.harmony.nets import max_nodes
from dl2ray.harmony.train import HarmonySettings, fit_reward_model, relative_errors


def _errors(model, logged) -> dict[str, float]:
    err = relative_errors(model, logged.features, logged.speed)
    return {"mean": round(float(err.mean()), 5), "p90": round(float(np.quantile(err, 0.9)), 5)}


def run(config: str, traces: list[int], steps: list[int], val_traces: int, seed: int) -> dict:
    cfg = load_config(config)
    val = seeds.validation(val_traces)
    held = log_placements(cfg, FIT_SCHEDULERS, val)
    unseen = log_placements(cfg, ["lif-linear"], val)
    if held.features is None or unseen.features is None:
        raise UserError(f"{config}: no placement was logged on the validation traces")
    rows = []
    for n in traces:
        train = log_placements(cfg, FIT_SCHEDULERS, seeds.training(n))
        assert train.features is not None
        for s in steps:
            t0 = time.perf_counter()
            st = dataclasses.replace(HarmonySettings(), rm_steps=s, seed=seed)
            model = fit_reward_model(train.features, train.speed, len(cfg.catalogue), max_nodes(cfg), st)
            rows.append({"traces": n, "samples": len(train), "steps": s, "train": _errors(model, train),
                         "heldout": _errors(model, held), "lif_linear": _errors(model, unseen),
                         "fit_s": round(time.perf_counter() - t0, 1)})
    return {"bench": "reward_model", "config": cfg.name, "seed": seed, "validation_seeds": val,
            "heldout_samples": len(held), "lif_linear_samples": len(unseen), "rows": rows}


def _ints(text: str, flag: str, parser: argparse.ArgumentParser) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        parser.error(f"{flag} {text!r}: comma-separated positive integers")
    if not out or min(out) < 1:
        parser.error(f"{flag} {text!r}: comma-separated positive integers")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", "-c", default="configs/harmony.yaml")
    p.add_argument("--traces", default="3,10,20", help="training traces per fit, comma-separated")
    p.add_argument("--steps", default="1000,4000,8000", help="Adam steps per fit, comma-separated")
    p.add_argument("--val-traces", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    traces, steps = _ints(a.traces, "--traces", p), _ints(a.steps, "--steps", p)
    if a.val_traces < 1:
        p.error("--val-traces: at least 1")
    return print_json(p, lambda: run(a.config, traces, steps, a.val_traces, a.seed))


if __name__ == "__main__":
    raise SystemExit(main())
