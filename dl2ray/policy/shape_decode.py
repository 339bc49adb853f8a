"""The shape policy's decoder: each job's menu row from its logits, masked, and its tasks placed.

The encoding and the job features are :mod:`dl2ray.policy.shape`'s.

**Decision** (:func:`decide_shapes`, a compiled loop): jobs are taken in
order of their *run odds* ``logsumexp(logits of the cap-allowed shapes but
wait) − logit(wait)`` (largest first; ties: view order). For each job the
*mask* allows wait, and every shape within the job's caps whose demand
``w·d_worker + p·d_PS`` fits the cluster's free total left by the jobs before
it; the job's shape is the argmax (greedy) or a Gumbel-max sample of its
masked logits. **Work conservation** (``policy.shape.work_conserving``, the
default): wait is allowed only when no other row of the job fits, so the
policy orders jobs and sizes them but never idles capacity a waiting job could
use — without it, a policy imitating the planner on Philly segments met queues
longer than any it was trained on, waited with every job and never recovered
(docs/notebook/2026-11-28.md). Its tasks go through the configured placer (the same
tournament trees as :mod:`dl2ray.policy.decision`) worker, PS, worker, PS,
…; a task that finds no node stops that role (the shape is *truncated*), and
a job left without a worker or without a PS releases what it got. The
allocation is therefore feasible by construction.

**Placement** (``policy.shape.placement``). ``per-job`` keeps the tasks as
the loop above placed them, one job's whole shape after another's.
``interleaved`` (the default since issue 22) then places the decided counts
again from the slot's free capacity the way the planner and Optimus place
theirs: in the jobs' order, every job's first worker and PS, then one task per
job per round (a job's next task is the role furthest behind its count, as a
fraction), a task that finds no node truncating its role. With the same
counts the layouts differ, and the simulator's placement model and
co-location interference reward the interleaved one: the planner's own
decisions sent through the menu and this decoder run 1.065 ± 0.013 of the
planner per-job and 1.011 ± 0.015 interleaved (five validation traces,
docs/notebook/2026-11-28.md, "The decoder's placement").

The chosen menu row (not the truncated counts) is the action; masks and
actions are recorded per job for learning.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from dl2ray.cluster import FULLEST
from dl2ray.policy.decision import (
    build_trees,
    greedy_compiled,
    placed_allocation,
    sample_compiled,
    set_leaf,
    view_modes,
)
from dl2ray.policy.shape import WAIT, ShapeEncoding
from dl2ray.view import Allocation, ClusterView

_EPS = 1e-9
_WORKER, _PS = 0, 1


def cap_mask(view: ClusterView, enc: ShapeEncoding) -> np.ndarray:
    """``(n, K)`` bool: the menu rows within each job's worker and PS caps (wait always)."""
    s = enc.shapes
    maxw = np.fromiter((j.max_workers for j in view.jobs), np.int64, len(view.jobs))
    maxp = np.fromiter((j.max_ps for j in view.jobs), np.int64, len(view.jobs))
    return (s[None, :, 0] <= maxw[:, None]) & (s[None, :, 1] <= maxp[:, None])


def run_order(logits: np.ndarray, caps: np.ndarray) -> np.ndarray:
    """Jobs by run odds, largest first (ties: view order); ``logits`` (n, K), ``caps`` (n, K) bool."""
    if logits.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    z = np.where(caps[:, 1:], logits[:, 1:].astype(np.float64), -np.inf)
    top = z.max(axis=1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    lse = top[:, 0] + np.log(np.exp(z - top).sum(axis=1) + 1e-300)
    odds = lse - logits[:, WAIT]
    return np.argsort(-odds, kind="stable").astype(np.int64)


@dataclass
class ShapeDecision:
    """One slot's decision: the allocation, and per job (view order) what the policy chose.

    ``order`` (n,) the jobs' processing order; ``masks`` (n, K) bool the allowed
    menu rows at each job's turn; ``actions`` (n,) the chosen menu rows;
    ``tasks`` (n, 2) the workers and PS actually placed (after truncation).
    """

    allocation: Allocation
    order: np.ndarray
    masks: np.ndarray
    actions: np.ndarray
    tasks: np.ndarray


def decide_shapes(view: ClusterView, enc: ShapeEncoding, logits: np.ndarray,
                  rng: np.random.Generator | None = None, forced: tuple[int, int] | None = None
                  ) -> ShapeDecision:
    """The slot's decision from the jobs' ``(n, K)`` logits (module docstring).

    ``rng`` None: greedy; otherwise every job's shape is sampled (Gumbel-max).
    ``forced`` ``(job index, menu row)``: that job takes that row (if its mask
    allows it, else its greedy choice) and every other job decides as usual —
    the counterfactual a learner compares against the greedy decision.
    """
    n = len(view.jobs)
    caps = cap_mask(view, enc)
    order = run_order(logits, caps)
    # each job's own task demands (a live or served job may differ from its type's), as rows of ``dem``
    keys: dict[tuple[float, ...], int] = {}
    wkey = np.array([keys.setdefault(tuple(map(float, j.worker_demand)), len(keys)) for j in view.jobs],
                    dtype=np.int64)
    pkey = np.array([keys.setdefault(tuple(map(float, j.ps_demand)), len(keys)) for j in view.jobs],
                    dtype=np.int64)
    dem = np.array(list(keys), dtype=np.float64).reshape(len(keys), 3)
    cap = np.array(view.capacity, dtype=np.float64)
    free = np.array(view.free, dtype=np.float64)
    inv = np.divide(1.0, cap, out=np.zeros_like(cap), where=cap > 0)
    modes = enc.layout_modes if enc.layouts else view_modes(view)
    nodes = (cap, free, inv, modes)
    masks = np.zeros((n, enc.num_shapes), dtype=np.bool_)
    actions = np.zeros(n, dtype=np.int64)
    tasks = np.zeros((n, 2), dtype=np.int64)
    shapes = enc.shapes
    most_w, most_p = int(shapes[:, 0].max()), int(shapes[:, 1].max())
    tasks_max = sum(min(j.max_workers, most_w) + min(j.max_ps, most_p) for j in view.jobs)
    placed = np.empty((max(tasks_max, 1), 3), dtype=np.int64)
    fj, fa = forced if forced is not None else (-1, -1)
    free0 = free.copy()  # the kernel places into ``free``
    rows = enc.row_layouts
    n_placed = shape_kernel(np.ascontiguousarray(logits, dtype=np.float32), order, caps, shapes, rows,
                             wkey, pkey, dem, nodes, rng, fj, fa, enc.work_conserving, masks, actions, tasks,
                             placed)
    if enc.interleaved:
        n_placed = interleave((cap, free0, inv, modes), dem, wkey, pkey, order, rows[actions], tasks, placed)
    allocation = placed_allocation(view, placed[:n_placed], relayout=not enc.layouts)
    if "optimus" in enc.layouts:
        allocation = optimus_rows(view, enc, allocation, actions)
    return ShapeDecision(allocation, order, masks, actions, tasks)


def optimus_rows(view: ClusterView, enc: ShapeEncoding, allocation: Allocation, actions: np.ndarray
                  ) -> Allocation:
    """The jobs whose rows chose the ``optimus`` layout laid out again by the Optimus principle
    (:func:`dl2ray.cluster.final_layout`) on what the other jobs left free, as the ``optimus`` placer lays
    out all of them; their tasks were placed fullest-node-first, as that placer places while deciding."""
    from dl2ray.cluster import final_layout, node_usage

    opt = enc.layouts.index("optimus")
    placed = allocation.placement or {}
    chosen = {j.job_id for g, j in enumerate(view.jobs)
              if enc.row_layouts[actions[g]] == opt and j.job_id in allocation.tasks}
    if not chosen:
        return allocation
    jobs = {j.job_id: j for j in view.jobs}
    others = Allocation({i: t for i, t in allocation.tasks.items() if i not in chosen},
                        {i: p for i, p in placed.items() if i not in chosen})
    free = view.free - node_usage(view.capacity, others, lambda i: (jobs[i].worker_demand, jobs[i].ps_demand))
    mine = Allocation({i: t for i, t in allocation.tasks.items() if i in chosen},
                      {i: p for i, p in placed.items() if i in chosen})
    demands = {i: (jobs[i].worker_demand if t.workers else None, jobs[i].ps_demand if t.ps else None)
               for i, t in mine.tasks.items()}
    relaid = final_layout("optimus", free, mine, demands).placement or {}
    return Allocation(dict(allocation.tasks), {**placed, **relaid})


@njit(cache=True)
def _lazy_trees(nodes, dem, tasks):
    """The placer's tournament trees (:func:`~dl2ray.policy.decision.build_trees`), brought up to date
    lazily: a placement changes one node, which every tree of the slot would re-score at once; here the
    node is logged and a tree re-scores the nodes logged since its last use when it is next asked for a
    node — the same answers at every query (a leaf is a function of its node's free capacity now), with
    work only for the demands asked for. ``tasks``: the most placements and removals to come.

    With one placement mode, FULLEST (packing, Optimus), a placement on a tree's root only makes that node
    fuller, so it stays the root while it fits (a better score wins every vertex of its path the old one
    won, ties included); its leaf is left *stale* until another node changes in that tree or it no longer
    fits. Removals are logged as ``-(n + 1)`` and always re-scored."""
    log = np.empty(tasks + 1, dtype=np.int64)
    count = np.zeros(1, dtype=np.int64)
    seen = np.zeros(dem.shape[0], dtype=np.int64)
    stale = np.full(dem.shape[0], -1, dtype=np.int64)
    fullest = nodes[3].shape[0] == 1 and nodes[3][0] == FULLEST
    return build_trees(nodes, dem), log, count, seen, stale, fullest


@njit(cache=True)
def _changed(trees, entry):
    """Log a change of a node's free capacity (a repeat costs a tree one unchanged leaf)."""
    log, count = trees[1], trees[2]
    log[count[0]] = entry
    count[0] += 1


@njit(cache=True)
def _fits_key(free, n, dem, key):
    return (free[n, 0] + _EPS >= dem[key, 0] and free[n, 1] + _EPS >= dem[key, 1]
            and free[n, 2] + _EPS >= dem[key, 2])


@njit(cache=True)
def _place_lazy(nodes, dem, trees, key, m):
    """place_task on lazy trees: tree ``key`` re-scores the logged nodes, then places one task there."""
    tree, log, count, seen, stale, fullest = trees
    free = nodes[1]
    for i in range(seen[key], count[0]):
        e = log[i]
        if fullest and e >= 0 and e == tree[1][0, key, 1] and _fits_key(free, e, dem, key):
            stale[key] = e  # the root got fuller: still the root
            continue
        if stale[key] >= 0:
            set_leaf(tree, nodes, dem, key, stale[key])
            stale[key] = -1
        set_leaf(tree, nodes, dem, key, e if e >= 0 else -e - 1)
    seen[key] = count[0]
    n = tree[1][m, key, 1]
    if n >= 0:
        for r in range(3):
            free[n, r] -= dem[key, r]
        _changed(trees, n)
    return n


@njit(cache=True)
def _unplace(nodes, dem, trees, key, n):
    """Give back one task of demand ``dem[key]`` on node ``n`` (the inverse of ``_place_lazy``)."""
    free = nodes[1]
    for r in range(3):
        free[n, r] += dem[key, r]
    _changed(trees, -n - 1)


@njit(cache=True)
def _fill_mask(mask, caps_row, shapes, wd, pd, total, conserving):
    """Job ``g``'s mask: every cap-allowed row whose demand fits the free ``total``; wait always, or
    (``conserving``) only when no other row fits."""
    other = False
    for k in range(shapes.shape[0]):
        ok = caps_row[k]
        if ok and k > 0:
            for r in range(3):
                if shapes[k, 0] * wd[r] + shapes[k, 1] * pd[r] > total[r] + _EPS:
                    ok = False
            other = other or ok
        mask[k] = ok
    mask[0] = not (conserving and other)


@njit(cache=True)
def _place_role(nodes, dem, trees, key, m, g, role, placed, n_placed):
    """One task of job ``g`` in ``role``, placed by placement mode ``nodes[3][m]``: ``(rows of placed,
    placed?)``."""
    node = _place_lazy(nodes, dem, trees, key, m)
    if node < 0:
        return n_placed, False
    placed[n_placed, 0], placed[n_placed, 1], placed[n_placed, 2] = g, role, node
    return n_placed + 1, True


@njit(cache=True)
def _place_shape(nodes, dem, trees, wkey, pkey, m, g, want_w, want_p, placed, n_placed):
    """Worker, PS, worker, PS, … of job ``g`` until ``(want_w, want_p)``, by placement mode ``nodes[3][m]``;
    a role whose task finds no node stops; a job left without a worker or a PS gives back what it got.
    Returns ``(rows, w, p)``."""
    start = n_placed
    w = p = 0
    w_open, p_open = want_w > 0, want_p > 0
    while w_open or p_open:
        if w_open:
            n_placed, w_open = _place_role(nodes, dem, trees, wkey, m, g, _WORKER, placed, n_placed)
            w += w_open
            w_open = w_open and w < want_w
        if p_open:
            n_placed, p_open = _place_role(nodes, dem, trees, pkey, m, g, _PS, placed, n_placed)
            p += p_open
            p_open = p_open and p < want_p
    if w == 0 or p == 0:  # a job cannot train without both
        for i in range(start, n_placed):
            _unplace(nodes, dem, trees, wkey if placed[i, 1] == _WORKER else pkey, placed[i, 2])
        return start, 0, 0
    return n_placed, w, p


@njit(cache=True)
def shape_kernel(logits, order, caps, shapes, row_mode, wkey, pkey, dem, nodes, rng, forced_job, forced_row,
                  conserving, masks, actions, tasks, placed):
    """decide_shapes' loop; fills ``masks``/``actions``/``tasks`` and returns the rows of ``placed``
    (``(job index, role, node)`` in placement order). ``row_mode`` (K,): each menu row's index into the
    placement modes ``nodes[3]``."""
    trees = _lazy_trees(nodes, dem, 2 * placed.shape[0])
    free = nodes[1]
    total = np.zeros(3)
    for r in range(3):
        for n in range(free.shape[0]):
            total[r] += free[n, r]
    n_placed = 0
    for idx in range(order.shape[0]):
        g = order[idx]
        wd, pd = dem[wkey[g]], dem[pkey[g]]
        _fill_mask(masks[g], caps[g], shapes, wd, pd, total, conserving)
        if g == forced_job and masks[g, forced_row]:
            a = forced_row
        elif g == forced_job or rng is None:
            a = greedy_compiled(logits[g], masks[g])
        else:
            a = sample_compiled(logits[g], masks[g], rng)
        actions[g] = a
        n_placed, w, p = _place_shape(nodes, dem, trees, wkey[g], pkey[g], row_mode[a], g, shapes[a, 0],
                                      shapes[a, 1], placed, n_placed)
        tasks[g, 0], tasks[g, 1] = w, p
        for r in range(3):
            total[r] -= w * wd[r] + p * pd[r]
    return n_placed


@njit(cache=True)
def interleave(nodes, dem, wkey, pkey, order, job_mode, tasks, placed):
    """Place the decided ``tasks`` ``(n, 2)`` again from ``nodes``' free capacity, interleaved: in
    ``order``, every job's first worker and PS (both or neither), then rounds of one task per job
    (worker when ``got_w / want_w ≤ got_p / want_p``, else PS) until every job has its counts or its
    roles found no node; job ``g``'s tasks go by placement mode ``nodes[3][job_mode[g]]``. ``tasks``
    becomes what was placed; returns the rows of ``placed``."""
    trees = _lazy_trees(nodes, dem, 2 * placed.shape[0])
    want = tasks.copy()
    tasks[:, :] = 0
    n_placed = 0
    for idx in range(order.shape[0]):
        g = order[idx]
        if want[g, 0] == 0 or want[g, 1] == 0:
            want[g, 0] = want[g, 1] = 0
            continue
        start = n_placed
        n_placed, ok = _place_role(nodes, dem, trees, wkey[g], job_mode[g], g, _WORKER, placed, n_placed)
        if ok:
            n_placed, ok = _place_role(nodes, dem, trees, pkey[g], job_mode[g], g, _PS, placed, n_placed)
            if not ok:
                _unplace(nodes, dem, trees, wkey[g], placed[start, 2])
                n_placed = start
        if ok:
            tasks[g, 0] = tasks[g, 1] = 1
        else:
            want[g, 0] = want[g, 1] = 0
    more = True
    while more:
        more = False
        for idx in range(order.shape[0]):
            g = order[idx]
            w_left, p_left = want[g, 0] - tasks[g, 0], want[g, 1] - tasks[g, 1]
            if w_left <= 0 and p_left <= 0:
                continue
            behind = tasks[g, 0] * want[g, 1] <= tasks[g, 1] * want[g, 0]  # workers no further along than PS
            role = _WORKER if w_left > 0 and (p_left <= 0 or behind) else _PS
            key = wkey[g] if role == _WORKER else pkey[g]
            n_placed, ok = _place_role(nodes, dem, trees, key, job_mode[g], g, role, placed, n_placed)
            if ok:
                tasks[g, role] += 1
            else:
                want[g, role] = tasks[g, role]  # truncated: no node takes another task of this role
            more = True
    return n_placed
