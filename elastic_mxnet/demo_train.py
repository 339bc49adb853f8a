"""A training script for ``launch``: a small Gluon model on synthetic data, elastically.

    python -m elastic_mxnet.launch --ps 2 --workers 2 -- \\
        python -m elastic_mxnet.demo_train --model mlp --iterations 200

Every worker builds the same model and data from ``--seed``; the job's first
plan takes the initial values from one of them. ``--out`` makes the worker of
rank 0 at the end save the final parameters (``np.savez``, by order).
``--sample-sleep`` adds simulated compute proportional to the worker's share
of the global batch, so that a tiny model runs long enough to be scaled and
gains from more workers (live demos and tests).
``--gate-dir``/``--gates`` (tests) hold a worker before each listed iteration
until the file ``gate-<iteration>`` exists in that directory.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import numpy as np

from elastic_mxnet._mx import mx
from elastic_mxnet.training import models
from elastic_mxnet.training.trainer import ElasticTrainer, JobStopped


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m elastic_mxnet.demo_train", description=__doc__.split("\n")[0]
    )
    p.add_argument("--model", default="mlp", choices=["mlp", "cnn", "mlp-params"])
    p.add_argument("--params", type=int, default=1_000_000, help="size of mlp-params")
    p.add_argument("--iterations", type=int, default=100, help="0: until the job is stopped")
    p.add_argument("--global-batch", type=int, default=32)
    p.add_argument("--samples", type=int, default=512, help="dataset size")
    p.add_argument("--optimizer", default="sgd", choices=["sgd", "adam"])
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9, help="sgd only")
    p.add_argument("--wd", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="rank 0 saves the final parameters here (.npz)")
    p.add_argument("--gate-dir", type=Path)
    p.add_argument("--gates", default="", help="comma-separated iterations")
    p.add_argument(
        "--iter-sleep", type=float, default=0.0, help="seconds of extra work per iteration"
    )
    p.add_argument(
        "--sample-sleep",
        type=float,
        default=0.0,
        help="seconds of extra work per sample of this worker's share (more workers: faster)",
    )
    args = p.parse_args(argv)
    if args.iterations < 0 or args.global_batch < 1 or args.samples < 1:
        p.error("--iterations must be >= 0, --global-batch and --samples >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    net = models.build(args.model, args.params)
    models.init_params(net, args.seed)
    x, y = models.synthetic_data(args.model, args.samples, args.seed + 1)
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    opt = {"learning_rate": args.lr, "wd": args.wd}
    if args.optimizer == "sgd":
        opt["momentum"] = args.momentum
    gates = {int(g) for g in args.gates.split(",") if g}
    trainer = ElasticTrainer(
        net.collect_params(),
        args.optimizer,
        opt,
        global_batch_size=args.global_batch,
        num_samples=args.samples,
        data_seed=args.seed,
    )
    try:
        while trainer.running(args.iterations or None):
            idx = trainer.batch_indices()
            data, label = mx.nd.array(x[idx]), mx.nd.array(y[idx])
            with mx.autograd.record():
                loss = loss_fn(net(data), label)
            loss.backward()
            trainer.step(len(idx))
            if args.iter_sleep or args.sample_sleep:
                time.sleep(args.iter_sleep + args.sample_sleep * len(idx))
            _wait_gate(args.gate_dir, trainer.iteration, gates)
    except JobStopped as exc:
        print(f"worker {trainer.member_id}: job stopped: {exc}", file=sys.stderr)
    finally:
        trainer.close()
    last = trainer.plan
    if args.out and last is not None and last.workers and last.workers[0] == trainer.member_id:
        values = [p.data().asnumpy() for p in net.collect_params().values()]
        np.savez(args.out, *values, iteration=np.int64(trainer.iteration))
    return 0


def _wait_gate(gate_dir: Path | None, iteration: int, gates: set[int]) -> None:
    if gate_dir is None or iteration not in gates:
        return
    while not (gate_dir / f"gate-{iteration}").exists():
        time.sleep(0.01)


if __name__ == "__main__":
    sys.exit(main())
