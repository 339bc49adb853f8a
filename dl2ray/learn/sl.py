"""Supervised warm-start: imitate a heuristic's decisions through the incremental loop.

1. **Record.** On each training trace the teacher (any registered heuristic;
   DRF by default) drives the simulator; every slot's allocation is
   decomposed into labelled ``(state, mask, action)`` steps, stop included
   (:mod:`dl2ray.learn.teacher`). Validation traces are recorded the same way.
2. **Train.** Cross-entropy of the masked policy logits against the teacher's
   action (Adam, ``policy.sl_lr``), minibatches of ``policy.sl_batch_size``
   steps shuffled by a generator seeded from the run's seed. With label
   smoothing ``ε = policy.sl_label_smoothing`` the target puts ``1 − ε`` on
   the teacher's action and spreads ``ε`` evenly over the *allowed* actions:
   ``L = −(1−ε)·log π(a*|s) − ε·mean_{a allowed} log π(a|s)``. Without it the
   imitation drives the logits apart without bound (gaps of 100+ after 10
   epochs), the sampled policy is the greedy one and RL has nothing to explore;
   ε keeps every allowed action's probability near ``ε/|allowed|``.
   The value network is fitted at the same time (mean squared error) to the
   discounted return ``G_t = Σ_k γ^k r_{t+k}`` of each step's slot under the
   teacher (``γ = policy.gamma``, truncated at ``sl_max_slots``), so RL starts
   with a critic of the policy it starts from.
Instead of generated traces, ``SLRun.train_files`` / ``val_files`` record fixed
Parquet traces (e.g. segments of an imported real trace; the seeds then drive
only the simulator's noise).

3. **Report.** Per epoch: training loss and accuracy, validation loss and
   accuracy (greedy masked action == teacher action). At the end: average JCT
   of the greedy SL policy and of the teacher on the validation traces.

Traces come only from :mod:`dl2ray.seeds` (training for data,
validation for the report); the run's ``seed`` drives network initialisation
and shuffling only.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from dl2ray import seeds as seedsets
from dl2ray.config import ExperimentConfig
from dl2ray.learn.supervised import EpochStats, simulators, smoothed_cross_entropy
from dl2ray.learn.teacher import decompose
from dl2ray.learn.validation import read_traces
from dl2ray.policy.encoding import Encoding
from dl2ray.policy.network import PolicyNet, ValueNet, build_networks, save_checkpoint, set_checkpoint_placer
from dl2ray.workload import Trace


@dataclass
class Dataset:
    """Labelled decision steps: states (N, J·(L+5)) float32, masks (N, 3J+1) bool, actions (N,) int64,
    returns (N,) float32 (the teacher's discounted return from the step's slot)."""

    states: np.ndarray
    masks: np.ndarray
    actions: np.ndarray
    returns: np.ndarray
    short: int = 0  # teacher tasks the replay could not place (see dl2ray.learn.teacher)

    def __len__(self) -> int:
        return int(self.actions.shape[0])


def record(
    cfg: ExperimentConfig, teacher: str, trace_seeds: Sequence[int], max_slots: int,
    on_trace: Callable[[], None] | None = None, traces: Sequence[Trace] | None = None,
) -> Dataset:
    """Run ``teacher`` on each trace seed (or on each of ``traces``, the seeds driving only the
    simulator's noise) and decompose every slot (up to ``max_slots``)."""
    from dl2ray.learn.rollout import discounted_returns
    from dl2ray.schedulers.base import make_scheduler

    enc = Encoding.from_config(cfg)
    states, masks, actions, short = [], [], [], 0
    returns: list[float] = []
    for sim, seed in simulators(cfg, trace_seeds, traces):
        sched = make_scheduler(teacher, cfg)
        view = sim.reset(seed)
        if hasattr(sched, "reset"):
            sched.reset(seed)
        counts, rewards = [], []
        for _ in range(max_slots):
            if sim.done:
                break
            alloc = sched.decide(view)
            dec = decompose(view, alloc, enc)
            short += dec.short
            for st in dec.decision.steps:
                states.append(st.state)
                masks.append(st.mask)
                actions.append(st.action)
            res = sim.step(alloc)
            counts.append(len(dec.decision.steps))
            rewards.append(res.reward)
            view = res.view
        g = discounted_returns(np.asarray(rewards), np.zeros(len(rewards), bool), cfg.policy.gamma)
        returns.extend(np.repeat(g, counts))
        if on_trace:
            on_trace()
    if not actions:
        return Dataset(np.zeros((0, enc.state_dim), np.float32), np.zeros((0, enc.action_dim), bool),
                       np.zeros(0, np.int64), np.zeros(0, np.float32), short)
    return Dataset(np.stack(states), np.stack(masks), np.asarray(actions, np.int64),
                   np.asarray(returns, np.float32), short)


def evaluate(policy: PolicyNet, data: Dataset, batch: int = 4096) -> tuple[float, float]:
    """Mean cross-entropy and greedy-action accuracy of ``policy`` on ``data``."""
    if len(data) == 0:
        return float("nan"), float("nan")
    loss, correct = 0.0, 0
    with torch.inference_mode():
        for lo in range(0, len(data), batch):
            s = torch.from_numpy(data.states[lo:lo + batch])
            m = torch.from_numpy(data.masks[lo:lo + batch])
            a = torch.from_numpy(data.actions[lo:lo + batch])
            logits = policy(s, m)
            loss += float(F.cross_entropy(logits, a, reduction="sum"))
            correct += int((logits.argmax(dim=1) == a).sum())
    return loss / len(data), correct / len(data)


def train(
    policy: PolicyNet, data: Dataset, val: Dataset, lr: float, epochs: int, batch_size: int, seed: int,
    on_epoch: Callable[[EpochStats], None] | None = None, label_smoothing: float = 0.0,
    value: ValueNet | None = None,
) -> list[EpochStats]:
    """(Smoothed) cross-entropy on masked logits with Adam, and, given ``value``, the
    value network's squared error to ``data.returns``; returns one row per epoch."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(policy.parameters(), lr=lr)
    value_opt = torch.optim.Adam(value.parameters(), lr=lr) if value is not None else None
    states, masks = torch.from_numpy(data.states), torch.from_numpy(data.masks)
    actions, returns = torch.from_numpy(data.actions), torch.from_numpy(data.returns)
    history = []
    for epoch in range(1, epochs + 1):
        policy.train()
        total, correct = 0.0, 0
        perm = torch.randperm(len(data), generator=gen)
        for lo in range(0, len(data), batch_size):
            idx = perm[lo:lo + batch_size]
            logits = policy(states[idx], masks[idx])
            loss = smoothed_cross_entropy(logits, masks[idx], actions[idx], label_smoothing)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if value is not None and value_opt is not None:
                value_loss = F.mse_loss(value(states[idx]), returns[idx])
                value_opt.zero_grad()
                value_loss.backward()
                value_opt.step()
            total += float(loss.detach()) * len(idx)
            correct += int((logits.detach().argmax(dim=1) == actions[idx]).sum())
        policy.eval()
        vl, va = evaluate(policy, val)
        row = EpochStats(epoch, total / max(len(data), 1), correct / max(len(data), 1), vl, va)
        history.append(row)
        if on_epoch:
            on_epoch(row)
    return history


def compare_jct(cfg: ExperimentConfig, policy, teacher: str, trace_seeds: Sequence[int],
                traces: Sequence[Trace] | None = None, placer: str | None = None) -> dict:
    """Average JCT (slots; unfinished jobs counted until the run stopped, see
    :func:`dl2ray.evaluation.metrics.censored_avg_jct`) of the greedy policy (a torch network of either
    architecture) and of the teacher. ``placer``: the policy's own placement (a checkpoint's
    ``meta.placer``), under which it decides as ``dl2:PATH`` would on this config; None: the view's."""
    from dl2ray.evaluation.metrics import censored_avg_jct, summarize_run
    from dl2ray.policy.shape_net import numpy_policy
    from dl2ray.schedulers.base import make_scheduler, on_cluster
    from dl2ray.schedulers.dl2 import DL2Scheduler
    from dl2ray.schedulers.placed import with_placement
    from dl2ray.sim import run_episode

    fast = numpy_policy(policy)

    def student() -> Any:
        mine = DL2Scheduler.from_policy(fast)
        if placer is None:
            return on_cluster(mine, cfg)
        mine.placement = placer
        return on_cluster(with_placement(mine, str(cfg.cluster.placement)), cfg)

    per_trace = []
    for sim, seed in simulators(cfg, trace_seeds, traces):
        mine_run = run_episode(sim, student(), seed)
        theirs_run = run_episode(sim, make_scheduler(teacher, cfg), seed)
        mine = summarize_run(mine_run)
        per_trace.append({"seed": seed, "policy_avg_jct": censored_avg_jct(mine_run),
                          "teacher_avg_jct": censored_avg_jct(theirs_run),
                          "policy_completed": mine["completed"], "jobs": mine["jobs"]})
    p = float(np.mean([r["policy_avg_jct"] for r in per_trace]))
    t = float(np.mean([r["teacher_avg_jct"] for r in per_trace]))
    return {"policy_avg_jct": p, "teacher_avg_jct": t, "ratio": p / t, "traces": per_trace}


@dataclass
class SLResult:
    """What ``dl2ray train sl`` reports and writes next to the checkpoint (as JSON)."""

    config_name: str
    teacher: str
    seed: int
    train_seeds: list[int]
    val_seeds: list[int]
    samples: int
    val_samples: int
    short: int
    history: list[EpochStats] = field(default_factory=list)
    jct: dict = field(default_factory=dict)
    wall_seconds: float = 0.0  # record + train + evaluate

    @property
    def val_accuracy(self) -> float:
        return self.history[-1].val_accuracy if self.history else float("nan")


@dataclass
class SLRun:
    """One supervised run's settings (CLI options over the config's ``policy`` group)."""

    teacher: str
    traces: int
    val_traces: int
    epochs: int
    seed: int
    max_slots: int
    train_files: tuple[str, ...] = ()  # Parquet traces to record instead of generated training traces
    val_files: tuple[str, ...] = ()  # ... and instead of generated validation traces
    arch: str = "paper"  # the policy's architecture: paper (3J+1 steps) or shape (dl2ray.learn.shape.sl)
    dagger: int = 0  # shape: DAgger rounds after the first fit (teacher labels on the student's own slots)
    init: str | None = None  # shape: start from this checkpoint; with dagger, the init replaces the first fit
    lr: float | None = None  # Adam learning rate (None: policy.sl_lr)


def run_sl(
    cfg: ExperimentConfig, run: SLRun, out: Path | None = None, logdir: Path | None = None,
    progress: Callable[[str, int], None] | None = None,
) -> tuple[torch.nn.Module, ValueNet | None, SLResult]:
    """Record, train, report; with ``out``, save the checkpoint and ``out.json`` beside it.

    ``progress(stage, advance)`` is called once per recorded trace and per epoch. For
    ``run.arch == "shape"`` the labels are per-job menu rows (:mod:`dl2ray.learn.shape.sl`), the policy
    is a :class:`~dl2ray.policy.shape_net.ShapePolicyNet` and there is no value network.
    """
    started = time.perf_counter()
    tick = progress or (lambda stage, n: None)
    traces = read_traces(cfg, run.train_files), read_traces(cfg, run.val_files)
    seeds = (seedsets.training(len(traces[0]) if traces[0] else run.traces),
             seedsets.validation(len(traces[1]) if traces[1] else run.val_traces))
    writer = _writer(logdir)

    def on_epoch(row: EpochStats) -> None:
        tick("train", 1)
        if writer is not None:
            for k in ("loss", "accuracy", "val_loss", "val_accuracy"):
                writer.add_scalar(f"sl/{k}", getattr(row, k), row.epoch)

    fit = _fit_shape if run.arch == "shape" else _fit_paper
    fitted = fit(cfg, run, seeds, traces, lambda: tick("record", 1), on_epoch)
    # a student continued from a checkpoint keeps the placement chosen for it (meta.placer), as it is judged
    placer = _own_placer(run.init)
    jct = compare_jct(cfg, fitted.policy, run.teacher, seeds[1], traces[1], placer)
    tick("evaluate", 1)
    if writer is not None:
        writer.add_scalar("sl/val_policy_avg_jct", jct["policy_avg_jct"], run.epochs)
        writer.add_scalar("sl/val_teacher_avg_jct", jct["teacher_avg_jct"], run.epochs)
        writer.close()
    result = SLResult(cfg.name, run.teacher, run.seed, seeds[0], seeds[1], fitted.samples, fitted.val_samples,
                      fitted.short, fitted.history, jct, time.perf_counter() - started)
    if out is not None:
        fitted.save(out, {"kind": "sl", "teacher": run.teacher, "seed": run.seed})
        if placer is not None:
            set_checkpoint_placer(out, placer)
        write_run_json(out.with_suffix(".json"), cfg, run, result)
    return fitted.policy, fitted.value, result


@dataclass
class _Fitted:
    """One architecture's trained networks, what they were trained on, and how to save them."""

    policy: torch.nn.Module
    value: ValueNet | None
    history: list[EpochStats]
    samples: int  # labelled decisions: steps (paper) or job decisions (shape)
    val_samples: int
    short: int
    save: Callable[[Path, dict], None]


Seeds = tuple[list[int], list[int]]
Traces = tuple[list[Trace] | None, list[Trace] | None]


def _fit_paper(cfg: ExperimentConfig, run: SLRun, seeds: Seeds, traces: Traces, on_trace: Callable[[], None],
               on_epoch: Callable[[EpochStats], None]) -> _Fitted:
    """The paper's architecture: incremental steps (:func:`record`), cross-entropy and a value fit."""
    p = cfg.policy
    data = record(cfg, run.teacher, seeds[0], run.max_slots, on_trace, traces[0])
    val = record(cfg, run.teacher, seeds[1], run.max_slots, on_trace, traces[1])
    policy, value = build_networks(Encoding.from_config(cfg), p.hidden, run.seed)
    history = train(policy, data, val, run.lr or p.sl_lr, run.epochs, p.sl_batch_size, run.seed, on_epoch,
                    p.sl_label_smoothing, value)
    return _Fitted(policy, value, history, len(data), len(val), data.short,
                   lambda out, extra: save_checkpoint(out, policy, value, cfg.catalogue.names, extra=extra))


def _fit_shape(cfg: ExperimentConfig, run: SLRun, seeds: Seeds, traces: Traces, on_trace: Callable[[], None],
               on_epoch: Callable[[EpochStats], None]) -> _Fitted:
    """The shape architecture: per-job menu rows (:mod:`dl2ray.learn.shape.sl`), no value network."""
    from dl2ray.learn.shape import sl as shape_sl
    from dl2ray.policy.shape import ShapeEncoding
    from dl2ray.policy.shape_net import build_shape_policy, load_shape_checkpoint, save_shape_checkpoint

    p = cfg.policy
    lr = run.lr or p.sl_lr
    data = shape_sl.record(cfg, run.teacher, seeds[0], run.max_slots, on_trace, traces[0])
    val = shape_sl.record(cfg, run.teacher, seeds[1], run.max_slots, on_trace, traces[1])
    enc = ShapeEncoding.from_config(cfg)
    if run.init:  # a trained student goes on (decoding as the config says, which the checkpoint then records)
        policy = load_shape_checkpoint(run.init, enc, decoding="config").policy
    else:
        policy = build_shape_policy(enc, p.shape.embed, p.shape.head, run.seed)
    history = [] if run.init and run.dagger else shape_sl.train(
        policy, data, val, lr, run.epochs, p.sl_batch_size, run.seed, p.sl_label_smoothing, on_epoch)
    for r in range(run.dagger):  # aggregate the student's slots, keep training the same network
        more = shape_sl.record_on_student(cfg, run.teacher, policy, seeds[0], run.max_slots, traces[0])
        data = [*data, *more]
        history += shape_sl.train(policy, data, val, lr, max(1, run.epochs // 2), p.sl_batch_size,
                                  run.seed + 1 + r, p.sl_label_smoothing, on_epoch)
    return _Fitted(policy, None, history, sum(len(x.actions) for x in data), sum(len(x.actions) for x in val),
                   0, lambda out, extra: save_shape_checkpoint(out, policy, cfg.catalogue.names, extra=extra))


def write_run_json(path: Path, cfg: ExperimentConfig, run: SLRun, result: SLResult) -> None:
    """The run's config, seed, seed sets and results, next to its checkpoint."""
    doc = {
        "kind": "sl",
        "run": asdict(run),
        "config": cfg.model_dump(mode="json"),
        **{k: v for k, v in asdict(result).items() if k != "history"},
        "history": [asdict(h) for h in result.history],
        "val_accuracy": result.val_accuracy,
    }
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


def _own_placer(init: str | None) -> str | None:
    """The placement chosen for the checkpoint ``init`` (its ``meta.placer``); None without one."""
    if not init:
        return None
    from dl2ray.policy.network import read_checkpoint_doc
    from dl2ray.policy.shape_net import checkpoint_placer

    return checkpoint_placer(init) if "placer" in read_checkpoint_doc(init).get("meta", {}) else None


def _writer(logdir: Path | None):
    if logdir is None:
        return None
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(log_dir=str(logdir))
