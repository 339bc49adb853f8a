"""The shape policy: each job's ``(workers, PS)`` picked from a menu in one decision, jobs scored alike.

The paper's action space reaches a shape such as 3 PS : 1 worker through
several +1 steps, each an unlikely choice for a DRF-like policy, and its flat
MLP over a window of J rows learns every row separately. Here (issue 10, the
"shape" architecture, ``policy.arch: shape``):

**Menu.** ``K`` shapes, row 0 = ``(0, 0)`` (*wait*: the job gets nothing this
slot), then every ``(w, p)`` of ``policy.shape.menu_workers × menu_ps`` in
that order. A job's choice is one menu row.

**State.** Per job a feature row (:func:`job_features`, ``F = L + 8`` columns,
table below) and one global row (``G = 4``); no window: any number of jobs.

====================  ===================================================================
job columns           value
====================  ===================================================================
``0 .. L-1``          job type one-hot (catalogue order)
``L``                 remaining epochs / estimated epochs, clipped to [0, 1]
``L+1``               log10(1 + remaining epochs) / 5
``L+2``               slots run / ``policy.slots_run_scale``, clipped to [0, 1]
``L+3``               slots since arrival / ``policy.slots_run_scale``, clipped to [0, 1]
``L+4``               workers of the previous slot / 16, clipped to [0, 1]
``L+5``               PS of the previous slot / 16, clipped to [0, 1]
``L+6``               last observed epochs per slot / remaining epochs, clipped to [0, 1]
                      (≈ 1 / slots left at the last speed; 0 before the job ran)
``L+7``               1 if the job ran in the previous slot, else 0
====================  ===================================================================

Global columns: jobs / cluster GPUs (or CPUs / 2 without GPUs), jobs / 100,
and the cpu and gpu demand of every job at one worker + one PS over the
cluster's capacity (each clipped to [0, 4]).

**Profile features** (``policy.shape.profile_features``): the job type is
described by the operator's profile (:mod:`dl2ray.knowledge.profile`) instead of a
one-hot, so the policy runs on types it never saw. With ``c(p, w)`` the
profiled seconds per epoch of the job's type, ``R`` its remaining declared
epochs and ``m`` its *observed slowness* — the geometric mean over the slots it
trained of observed seconds per epoch over ``c`` at that slot's ``(p, w)``
(1 before it trained, clipped to [e⁻¹, e]) — and ``T₁ = R·c(1, 1)·m /
slot_seconds`` (slots to finish at one bundle), the job row is the 8 columns
above without the one-hot, then (``PROFILE_JOB = 4``):

====================  ===================================================================
``8``                 log10(1 + T₁) / 3
``9``                 ln m (in [-1, 1])
``10``                GPUs per worker (0 for CPU-only types), clipped to [0, 1]
``11``                ln(c(1, 1) / min over the menu of c) / 3: the profile's best speed-up
====================  ===================================================================

followed by ``ROW_DIM = 6`` columns for each menu row ``(w, p)`` (wait: zeros),
row-major: ln(c(p, w) / c(1, 1)) / 3 clipped to [-1, 1/3]; log10(1 + T₁·c(p, w)/c(1, 1)) / 3;
the row's dominant share of the cluster times the number of jobs, / 8, clipped
to [0, 1] (1: every job at this row would fill the cluster eight times); 1 if
the row is the job's previous deployment; w / 8; p / 16. So ``F = 12 + 6·K``.

**Scores.** A network shared by all jobs (:mod:`dl2ray.policy.shape_net`)
maps the ``(n, F)`` rows and the global row to ``(n, K)`` logits at once.

**Decision and placement**: :mod:`dl2ray.policy.shape_decode` (the menu loop, masks, placement), and
:mod:`dl2ray.policy.shape_fused` (features, network and decoder as one compiled pass, the deployed path).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from dl2ray.cluster import placement_mode
from dl2ray.view import ClusterView, JobPlacement, JobView

JOB_EXTRA = 8
"""Job feature columns after the type one-hot."""
PROFILE_JOB = 4
"""Job columns from the profile (profile features)."""
ROW_DIM = 6
"""Columns per menu row (profile features)."""
LAYOUT_DIM = 2
"""More columns per menu row with profile features and layouts: the layout's index / (layouts − 1), and its
gain (:func:`layout_gain_grid`)."""
SLOWNESS_SLOTS = 8
"""Trained slots (the most recent) the observed slowness ``m`` averages over."""
GRID = 16
"""Profile cost grids cover ``(p, w)`` in 1..GRID (larger counts use the edge)."""
GLOBAL_DIM = 4
WAIT = 0


@dataclass(frozen=True)
class ProfileTables:
    """Per job type ``t`` and menu row ``k``, what the profile columns take from the profile alone (module
    docstring), float64 before the features' float32: ``c11`` (L,) ``c(1, 1)``; ``rows`` (L, K) ``c(p, w)``
    of row ``k`` (``p``, ``w`` capped at :data:`GRID`; column 0, wait, unused); ``speedup`` (L, K) the row's
    first column ``ln(c(p, w) / c(1, 1)) / 3`` clipped (wait: 0); ``best`` (L,) the job column of the
    profile's best speed-up. Read-only."""

    c11: np.ndarray
    rows: np.ndarray
    speedup: np.ndarray
    best: np.ndarray

    @classmethod
    def of(cls, cost: np.ndarray, shapes: np.ndarray) -> ProfileTables:
        """From the ``(L, GRID, GRID)`` cost grid and the ``(K, 2)`` menu."""
        s = shapes[1:]
        c11 = cost[:, 0, 0]
        rows = np.zeros((cost.shape[0], shapes.shape[0]))
        rows[:, 1:] = cost[:, np.minimum(s[:, 1], GRID) - 1, np.minimum(s[:, 0], GRID) - 1]
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.log(rows[:, 1:] / c11[:, None])
        speedup = np.zeros_like(rows)
        speedup[:, 1:] = np.clip(np.nan_to_num(ratio, nan=1.0, posinf=1.0), -3.0, 1.0) / 3.0
        best = np.clip(-np.nanmin(np.where(np.isfinite(ratio), ratio, np.inf), axis=1), 0.0, 3.0) / 3.0
        for a in (c11, rows, speedup, best):
            a.setflags(write=False)
        return cls(c11, rows, speedup, best)


@dataclass(frozen=True)
class ShapeEncoding:
    """Dimensions of the shape policy's inputs and outputs; fixed by config and catalogue.

    ``profile``: profile features (module docstring); ``cost`` then holds the
    operator's profile as seconds per epoch, shape ``(L, GRID, GRID)`` indexed
    ``[type, p - 1, w - 1]`` (inf where the type cannot train) — None for an
    encoding that only describes a checkpoint's dimensions.
    """

    num_types: int
    menu: tuple[tuple[int, int], ...]  # (workers, PS) per menu row; row 0 is (0, 0)
    slots_run_scale: float = 100.0
    work_conserving: bool = True  # wait is allowed only when no other row fits (module docstring)
    profile: bool = False
    cost: np.ndarray | None = field(default=None, compare=False, repr=False)
    interleaved: bool = False  # placement: interleaved (True) or per-job (module docstring)
    layouts: tuple[str, ...] = ()  # placers a row may name ("Layouts"); (): the view's placer for every row
    gain: np.ndarray | None = field(default=None, compare=False, repr=False)
    """With profile features and layouts: ``(L, K)`` float32, row ``k``'s layout gain for a job of each type
    (:func:`layout_gain_grid`); None otherwise."""

    @classmethod
    def from_config(cls, cfg) -> ShapeEncoding:
        s = cfg.policy.shape
        menu = menu_rows(s.menu_workers, s.menu_ps, len(s.layouts))
        cost = profile_cost_grid(cfg) if s.profile_features else None
        enc = cls(len(cfg.catalogue), menu, cfg.policy.slots_run_scale, s.work_conserving,
                  s.profile_features, cost, s.placement == "interleaved", tuple(s.layouts))
        if s.profile_features and s.layouts:
            enc = dataclasses.replace(enc, gain=layout_gain_grid(cfg.catalogue, cfg.cluster.capacity, enc))
        return enc

    @property
    def row_dim(self) -> int:
        """Columns per menu row with profile features: :data:`ROW_DIM`, and two more with layouts."""
        return ROW_DIM + (LAYOUT_DIM if self.layouts else 0)

    @cached_property
    def row_layouts(self) -> np.ndarray:
        """``(K,)`` int64, read-only: the index in :attr:`layouts` of each row's placer (0 for wait, and for
        every row without layouts)."""
        per = max(len(self.layouts), 1)
        rows = np.array([0] + [(k - 1) % per for k in range(1, self.num_shapes)], dtype=np.int64)
        rows.setflags(write=False)
        return rows

    @cached_property
    def layout_modes(self) -> np.ndarray:
        """``(M,)`` int64: the placement mode of each layout (:func:`dl2ray.cluster.placement_mode`)."""
        return np.array([placement_mode(name) for name in self.layouts], dtype=np.int64)

    @cached_property
    def profile_tables(self) -> ProfileTables:
        """The profile columns that depend on a job's type and the menu row only, computed once
        (:class:`ProfileTables`); ValueError without the operator's profile."""
        if self.cost is None:
            raise ValueError("profile features need the operator's profile (ShapeEncoding.from_config)")
        return ProfileTables.of(self.cost, self.shapes)

    @cached_property
    def cost_lists(self) -> list:
        """``cost`` as nested Python lists (per-element reads from Python are 10× faster than numpy's)."""
        return [] if self.cost is None else self.cost.tolist()

    @property
    def job_columns(self) -> int:
        """Columns of a job's own part of its row (before the menu rows of profile features)."""
        return JOB_EXTRA + PROFILE_JOB if self.profile else self.num_types + JOB_EXTRA

    @property
    def job_dim(self) -> int:
        """``F``: ``L + 8``, or ``12 + 6·K`` with profile features."""
        return self.job_columns + (self.row_dim * self.num_shapes if self.profile else 0)

    @property
    def global_dim(self) -> int:
        return GLOBAL_DIM

    @property
    def num_shapes(self) -> int:
        """``K``, wait included."""
        return len(self.menu)

    @cached_property
    def shapes(self) -> np.ndarray:
        """``(K, 2)`` int64, read-only: workers, PS per menu row."""
        shapes = np.asarray(self.menu, dtype=np.int64)
        shapes.setflags(write=False)
        return shapes

    def nearest(self, workers: int, ps: int, layout: int = 0) -> int:
        """The menu row closest to ``(workers, ps)`` in log space, of layout ``layout`` (an index of
        :attr:`layouts`; wait for a job without both)."""
        if workers <= 0 or ps <= 0:
            return WAIT
        s = self.shapes[1:].astype(np.float64)
        d = np.abs(np.log(s[:, 0]) - math.log(workers)) + np.abs(np.log(s[:, 1]) - math.log(ps))
        return 1 + int(np.argmin(d)) + layout  # the layouts of one (w, p) are consecutive rows


def menu_rows(menu_workers, menu_ps, layouts: int = 0) -> tuple[tuple[int, int], ...]:
    """The menu: wait, then every ``(w, p)`` of ``menu_workers × menu_ps`` in that order, each repeated once
    per layout (``layouts`` of them; once without)."""
    per = max(layouts, 1)
    return ((0, 0), *((w, p) for w in menu_workers for p in menu_ps for _ in range(per)))


def layout_gain_grid(catalogue, capacity: np.ndarray, enc: ShapeEncoding) -> np.ndarray:
    """``(L, K)`` float32: for a job of each type, ``ln(t_spread / t_row)`` of each menu row clipped to
    [-1, 1] — the iteration-time gain of the row's layout over every task on a node of its own, by the
    published analytic PS model on the catalogue's constants (model size, compute time, bandwidths: what
    an operator knows, not the simulator's calibrated truth). The row's layout is where its placer puts
    its tasks (worker, PS, worker, …) on empty nodes of the cluster's largest capacity; wait is 0."""
    from dl2ray.cluster import make_placer
    from dl2ray.speed import analytic_iteration_time, layout_of, spread_layout

    node = largest_node(capacity)
    out = np.zeros((len(catalogue.types), enc.num_shapes), dtype=np.float32)
    for t, jt in enumerate(catalogue.types):
        wd, pd = jt.worker.as_array(), jt.ps.as_array()
        for k in range(1, enc.num_shapes):
            w, p = enc.menu[k]
            nodes = np.tile(node, (w + p, 1))
            placer = make_placer(nodes, nodes, enc.layouts[enc.row_layouts[k]], catalogue)
            for i in range(max(w, p)):
                if i < w:
                    placer.place(0, "worker", wd)
                if i < p:
                    placer.place(0, "ps", pd)
            pl = (placer.allocation().placement or {}).get(0)
            if pl is None or len(pl.worker_nodes) != w or len(pl.ps_nodes) != p:
                continue
            t_row = analytic_iteration_time(jt, layout_of(pl.worker_nodes, pl.ps_nodes))
            out[t, k] = np.clip(math.log(analytic_iteration_time(jt, spread_layout(w, p)) / t_row), -1.0, 1.0)
    out.setflags(write=False)
    return out


def layout_label(enc: ShapeEncoding, job: JobView, placement: JobPlacement | None, node: np.ndarray) -> int:
    """The layout (index of ``enc.layouts``) closest to where a teacher put ``job``'s tasks: a placer that
    spreads (load_balancing, tetris) is expected on one node per task, ``packing`` and ``optimus`` on the
    fewest nodes of capacity ``node`` (shape (3,)) the tasks fill; ties go to the first layout. 0 without
    layouts or tasks."""
    if len(enc.layouts) < 2 or placement is None:
        return 0
    w, p = len(placement.worker_nodes), len(placement.ps_nodes)
    if w + p == 0:
        return 0
    used = len(set(placement.worker_nodes) | set(placement.ps_nodes))
    need = w * job.worker_demand + p * job.ps_demand
    fewest = max(1, int(np.ceil(np.max(np.divide(need, node, out=np.zeros(3), where=node > 0)))))
    expected = [fewest if name in ("packing", "optimus") else w + p for name in enc.layouts]
    return int(np.argmin([abs(used - e) for e in expected]))


def largest_node(capacity: np.ndarray) -> np.ndarray:
    """Shape (3,): the largest node of a ``(N, 3)`` capacity (by cpu, then gpu, then mem)."""
    return np.asarray(capacity)[np.lexsort(np.asarray(capacity).T[::-1])][-1]


def profile_cost_grid(cfg) -> np.ndarray:
    """The config's operator profile in seconds per epoch, ``(L, GRID, GRID)`` (:class:`ShapeEncoding`)."""
    from dl2ray.knowledge.profile import config_profile

    cost = config_profile(cfg).seconds_per_epoch(cfg.catalogue)
    grid = np.empty((len(cfg.catalogue), GRID, GRID))
    for t in range(len(cfg.catalogue)):
        for p in range(1, GRID + 1):
            for w in range(1, GRID + 1):
                grid[t, p - 1, w - 1] = cost(t, p, w)
    grid.setflags(write=False)
    return grid


def job_features(view: ClusterView, enc: ShapeEncoding) -> tuple[np.ndarray, np.ndarray]:
    """``(X, g)``: job rows ``(n, F)`` float32 in view order and the global row ``(G,)`` float32."""
    jobs, n, L = view.jobs, len(view.jobs), enc.num_types
    x = np.zeros((n, enc.job_dim), dtype=np.float32)
    total = view.total_capacity
    if enc.profile:
        L = 0  # no one-hot: the 8 columns start at 0, the profile's follow
    wd = pd = np.zeros((0, 3))
    if n:
        # one pass over the jobs (per-job numpy calls would cost more than the arithmetic below)
        cols = np.array([(j.type_index, j.remaining_epochs, j.est_epochs, j.slots_run, j.arrival_slot,
                          j.workers, j.ps, _last_rate(j)) for j in jobs], dtype=np.float64)
        ti, rem, est, run, arrival, workers, ps, rate = cols.T
        if not enc.profile:
            x[np.arange(n), ti.astype(np.int64)] = 1.0
        x[:, L] = np.clip(rem / est, 0.0, 1.0)
        x[:, L + 1] = np.log10(1.0 + rem) / 5.0
        scale = enc.slots_run_scale
        x[:, L + 2] = np.clip(run / scale, 0.0, 1.0)
        x[:, L + 3] = np.clip((view.slot - arrival) / scale, 0.0, 1.0)
        x[:, L + 4] = np.clip(workers / 16.0, 0.0, 1.0)
        x[:, L + 5] = np.clip(ps / 16.0, 0.0, 1.0)
        x[:, L + 6] = np.clip(rate * view.slot_seconds / rem, 0.0, 1.0)
        x[:, L + 7] = (workers > 0) & (ps > 0)
        wd = np.array([j.worker_demand for j in jobs], dtype=np.float64)
        pd = np.array([j.ps_demand for j in jobs], dtype=np.float64)
        if enc.profile:
            _profile_columns(view, enc, x, rem, ti.astype(np.int64), workers, ps, wd, pd, total)
    units = total[1] if total[1] > 0 else total[0] / 2.0
    bundle = (wd + pd).sum(axis=0)  # row by row, in view order
    load = np.where(total > 0, bundle / np.where(total > 0, total, 1.0), 0.0)
    g = np.array([min(n / max(units, 1.0), 4.0), n / 100.0, min(load[0], 4.0), min(load[1], 4.0)],
                 dtype=np.float32)
    return x, g


def observed_slowness(job, cost: np.ndarray) -> float:
    """``m``: geometric mean over the job's last :data:`SLOWNESS_SLOTS` trained slots of observed s/epoch over
    the profile's at that slot's ``(p, w)`` (1 before it trained), clipped to [e⁻¹, e]; ``cost`` is the
    ``(GRID, GRID)`` grid of the job's type (an array, or nested lists: faster from Python)."""
    total, count = 0.0, 0
    for o in reversed(job.history):
        if o.epochs > 0 and o.seconds > 0:
            p = o.ps if o.ps < GRID else GRID
            w = o.workers if o.workers < GRID else GRID
            total += math.log(o.seconds / o.epochs / cost[p - 1][w - 1])
            count += 1
            if count == SLOWNESS_SLOTS:
                break
    if not count:
        return 1.0
    mean = total / count
    return math.exp(-1.0 if mean < -1.0 else 1.0 if mean > 1.0 else mean)


def _profile_columns(view: ClusterView, enc: ShapeEncoding, x: np.ndarray, rem: np.ndarray, ti: np.ndarray,
                     workers: np.ndarray, ps: np.ndarray, wd: np.ndarray, pd: np.ndarray,
                     total: np.ndarray) -> None:
    """Fill the profile columns of ``x`` (n, F) in place (module docstring), from the jobs' columns that
    :func:`job_features` read: remaining epochs, type index, workers and PS (n,), demands (n, 3), and the
    cluster's total capacity (3,)."""
    tab = enc.profile_tables
    jobs, n, k = view.jobs, len(view.jobs), enc.num_shapes
    shapes = enc.shapes[1:]
    c11 = tab.c11[ti]
    rows = tab.rows[ti, 1:]  # (n, K-1)
    lists = enc.cost_lists
    slow = np.array([observed_slowness(j, lists[j.type_index]) for j in jobs], dtype=np.float64)
    t1 = rem * c11 * slow / view.slot_seconds
    c = JOB_EXTRA
    x[:, c] = np.log10(1.0 + t1) / 3.0
    x[:, c + 1] = np.log(slow)
    x[:, c + 2] = np.clip(wd[:, 1], 0.0, 1.0)
    x[:, c + 3] = tab.best[ti]
    inv = np.divide(1.0, total, out=np.zeros(3), where=total > 0)
    share = ((shapes[None, :, 0, None] * wd[:, None, :] + shapes[None, :, 1, None] * pd[:, None, :])
             * inv).max(axis=2)  # (n, K-1)
    prev = (shapes[None, :, 0] == workers[:, None]) & (shapes[None, :, 1] == ps[:, None])
    r = x[:, enc.job_columns:].reshape(n, k, enc.row_dim)
    r[:, 1:, 0] = tab.speedup[ti, 1:]
    r[:, 1:, 1] = np.log10(1.0 + np.minimum(t1[:, None] * rows / c11[:, None], 1e6)) / 3.0
    r[:, 1:, 2] = np.clip(share * n / 8.0, 0.0, 1.0)
    r[:, 1:, 3] = prev
    r[:, 1:, 4] = shapes[None, :, 0] / 8.0
    r[:, 1:, 5] = shapes[None, :, 1] / 16.0
    if enc.layouts:
        if enc.gain is None:
            raise ValueError("layout features need the catalogue's constants (ShapeEncoding.from_config)")
        r[:, 1:, ROW_DIM] = enc.row_layouts[1:] / max(len(enc.layouts) - 1, 1)
        r[:, 1:, ROW_DIM + 1] = enc.gain[ti, 1:]


def _last_rate(job) -> float:
    """Epochs per second in the job's most recent slot that trained (0 if it never ran)."""
    rate = job.observed_speed()
    return 0.0 if rate is None else rate
