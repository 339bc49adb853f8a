"""The one driver of every DL2 learner: :func:`make_trainer` builds the trainer ``--algo`` names (the
registry :data:`~dl2ray.learn.records.ALGORITHMS` says which architecture it trains), :func:`train_rl`
runs any :class:`~dl2ray.learn.records.Learner` to a number of updates.

Every ``val_every`` updates (and before the first and after the last) the learner validates; the best
checkpoint goes to ``OUT.best.pt``, every ``checkpoint_every`` updates ``OUT`` and ``OUT.json`` (config,
seed, options, seed sets, history) are written, and ``resume=True`` continues from ``OUT``. With
``policy.shape.rollback`` ρ (shape learners), a validation above ρ × the best so far sends the learner
back to ``OUT.best.pt`` (:meth:`~dl2ray.learn.shape.trainer.ShapeTrainer.rewind`; the update is listed in
``result.rewinds``): a run that wandered off keeps searching from its best point, not from where it went.
TensorBoard scalars (``rl/<field>`` per update, ``rl/val_avg_jct`` per validation) go to ``logdir`` through
:func:`tensorboard_writer`, :func:`log_update` and :func:`log_validation` — the same helpers the A3C
``GlobalPolicy`` (``clusters.a3c``) logs with.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from dl2ray import seeds as seedsets
from dl2ray.config import ExperimentConfig
from dl2ray.errors import UserError
from dl2ray.learn.records import (
    Learner,
    RLOptions,
    RLResult,
    UpdateRecord,
    ValidationRow,
    algorithm,
    check_switches,
    result_doc,
    scalars,
)
from dl2ray.learn.validation import heuristic_jct
from dl2ray.policy.network import CheckpointError


def make_trainer(cfg: ExperimentConfig, init: Path | None, seed: int, opts: RLOptions,
                 val_cfg: ExperimentConfig | None = None) -> Any:
    """The trainer of ``opts.algo``: :class:`~dl2ray.learn.rl.Trainer` for the paper's architecture
    (``paper``, ``improve``), :class:`~dl2ray.learn.shape.trainer.ShapeTrainer` for the shape one
    (``counterfactual``, ``pg``, ``mix``). Refuses an ``init`` checkpoint of the other architecture, and
    a switch turned off that the algorithm does not have (:func:`~dl2ray.learn.records.check_switches`),
    and trace files (``opts.train_files``) for a learner that does not play its own cluster."""
    from dl2ray.policy.shape_net import checkpoint_arch

    learner = algorithm(opts.algo)
    arch = learner.arch
    check_switches(opts)
    if opts.train_files and (learner.counterfactual or learner.rollout_labels
                             or cfg.policy.experience != "cluster"):
        raise UserError(f"--train-trace: only the online learners (--algo paper or pg, policy.experience: "
                        f"cluster) replay trace files on their own cluster; here --algo {opts.algo}, "
                        f"experience {cfg.policy.experience}")
    if init is not None and checkpoint_arch(init) != arch:
        raise CheckpointError(f"{init}: a {checkpoint_arch(init)!r} checkpoint; --algo {opts.algo} trains "
                              f"the {arch!r} architecture (train sl --arch {arch})")
    if arch == "shape":
        from dl2ray.learn.shape.trainer import ShapeTrainer

        return ShapeTrainer(cfg, init, seed, opts, val_cfg)
    from dl2ray.learn.rl import Trainer

    return Trainer(cfg, init, seed, opts, val_cfg=val_cfg)


def train_rl(
    cfg: ExperimentConfig, init: Path | None, updates: int, seed: int, out: Path | None,
    options: RLOptions | None = None, logdir: Path | None = None, resume: bool = False,
    on_update: Callable[[UpdateRecord, ValidationRow | None], None] | None = None,
    val_cfg: ExperimentConfig | None = None,
) -> tuple[Any, RLResult]:
    """Train until ``updates`` updates in total; see the module docstring for files written.

    ``val_cfg``: validate (and measure DRF's baseline) in this config's simulator
    instead of ``cfg``'s — e.g. train on the analytic speed model, validate on
    the measured one (OfflineRL).
    """
    opts = options or RLOptions()
    trainer = make_trainer(cfg, init, seed, opts, val_cfg)
    rollback = cfg.policy.shape.rollback if algorithm(opts.algo).arch == "shape" else None
    if resume and out is not None and out.exists():
        trainer.restore(out)
    clock = time.perf_counter()

    def tick() -> None:
        nonlocal clock
        now = time.perf_counter()
        trainer.result.wall_seconds += now - clock
        clock = now

    # a finished run read back writes nothing (no empty event file beside its curve)
    finished = bool(trainer.result.validation) and trainer.updates >= updates
    writer = None if finished else tensorboard_writer(logdir)
    if not trainer.result.validation:
        trainer.result.baseline_avg_jct = heuristic_jct(trainer.val_cfg, "drf", trainer.val_seeds,
                                                        trainer.val_traces)
        log_validation(writer, trainer.validate())
        tick()
        if out is not None:
            trainer.save(out.with_suffix(".best.pt"))
    best = trainer.result.best
    while trainer.updates < updates:
        row = trainer.update()
        log_update(writer, row)
        val = None
        u = trainer.updates
        if u % opts.val_every == 0 or u == updates:
            val = trainer.validate()
            log_validation(writer, val)
            tick()
            if out is not None and (best is None or val.avg_jct < best.avg_jct):
                trainer.save(out.with_suffix(".best.pt"))
            elif out is not None and rollback is not None and best is not None and \
                    val.avg_jct > rollback * best.avg_jct and u < updates:
                trainer.rewind(out.with_suffix(".best.pt"))
                trainer.result.rewinds.append(u)
            best = trainer.result.best
        if out is not None and (u % opts.checkpoint_every == 0 or u == updates):
            tick()
            trainer.save(out)
            write_run_json(out.with_suffix(".json"), cfg, trainer)
        if on_update:
            on_update(row, val)
    tick()
    if writer is not None:
        writer.close()
    return trainer, trainer.result


def write_run_json(path: Path, cfg: ExperimentConfig, trainer: Learner) -> None:
    """The run's config, seed, options, seed sets and history, next to its checkpoint."""
    doc = {
        "kind": "rl",
        "seed": trainer.seed,
        "options": asdict(trainer.opts),
        "config": cfg.model_dump(mode="json"),
        "train_seeds": seedsets.training(trainer.opts.traces),
        **result_doc(trainer.result),
    }
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


def log_update(writer: Any, row: UpdateRecord) -> None:
    """Every field of an update's record as ``rl/<field>`` at step ``row.update`` (no writer: nothing)."""
    if writer is not None:
        for k, v in scalars(row).items():
            writer.add_scalar(f"rl/{k}", v, row.update)


def log_validation(writer: Any, row: ValidationRow, walltime: float | None = None) -> None:
    """A validation's average JCT as ``rl/val_avg_jct`` at step ``row.update`` (no writer: nothing);
    ``walltime`` (Unix seconds): the event's time, e.g. when the validated weights were taken (None: now)."""
    if writer is not None:
        writer.add_scalar("rl/val_avg_jct", row.avg_jct, row.update, walltime=walltime)


def tensorboard_writer(logdir: Path | None) -> Any:
    """A TensorBoard ``SummaryWriter`` on ``logdir``; None without one."""
    if logdir is None:
        return None
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(log_dir=str(logdir))
