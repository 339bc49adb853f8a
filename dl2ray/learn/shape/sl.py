"""Supervised warm-start of the shape policy: imitate a heuristic's per-job shapes.

1. **Record** (:func:`record`): the teacher drives the simulator on each
   training trace; every slot becomes one :class:`SlotSample` — the view's job
   rows and global row (:func:`dl2ray.policy.shape.job_features`), each job's
   cap mask, and as label the menu row nearest (in log space) to the
   ``(workers, PS)`` the teacher gave the job (wait for a job it left out).
2. **Train** (:func:`train`): label-smoothed cross-entropy of the masked
   per-job logits (:func:`dl2ray.learn.supervised.smoothed_cross_entropy`), Adam,
   minibatches of ``policy.sl_batch_size`` *jobs'* decisions worth of slots.
   The label carries both what a job gets and (through the wait row) whether
   it is run at all, which is what orders the jobs at decision time (run odds).
3. **Report**: per epoch training/validation loss and accuracy; at the end the
   greedy policy's and the teacher's average JCT on the validation traces
   (:func:`dl2ray.learn.sl.compare_jct`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from dl2ray.config import ExperimentConfig
from dl2ray.learn.supervised import EpochStats, simulators, smoothed_cross_entropy
from dl2ray.policy.shape import ShapeEncoding, job_features, largest_node, layout_label
from dl2ray.policy.shape_decode import cap_mask
from dl2ray.policy.shape_net import ShapePolicyNet
from dl2ray.view import Allocation, ClusterView
from dl2ray.workload import Trace


@dataclass
class SlotSample:
    """One slot's inputs and per-job targets: ``x`` (n, F), ``g`` (G,), ``masks`` (n, K) bool,
    ``actions`` (n,) int64 menu rows."""

    x: np.ndarray
    g: np.ndarray
    masks: np.ndarray
    actions: np.ndarray


def teacher_sample(view: ClusterView, enc: ShapeEncoding, allocation,
                   placer: str | None = None) -> SlotSample:
    """The slot ``view`` labelled with the menu rows nearest to ``allocation``'s task counts; with layouts,
    of the teacher's own placer ``placer`` when it is one of them, else of the layout nearest to where the
    teacher put the job's tasks (:func:`layout_label`)."""
    x, g = job_features(view, enc)
    placed = allocation.placement or {}
    node = largest_node(view.capacity)
    if placer in enc.layouts:
        labels = np.array([enc.nearest(*_counts(allocation, j.job_id), layout=enc.layouts.index(placer))
                           for j in view.jobs], dtype=np.int64)
    else:
        labels = np.array([enc.nearest(*_counts(allocation, j.job_id),
                                       layout=layout_label(enc, j, placed.get(j.job_id), node))
                           for j in view.jobs], dtype=np.int64)
    masks = cap_mask(view, enc)
    masks[:, 0] = True
    labels = np.where(masks[np.arange(len(labels)), labels], labels, 0)
    return SlotSample(x, g, masks, labels)


def _counts(allocation, job_id: int) -> tuple[int, int]:
    """``(workers, ps)`` of ``job_id`` in ``allocation`` (0, 0 when it is left out)."""
    t = allocation.tasks.get(job_id)
    return (0, 0) if t is None else (int(t.workers), int(t.ps))


def record(cfg: ExperimentConfig, teacher: str, trace_seeds: Sequence[int], max_slots: int,
           on_trace: Callable[[], None] | None = None, traces: Sequence[Trace] | None = None,
           ) -> list[SlotSample]:
    """Slots (with at least one job) of ``teacher`` on each trace seed (or fixed trace)."""
    return _record(cfg, teacher, ShapeEncoding.from_config(cfg), trace_seeds, max_slots, traces, on_trace)


def record_on_student(cfg: ExperimentConfig, teacher: str, net: ShapePolicyNet, trace_seeds: Sequence[int],
                      max_slots: int, traces: Sequence[Trace] | None = None) -> list[SlotSample]:
    """DAgger (Ross et al., 2011): the *student's* (``net``, greedy) slots on each trace, labelled with what
    ``teacher`` would decide in them. The student's own mistakes lead to states the teacher never visits;
    these labels teach it the way back."""
    from dl2ray.policy.shape_decode import decide_shapes
    from dl2ray.policy.shape_net import NumpyShapePolicy

    enc, student = net.enc, NumpyShapePolicy(net)

    def act(view: ClusterView) -> Allocation:
        x, g = job_features(view, enc)
        return decide_shapes(view, enc, student.logits(x, g)).allocation

    return _record(cfg, teacher, enc, trace_seeds, max_slots, traces, None, act)


class _Labelled:
    """The scheduler the recording drives with: each view it is asked about is labelled with the teacher's
    allocation (kept in :attr:`seen`); it answers with the student's (``act``) or, without one, the
    teacher's. On a shared cluster it sits inside the queue layer, so what is recorded is what the policy
    will be asked there: a queue's jobs on that queue's nodes (:class:`dl2ray.schedulers.queued.Queued`)."""

    def __init__(self, teacher, act: Callable[[ClusterView], Allocation] | None) -> None:
        self.teacher, self.act = teacher, act
        self.seen: list[tuple[ClusterView, Allocation]] = []

    def __getattr__(self, attr: str):
        if attr == "teacher":
            raise AttributeError(attr)
        return getattr(self.teacher, attr)

    def decide(self, view: ClusterView) -> Allocation:
        label = self.teacher.decide(view)
        if view.jobs:
            self.seen.append((view, label))
        return label if self.act is None or not view.jobs else self.act(view)


def _record(cfg: ExperimentConfig, teacher: str, enc: ShapeEncoding, trace_seeds: Sequence[int],
            max_slots: int, traces: Sequence[Trace] | None, on_trace: Callable[[], None] | None,
            act: Callable[[ClusterView], Allocation] | None = None) -> list[SlotSample]:
    """Every view with a job that the policy would be asked about on each trace, labelled with ``teacher``'s
    allocation; the run goes on with ``act(view)`` (default: the label itself, i.e. the teacher drives). One
    view per slot, or on a shared cluster (``tenancy:``) the queue layer's views of each queue."""
    from dl2ray.schedulers.base import make_scheduler, on_cluster
    from dl2ray.schedulers.queued import Queued

    out: list[SlotSample] = []
    for sim, seed in simulators(cfg, trace_seeds, traces):
        made = make_scheduler(teacher, cfg)
        labelled = _Labelled(made.inner if isinstance(made, Queued) else made, act)
        driver = on_cluster(labelled, cfg)
        view = sim.reset(seed)
        if hasattr(driver, "reset"):
            driver.reset(seed)
        placer = getattr(labelled.teacher, "placement", None)
        for _ in range(max_slots):
            if sim.done:
                break
            alloc = driver.decide(view)
            out.extend(teacher_sample(v, enc, label, placer) for v, label in labelled.seen)
            labelled.seen.clear()
            view = sim.step(alloc).view
        if on_trace:
            on_trace()
    return out


@dataclass
class PackedSlots:
    """Slots' job rows stacked without padding, in slot order: ``x`` (N, F), ``slot`` (N,) int64 each row's
    slot, ``g`` (B, G), ``masks`` (N, K), ``actions`` (N,), ``start`` (B,) each slot's first row (job ``j``
    of slot ``b`` is row ``start[b] + j``). :meth:`ShapePolicyNet.packed
    <dl2ray.policy.shape_net.ShapePolicyNet.packed>` scores it."""

    x: torch.Tensor
    slot: torch.Tensor
    g: torch.Tensor
    masks: torch.Tensor
    actions: torch.Tensor
    start: torch.Tensor

    @classmethod
    def of(cls, slots: Sequence[SlotSample], num_shapes: int) -> PackedSlots:
        if not slots:
            none = torch.zeros(0, dtype=torch.int64)
            no_masks = torch.zeros(0, num_shapes, dtype=torch.bool)
            return cls(torch.zeros(0, 0), none, torch.zeros(0, 0), no_masks, none, none)
        sizes = np.array([len(s.actions) for s in slots], np.int64)
        start = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)

        def stacked(arrays: Sequence[np.ndarray], dtype: type) -> torch.Tensor:
            return torch.from_numpy(np.concatenate(arrays).astype(dtype, copy=False))

        return cls(stacked([s.x for s in slots], np.float32),
                   torch.from_numpy(np.repeat(np.arange(len(slots)), sizes)),
                   torch.from_numpy(np.stack([s.g for s in slots]).astype(np.float32, copy=False)),
                   stacked([s.masks for s in slots], bool),
                   stacked([np.asarray(s.actions) for s in slots], np.int64), torch.from_numpy(start))

    @property
    def jobs(self) -> int:
        """N: the job decisions of the batch."""
        return int(self.actions.shape[0])


def masked_job_logits(net: ShapePolicyNet, batch: PackedSlots) -> torch.Tensor:
    """``(N, K)`` logits with disallowed menu rows at −inf."""
    return net.packed(batch.x, batch.slot, batch.g).masked_fill(~batch.masks, float("-inf"))


def _loss_and_hits(net: ShapePolicyNet, batch: PackedSlots,
                   smoothing: float) -> tuple[torch.Tensor, int, int]:
    logits = masked_job_logits(net, batch)
    loss = smoothed_cross_entropy(logits, batch.masks, batch.actions, smoothing)
    hits = int((logits.argmax(dim=1) == batch.actions).sum())
    return loss, hits, batch.jobs


def evaluate(net: ShapePolicyNet, data: Sequence[SlotSample], batch_slots: int = 256) -> tuple[float, float]:
    """Mean cross-entropy per job decision and greedy accuracy of ``net`` on ``data``."""
    total, hits, jobs = 0.0, 0, 0
    with torch.inference_mode():
        for lo in range(0, len(data), batch_slots):
            batch = PackedSlots.of(data[lo:lo + batch_slots], net.enc.num_shapes)
            loss, h, n = _loss_and_hits(net, batch, 0.0)
            total, hits, jobs = total + float(loss) * n, hits + h, jobs + n
    return (total / jobs, hits / jobs) if jobs else (float("nan"), float("nan"))


def train(net: ShapePolicyNet, data: Sequence[SlotSample], val: Sequence[SlotSample], lr: float, epochs: int,
          batch_jobs: int, seed: int, smoothing: float = 0.0,
          on_epoch: Callable[[EpochStats], None] | None = None) -> list[EpochStats]:
    """Smoothed cross-entropy with Adam; minibatches of whole slots, about ``batch_jobs`` jobs each."""
    gen = np.random.default_rng([seed, 7])
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    mean_jobs = max(1.0, float(np.mean([len(s.actions) for s in data]))) if data else 1.0
    per_batch = max(1, round(batch_jobs / mean_jobs))
    history = []
    for epoch in range(1, epochs + 1):
        net.train()
        total, hits, jobs = 0.0, 0, 0
        perm = gen.permutation(len(data))
        for lo in range(0, len(data), per_batch):
            batch = PackedSlots.of([data[i] for i in perm[lo:lo + per_batch]], net.enc.num_shapes)
            loss, h, n = _loss_and_hits(net, batch, smoothing)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total, hits, jobs = total + float(loss.detach()) * n, hits + h, jobs + n
        net.eval()
        vl, va = evaluate(net, val)
        row = EpochStats(epoch, total / max(jobs, 1), hits / max(jobs, 1), vl, va)
        history.append(row)
        if on_epoch:
            on_epoch(row)
    return history
