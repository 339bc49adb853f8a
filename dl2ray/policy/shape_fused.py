"""The shape policy's slot decision in one compiled pass: what a deployed policy runs every slot.

:func:`~dl2ray.policy.shape.job_features`, :meth:`~dl2ray.policy.shape_net.NumpyShapePolicy.logits` and
:func:`~dl2ray.policy.shape_decode.decide_shapes` (with the view's placer's final layout) are the
reference: each step a numpy pass over ``(n, F)`` or ``(n, K, head)`` arrays, with Python between them.
Here one Python pass over the view gathers each job's plain numbers (its observed slowness and last speed
from its history, its demands as rows of a small table), and two numba calls do the rest:

1. :func:`_features`: the job rows' own columns and the global row (float64, then float32 as the
   reference stores them), the profile's per-type columns read from
   :attr:`~dl2ray.policy.shape.ShapeEncoding.profile_tables` (computed once per encoding);
2. between the two, the network's trunk (embedding, context, head) in numpy, exactly as the reference
   computes it (:meth:`~dl2ray.policy.shape_net.NumpyShapePolicy.trunk`): BLAS rounds identical job rows
   differently by their place in the product, and that rounding is how the reference orders identical
   jobs;
3. :func:`_decide_kernel`: the row term of profile features without materialising the ``(n, K, R)`` rows
   (the part of ``r @ row_in`` a job's type and the row fix is computed once per policy,
   :meth:`FusedShapePolicy._fixed_rows`), the run odds (numpy's summation order), the menu loop and the
   per-job or interleaved placement of :mod:`dl2ray.policy.shape_decode` (the same compiled functions),
   the tasks grouped by job and, under the ``optimus`` placer, the Optimus layout
   (:func:`dl2ray.policy.optimus_layout.optimus_layout_compiled`: the choices of
   :func:`dl2ray.cluster.optimus_layout`).

What is left to Python is building the :class:`~dl2ray.view.Allocation`. The row term's sums run in
another order than BLAS's, so a logit may differ from the reference's in its last float32 bits; the
decisions are the reference's wherever two allowed rows' logits are not within that rounding —
``tests/policy/test_shape_fused.py`` compares both paths, and both against the decisions recorded before
this path existed, on 200 slots of every shipped policy. A policy with layouts lays out its ``optimus``
rows in Python afterwards (:func:`~dl2ray.policy.shape_decode.optimus_rows`, as the reference does).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from dl2ray.cluster import placement_mode
from dl2ray.policy.optimus_layout import optimus_layout_compiled
from dl2ray.policy.shape import GRID, SLOWNESS_SLOTS, ShapeEncoding
from dl2ray.policy.shape_decode import ShapeDecision, interleave, optimus_rows, shape_kernel
from dl2ray.view import Allocation, ClusterView, JobPlacement, Tasks

_EPS = 1e-9  # as dl2ray.cluster
# the columns of the jobs' table (float64, one row per job in view order)
_TI, _REM, _EST, _RUN, _ARR, _W, _P, _RATE, _SLOW, _MAXW, _MAXP, _WKEY, _PKEY = range(13)
_COLS = 13
MAX_MENU = 480
"""Most menu rows besides wait the fused path sums as numpy does (three levels of its pairwise sum)."""


class FusedShapePolicy:
    """``decide(view, rng) -> ShapeDecision`` of a :class:`~dl2ray.policy.shape_net.NumpyShapePolicy`
    in one compiled pass (module docstring); its encoding is the policy's."""

    def __init__(self, policy) -> None:
        self.enc: ShapeEncoding = policy.enc
        enc = self.enc
        if enc.num_shapes - 1 > MAX_MENU:
            raise ValueError(f"the fused path sums at most {MAX_MENU} menu rows, not {enc.num_shapes - 1}")
        self.policy = policy
        if policy.row is not None:
            tab = enc.profile_tables
            self._tables = (tab.c11, tab.rows, tab.speedup, tab.best)
            ri, ro = policy.row[3], policy.row[4]
            self._ri = np.ascontiguousarray(np.vstack([ri[1:4], ro[None, :]]), np.float32)
            self._fixed = self._fixed_rows(ri)
        else:  # placeholders of the same types: one compiled signature
            z = np.zeros(1)
            self._tables = (z, np.zeros((1, 1)), np.zeros((1, 1)), z)
            self._ri, self._fixed = np.zeros((4, 1), np.float32), np.zeros((1, 1, 1), np.float32)
        self._modes = enc.layout_modes if enc.layouts else None
        self._lists = enc.cost_lists if enc.profile else []

    def _fixed_rows(self, ri: np.ndarray) -> np.ndarray:
        """``(L, K, head)`` float32: the part of each row's ``r @ row_in`` a job's type and the row fix
        (columns 0, 4, 5 and the layout's two), once per policy; wait's is 0."""
        enc = self.enc
        per = max(len(enc.layouts), 1)
        cols = np.zeros((enc.num_types, enc.num_shapes, enc.row_dim), np.float32)
        cols[:, :, 0] = enc.profile_tables.speedup
        cols[:, 1:, 4] = enc.shapes[1:, 0] / 8.0
        cols[:, 1:, 5] = enc.shapes[1:, 1] / 16.0
        if enc.layouts:
            if enc.gain is None:
                raise ValueError("layout features need the catalogue's constants (ShapeEncoding.from_config)")
            cols[:, 1:, 6] = np.array([(k - 1) % per for k in range(1, enc.num_shapes)]) / max(per - 1, 1)
            cols[:, 1:, 7] = enc.gain[:, 1:]
        return np.ascontiguousarray(cols @ ri, np.float32)

    def decide(self, view: ClusterView, rng: np.random.Generator | None = None) -> ShapeDecision:
        """The slot's decision (greedy with ``rng`` None, else sampled); the same as the reference's."""
        enc = self.enc
        n = len(view.jobs)
        if n == 0:
            empty = np.zeros(0, dtype=np.int64)
            return ShapeDecision(Allocation({}, {}), empty, np.zeros((0, enc.num_shapes), dtype=np.bool_),
                                 empty, np.zeros((0, 2), dtype=np.int64))
        cols, dem = self._table(view)
        cap = np.array(view.capacity, dtype=np.float64)
        free = np.array(view.free, dtype=np.float64)
        total = view.total_capacity.astype(np.float64)
        inv = np.divide(1.0, cap, out=np.zeros_like(cap), where=cap > 0)
        modes = self._modes if self._modes is not None else np.array([placement_mode(view.placement)],
                                                                   dtype=np.int64)
        relayout = not enc.layouts and view.placement == "optimus"
        flags = np.array([enc.profile, enc.work_conserving, enc.interleaved, bool(enc.layouts), relayout])
        scalars = np.array([view.slot, view.slot_seconds, enc.slots_run_scale, enc.num_types])
        masks = np.zeros((n, enc.num_shapes), dtype=np.bool_)
        actions = np.zeros(n, dtype=np.int64)
        tasks = np.zeros((n, 2), dtype=np.int64)
        order = np.zeros(n, dtype=np.int64)
        seq = np.zeros(n + 1, dtype=np.int64)  # jobs in allocation order, then how many
        nodes_out = np.zeros(max(int(cols[:, _MAXW].sum() + cols[:, _MAXP].sum()), 1), dtype=np.int64)
        x, g = _features(cols, dem, total, scalars, flags, self._tables, enc.job_columns)
        # the trunk in numpy, as the reference computes it: equal jobs keep BLAS's rounding of their rows
        h, ctx, logits = self.policy.trunk(x, g)
        rin = self.policy.row_input(h, ctx) if enc.profile else logits
        _decide_kernel(np.ascontiguousarray(logits, dtype=np.float32), np.ascontiguousarray(rin, np.float32),
                       cols, dem, total, scalars, flags, self._tables, self._fixed, self._ri,
                       enc.shapes, enc.row_layouts, (cap, free, inv, modes), rng,
                       masks, actions, tasks, order, seq, nodes_out)
        allocation = _allocation(view, seq, tasks, nodes_out)
        if "optimus" in enc.layouts:
            allocation = optimus_rows(view, enc, allocation, actions)
        return ShapeDecision(allocation, order, masks, actions, tasks)

    def _table(self, view: ClusterView) -> tuple[np.ndarray, np.ndarray]:
        """The jobs' columns ``(n, 13)`` float64 and the distinct task demands ``(D, 3)`` their keys index:
        one pass over the jobs and their histories (the reference's observed slowness and last speed)."""
        keys: dict[tuple[float, ...], int] = {}
        lists, profile = self._lists, self.enc.profile
        rows = []
        for j in view.jobs:
            rate, total, count = 0.0, 0.0, 0
            cost = lists[j.type_index] if profile else None
            for o in reversed(j.history):
                if o.epochs > 0 and o.seconds > 0:
                    if count == 0:
                        rate = o.epochs / o.seconds
                    if cost is None:
                        count = 1
                        break
                    p = o.ps if o.ps < GRID else GRID
                    w = o.workers if o.workers < GRID else GRID
                    total += math.log(o.seconds / o.epochs / cost[p - 1][w - 1])
                    count += 1
                    if count == SLOWNESS_SLOTS:
                        break
            slow = 1.0
            if cost is not None and count:
                mean = total / count
                slow = math.exp(-1.0 if mean < -1.0 else 1.0 if mean > 1.0 else mean)
            wk = keys.setdefault(tuple(j.worker_demand.tolist()), len(keys))
            pk = keys.setdefault(tuple(j.ps_demand.tolist()), len(keys))
            rows.append((j.type_index, max(j.est_epochs - j.done_epochs, 1e-9), j.est_epochs, j.slots_run,
                         j.arrival_slot, j.workers, j.ps, rate, slow, j.max_workers, j.max_ps, wk, pk))
        cols = np.array(rows, dtype=np.float64).reshape(len(rows), _COLS)
        return cols, np.array(list(keys), dtype=np.float64).reshape(len(keys), 3)


def _allocation(view: ClusterView, seq: np.ndarray, tasks: np.ndarray, nodes: np.ndarray) -> Allocation:
    """The kernel's jobs in allocation order, each ``tasks`` row's workers then PS in ``nodes``."""
    jobs = view.jobs
    m = int(seq[-1])
    order = seq[:m].tolist()
    counts = tasks.tolist()
    flat = nodes.tolist()
    out_tasks, placement = {}, {}
    at = 0
    for g in order:
        w, p = counts[g]
        job_id = jobs[g].job_id
        out_tasks[job_id] = Tasks(w, p)
        placement[job_id] = JobPlacement(tuple(flat[at:at + w]), tuple(flat[at + w:at + w + p]))
        at += w + p
    return Allocation(out_tasks, placement)


# -- the kernel ----------------------------------------------------------------------------------------


@njit(cache=True)
def _clip(v, lo, hi):
    """np.clip of one float64 (NaN stays NaN)."""
    if v < lo:
        return lo
    if v > hi:
        return hi
    return v


@njit(cache=True)
def _job_columns(cols, dem, scalars, flags, tables, num_types, width):
    """The job rows' own columns ``(n, width)`` float32, as job_features computes them (float64 first)."""
    n = cols.shape[0]
    x = np.zeros((n, width), dtype=np.float32)
    slot, slot_seconds, scale = scalars[0], scalars[1], scalars[2]
    profile = flags[0]
    c11, _, _, best = tables
    base = 0 if profile else num_types
    for j in range(n):
        ti = int(cols[j, _TI])
        rem, est = cols[j, _REM], cols[j, _EST]
        workers, ps = cols[j, _W], cols[j, _P]
        if not profile:
            x[j, ti] = 1.0
        x[j, base] = _clip(rem / est, 0.0, 1.0)
        x[j, base + 1] = math.log10(1.0 + rem) / 5.0
        x[j, base + 2] = _clip(cols[j, _RUN] / scale, 0.0, 1.0)
        x[j, base + 3] = _clip((slot - cols[j, _ARR]) / scale, 0.0, 1.0)
        x[j, base + 4] = _clip(workers / 16.0, 0.0, 1.0)
        x[j, base + 5] = _clip(ps / 16.0, 0.0, 1.0)
        x[j, base + 6] = _clip(cols[j, _RATE] * slot_seconds / rem, 0.0, 1.0)
        x[j, base + 7] = 1.0 if workers > 0 and ps > 0 else 0.0
        if profile:
            slow = cols[j, _SLOW]
            t1 = rem * c11[ti] * slow / slot_seconds
            x[j, 8] = math.log10(1.0 + t1) / 3.0
            x[j, 9] = math.log(slow)
            x[j, 10] = _clip(dem[int(cols[j, _WKEY]), 1], 0.0, 1.0)
            x[j, 11] = best[ti]
    return x


@njit(cache=True, fastmath=True)  # finite inputs: the row columns are clipped
def _row_term(a, fixed, r1, r2, r3, ri):
    """``ro · relu(a + r @ ri)`` for one job and menu row: ``a`` (head,) the job's input, ``fixed`` (head,)
    the row's type-and-row part of ``r @ ri`` (:meth:`FusedShapePolicy._fixed_rows`), ``r1``, ``r2``,
    ``r3`` the row's job-dependent columns; ``ri`` rows 1, 2, 3 of ``row_in`` then ``ro`` (4, head)."""
    s = np.float32(0.0)
    for o in range(a.shape[0]):
        v = a[o] + fixed[o] + r1 * ri[0, o] + r2 * ri[1, o]
        if r3 != 0:
            v += r3 * ri[2, o]
        s += max(v, np.float32(0.0)) * ri[3, o]
    return s


@njit(cache=True)
def _features(cols, dem, total, scalars, flags, tables, width):
    """``(x, g)``: the job rows' own columns ``(n, width)`` and the global row ``(4,)``, float32, as
    job_features computes them."""
    n = cols.shape[0]
    x = _job_columns(cols, dem, scalars, flags, tables, int(scalars[3]), width)
    units = total[1] if total[1] > 0 else total[0] / 2.0
    bundle = np.zeros(3)
    for j in range(n):
        wk, pk = int(cols[j, _WKEY]), int(cols[j, _PKEY])
        for r in range(3):
            bundle[r] += dem[wk, r] + dem[pk, r]
    load = np.zeros(3)
    for r in range(3):
        load[r] = bundle[r] / total[r] if total[r] > 0 else 0.0
    g = np.empty(4, dtype=np.float32)
    g[0] = min(n / max(units, 1.0), 4.0)
    g[1] = n / 100.0
    g[2] = min(load[0], 4.0)
    g[3] = min(load[1], 4.0)
    return x, g


@njit(cache=True)
def _add_row_terms(logits, rin, cols, dem, total, scalars, tables, fixed, ri, shapes):
    """Add each logit's row term of profile features (shape_net's module docstring) to ``logits`` (n, K):
    ``rin`` (n, head) each job's input to it (NumpyShapePolicy.row_input); the row's job-dependent columns
    as _profile_columns computes them (float64, then float32)."""
    c11, rows = tables[0], tables[1]
    n, num_k = logits.shape[0], logits.shape[1]
    slot_seconds = scalars[1]
    inv = np.zeros(3)
    for r in range(3):
        inv[r] = 1.0 / total[r] if total[r] > 0 else 0.0
    zero = np.float32(0.0)
    for j in range(n):
        a = rin[j]
        ti = int(cols[j, _TI])
        wd, pd = dem[int(cols[j, _WKEY])], dem[int(cols[j, _PKEY])]
        t1 = cols[j, _REM] * c11[ti] * cols[j, _SLOW] / slot_seconds
        logits[j, 0] += _row_term(a, fixed[ti, 0], zero, zero, zero, ri)
        for k in range(1, num_k):
            w, p = shapes[k, 0], shapes[k, 1]
            share = 0.0
            for r in range(3):
                s = (w * wd[r] + p * pd[r]) * inv[r]
                if r == 0 or s > share:
                    share = s
            ratio = t1 * rows[ti, k] / c11[ti]
            if ratio > 1e6:
                ratio = 1e6
            r1 = np.float32(math.log10(1.0 + ratio) / 3.0)
            r2 = np.float32(_clip(share * n / 8.0, 0.0, 1.0))
            r3 = np.float32(1.0 if w == cols[j, _W] and p == cols[j, _P] else 0.0)
            logits[j, k] += _row_term(a, fixed[ti, k], r1, r2, r3, ri)


@njit(cache=True)
def _pairwise_block(a, lo, hi):
    """numpy's pairwise sum of ``a[lo:hi]`` for at most 128 float64s: the same additions in the same order."""
    n = hi - lo
    if n < 8:
        s = 0.0
        for i in range(lo, hi):
            s += a[i]
        return s
    r = a[lo:lo + 8].copy()
    i = lo + 8
    while i < hi - n % 8:
        for k in range(8):
            r[k] += a[i + k]
        i += 8
    s = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
    while i < hi:
        s += a[i]
        i += 1
    return s


@njit(cache=True)
def _pairwise_halves(a, lo, hi):
    """numpy's pairwise sum of ``a[lo:hi]`` (up to 240 values): above 128, the sums of two halves."""
    n = hi - lo
    if n <= 128:
        return _pairwise_block(a, lo, hi)
    half = n // 2
    half -= half % 8
    return _pairwise_block(a, lo, lo + half) + _pairwise_block(a, lo + half, hi)


@njit(cache=True)
def _pairwise_sum(a, lo, hi):
    """numpy's pairwise sum of ``a[lo:hi]`` (up to :data:`MAX_MENU` values; numba caches no recursion)."""
    n = hi - lo
    if n <= 128:
        return _pairwise_block(a, lo, hi)
    half = n // 2
    half -= half % 8
    return _pairwise_halves(a, lo, lo + half) + _pairwise_halves(a, lo + half, hi)


@njit(cache=True)
def _run_order(logits, caps):
    """shape_decode.run_order: jobs by run odds, largest first, ties in view order."""
    n, num_k = logits.shape
    odds = np.empty(n)
    z = np.empty(num_k - 1)
    for j in range(n):
        top = -np.inf
        for k in range(1, num_k):
            z[k - 1] = np.float64(logits[j, k]) if caps[j, k] else -np.inf
            if z[k - 1] > top:
                top = z[k - 1]
        if not np.isfinite(top):
            top = 0.0
        for k in range(num_k - 1):
            z[k] = math.exp(z[k] - top)
        odds[j] = -(top + math.log(_pairwise_sum(z, 0, num_k - 1) + 1e-300) - logits[j, 0])
    return np.argsort(odds, kind="mergesort")


@njit(cache=True)
def _decide_kernel(logits, rin, cols, dem, total, scalars, flags, tables, fixed, ri, shapes, row_layouts,
                   nodes, rng, masks, actions, tasks, order, seq, nodes_out):
    """Row terms (flags[0]) added to ``logits``, then order, menu loop, placement, grouping and (flags[4])
    the Optimus layout: fills ``masks``, ``actions``, ``tasks``, ``order``, ``seq`` (jobs in allocation
    order, their count last) and ``nodes_out`` (each of those jobs' worker nodes, then its PS nodes)."""
    n = cols.shape[0]
    if flags[0]:
        _add_row_terms(logits, rin, cols, dem, total, scalars, tables, fixed, ri, shapes)
    caps = np.empty((n, shapes.shape[0]), dtype=np.bool_)
    most_w, most_p, tasks_max = 0, 0, 0
    for k in range(shapes.shape[0]):
        most_w, most_p = max(most_w, shapes[k, 0]), max(most_p, shapes[k, 1])
    wkey = np.empty(n, dtype=np.int64)
    pkey = np.empty(n, dtype=np.int64)
    for j in range(n):
        maxw, maxp = cols[j, _MAXW], cols[j, _MAXP]
        wkey[j], pkey[j] = int(cols[j, _WKEY]), int(cols[j, _PKEY])
        tasks_max += int(min(maxw, most_w) + min(maxp, most_p))
        for k in range(shapes.shape[0]):
            caps[j, k] = shapes[k, 0] <= maxw and shapes[k, 1] <= maxp
    order[:] = _run_order(logits, caps)
    placed = np.empty((max(tasks_max, 1), 3), dtype=np.int64)
    free0 = nodes[1].copy()
    n_placed = shape_kernel(logits, order, caps, shapes, row_layouts, wkey, pkey, dem, nodes, rng, -1, -1,
                            flags[1], masks, actions, tasks, placed)
    if flags[2]:
        job_mode = np.empty(n, dtype=np.int64)
        for j in range(n):
            job_mode[j] = row_layouts[actions[j]]
        n_placed = interleave((nodes[0], free0.copy(), nodes[2], nodes[3]), dem, wkey, pkey, order, job_mode,
                              tasks, placed)
    _group(placed, n_placed, n, tasks, seq, nodes_out)
    if flags[4]:
        optimus_layout_compiled(free0, dem, wkey, pkey, tasks, seq, nodes_out)


@njit(cache=True)
def _group(placed, n_placed, n, tasks, seq, nodes_out):
    """placed_allocation's grouping (every placed job has a worker first and a PS): jobs in order of their
    first task, each one's worker nodes then PS nodes in placement order; ``tasks`` recounted."""
    first = np.full(n, -1, dtype=np.int64)
    m = 0
    tasks[:, :] = 0
    for i in range(n_placed):
        g = placed[i, 0]
        if first[g] < 0:
            first[g] = m
            seq[m] = g
            m += 1
        tasks[g, placed[i, 1]] += 1
    seq[-1] = m
    start = np.zeros(n, dtype=np.int64)
    at = 0
    for i in range(m):
        g = seq[i]
        start[g] = at
        at += tasks[g, 0] + tasks[g, 1]
    filled = np.zeros((n, 2), dtype=np.int64)
    for i in range(n_placed):
        g, role = placed[i, 0], placed[i, 1]
        nodes_out[start[g] + role * tasks[g, 0] + filled[g, role]] = placed[i, 2]
        filled[g, role] += 1
