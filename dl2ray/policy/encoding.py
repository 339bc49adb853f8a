"""State, action and mask of the DL2 policy for one window of jobs (pure numpy).

**Window.** The jobs of a :class:`~dl2ray.view.ClusterView` in arrival order
are cut into consecutive windows of ``J`` jobs; a slot's decision runs the
incremental loop on window 0, then (with what capacity is left) on window 1,
and so on (the DL2 paper's Fig. 17 behaviour for more than J jobs).

**State**, shape ``(J, L+5)`` float32, flattened row-major to ``(J·(L+5),)``.
Row ``i`` describes the i-th job of the window (all zeros if there is none):

====================  ===================================================================
columns               value
====================  ===================================================================
``0 .. L-1``          job type one-hot (catalogue order, L types)
``L``                 slots run / ``policy.slots_run_scale``, clipped to [0, 1]
``L+1``               remaining epochs / estimated epochs, clipped to [0, 1]
``L+2``               dominant-resource share allocated so far this slot / c, where c is
                      the largest share any catalogue type reaches at its caps on this
                      cluster: in [0, 1], scale-free across cluster sizes (one bundle is
                      ~0.08 on both 13 and 500 nodes) and order-preserving across jobs
``L+3``               workers allocated so far this slot / the type's worker cap
``L+4``               PS allocated so far this slot / the type's PS cap
====================  ===================================================================

Only columns ``L+2 .. L+4`` change during a slot's decision, and only in the
row of the job an action touched (:meth:`SlotState.apply` returns that delta,
so a policy can update its first layer incrementally).

**Actions**, ``3J+1``: ``i`` = +1 worker for job i, ``J+i`` = +1 PS,
``2J+i`` = +1 worker and +1 PS, ``3J`` = stop (end this window).

**Mask**, shape ``(3J+1,)`` bool, True = allowed. An action for job i is
masked when row i is empty, when it would exceed the job's worker/PS cap, or
when no node can host the task (for the bundle: when the placer cannot place
a worker and then a PS, exactly what :meth:`Placer.place_bundle` would do).
Stop is always allowed; the loop ends a window without asking the policy when
only stop is left.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dl2ray.view import Allocation, ClusterView, JobView

FEATURES = 5
"""Per-job columns after the type one-hot: slots, remaining, share, workers, PS."""

_EPS = 1e-9  # as dl2ray.cluster: capacity comparisons tolerate float rounding
_COL_SLOTS, _COL_REMAINING, _COL_SHARE, _COL_WORKERS, _COL_PS = range(FEATURES)
WORKER, PS, BUNDLE, STOP = 0, 1, 2, 3


@dataclass(frozen=True)
class Encoding:
    """Dimensions and normalisers of the state; fixed by config and catalogue."""

    window: int
    num_types: int
    slots_run_scale: float = 100.0

    @classmethod
    def from_config(cls, cfg) -> Encoding:
        """From an :class:`~dl2ray.config.ExperimentConfig` (its ``policy`` group)."""
        return cls(cfg.policy.window, len(cfg.catalogue), cfg.policy.slots_run_scale)

    @property
    def row_dim(self) -> int:
        return self.num_types + FEATURES

    @property
    def state_dim(self) -> int:
        """``J·(L+5)``."""
        return self.window * self.row_dim

    @property
    def action_dim(self) -> int:
        """``3J+1``."""
        return 3 * self.window + 1

    @property
    def stop(self) -> int:
        return 3 * self.window

    def action(self, kind: int, row: int) -> int:
        """Action index of ``kind`` (WORKER, PS, BUNDLE) for window row ``row``, or STOP."""
        return self.stop if kind == STOP else kind * self.window + row

    def split(self, action: int) -> tuple[int, int]:
        """``(kind, row)`` of an action index; ``(STOP, -1)`` for stop."""
        if action == self.stop:
            return STOP, -1
        if not 0 <= action < self.stop:
            raise ValueError(f"action {action} outside 0..{self.stop}")
        return divmod(action, self.window)


@dataclass(frozen=True)
class JobArrays:
    """Everything about a view's jobs that the decision loop reads, padded to whole windows.

    ``P = num_windows·J`` rows in job order; padding rows have ``present`` False
    and zeros elsewhere. Demands are indices into ``demands``, the distinct task
    demand vectors of the jobs (workers and PS together).
    """

    static: np.ndarray      # (num_windows, J, L+5) float32: the state with nothing allocated yet
    present: np.ndarray     # (P,) bool
    max_workers: np.ndarray  # (P,) int64 caps (0 for padding)
    max_ps: np.ndarray      # (P,) int64
    wkey: np.ndarray        # (P,) int64: row of ``demands`` of the job's worker
    pkey: np.ndarray        # (P,) int64: row of ``demands`` of the job's PS
    demands: np.ndarray     # (K, 3) float64 distinct task demands (cpu, gpu, mem)
    wshare: np.ndarray      # (P, 3) float64: worker demand / cluster total, per resource
    pshare: np.ndarray      # (P, 3) float64: PS demand / cluster total
    share_scale: float      # 1 / c (column L+2 is the dominant share · share_scale, capped at 1)

    @classmethod
    def of(cls, view: ClusterView, enc: Encoding) -> JobArrays:
        J, L, cat = enc.window, enc.num_types, view.catalogue
        if len(cat) != L:
            raise ValueError(f"encoding has {L} job types, the view's catalogue {len(cat)}")
        jobs, m = view.jobs, len(view.jobs)
        P = max(1, -(-m // J)) * J
        total = view.total_capacity
        inv_total = np.where(total > 0, 1.0 / np.where(total > 0, total, 1.0), 0.0)
        caps = np.array([[t.max_workers, t.max_ps] for t in cat.types], dtype=np.float64)
        at_caps = (caps[:, :1] * cat.worker_demand + caps[:, 1:] * cat.ps_demand) * inv_total
        x = np.zeros((P, L + FEATURES), dtype=np.float32)
        present = np.zeros(P, dtype=bool)
        present[:m] = True
        maxw, maxp = np.zeros(P, dtype=np.int64), np.zeros(P, dtype=np.int64)
        wkey, pkey = np.zeros(P, dtype=np.int64), np.zeros(P, dtype=np.int64)
        wshare, pshare = np.zeros((P, 3)), np.zeros((P, 3))
        demands = np.zeros((0, 3))
        if m:
            ti = np.fromiter((j.type_index for j in jobs), np.int64, m)
            x[np.arange(m), ti] = 1.0
            slots = np.fromiter((j.slots_run for j in jobs), np.float64, m)
            x[:m, L + _COL_SLOTS] = np.clip(slots / enc.slots_run_scale, 0.0, 1.0)
            rem = np.fromiter((j.remaining_epochs / j.est_epochs for j in jobs), np.float64, m)
            x[:m, L + _COL_REMAINING] = np.clip(rem, 0.0, 1.0)
            maxw[:m] = [j.max_workers for j in jobs]
            maxp[:m] = [j.max_ps for j in jobs]
            wd = np.array([j.worker_demand for j in jobs], dtype=np.float64).reshape(m, 3)
            pd = np.array([j.ps_demand for j in jobs], dtype=np.float64).reshape(m, 3)
            index: dict[tuple[float, ...], int] = {}  # distinct demand → its row, first seen first
            wkey[:m] = [index.setdefault(tuple(d), len(index)) for d in wd.tolist()]
            pkey[:m] = [index.setdefault(tuple(d), len(index)) for d in pd.tolist()]
            demands = np.array(list(index), dtype=np.float64)
            wshare[:m], pshare[:m] = wd * inv_total, pd * inv_total
        return cls(x.reshape(-1, J, L + FEATURES), present, maxw, maxp, wkey, pkey,
                   np.ascontiguousarray(demands), wshare, pshare, 1.0 / max(float(at_caps.max()), 1e-12))


def _fits(free, demand) -> bool:
    """``free + ε ≥ demand`` in every resource (as :class:`~dl2ray.cluster.Placer` tests it)."""
    return free[0] + _EPS >= demand[0] and free[1] + _EPS >= demand[1] and free[2] + _EPS >= demand[2]


class InfeasibleAction(ValueError):
    """An action the mask forbids was applied."""


class SlotState:
    """The incremental decision state of one slot over one view.

    Holds the tentative placement (a :class:`~dl2ray.cluster.Placer` over the
    view's free capacity) and, for the current window, the state matrix, the
    task counts and the mask. Use: ``for k in range(s.num_windows): s.begin(k)``
    then alternate :meth:`mask` / :meth:`apply`; finally :meth:`allocation`.

    This is the step-by-step reference of the decision loop (any chooser can
    drive it); :func:`dl2ray.policy.decision.run_decision` runs a plain policy
    chooser through an equivalent compiled loop instead.
    """

    def __init__(self, view: ClusterView, enc: Encoding) -> None:
        self.arrays = JobArrays.of(view, enc)
        self.view, self.enc = view, enc
        self.placer = view.placer()
        # Free capacity per node, mirrored from every placement (to test a bundle on one node).
        self._free: list[list[float]] = view.free.tolist()
        self._n = len(view.jobs)
        self._demands = list(self.arrays.demands)
        self.window_index = -1

    @property
    def num_windows(self) -> int:
        """``ceil(n / J)`` (at least 1, so an empty view still yields one empty window)."""
        return max(1, -(-self._n // self.enc.window))

    @property
    def jobs(self) -> tuple[JobView, ...]:
        """The jobs of the current window (row order)."""
        return self._jobs

    def begin(self, k: int) -> None:
        """Make window ``k`` (jobs ``kJ .. kJ+J-1``) current and encode it."""
        J, a = self.enc.window, self.arrays
        rows = slice(k * J, (k + 1) * J)
        self.window_index, self._jobs = k, self.view.jobs[rows]
        self._x = a.static[k].copy()
        self._present = a.present[rows]
        self._w = [0] * J
        self._p = [0] * J
        self._maxw, self._maxp = a.max_workers[rows], a.max_ps[rows]
        self._wk, self._pk = a.wkey[rows], a.pkey[rows]
        self._wshare_rows = a.wshare[rows].tolist()
        self._pshare_rows = a.pshare[rows].tolist()
        m = len(self._jobs)
        self._pairs = sorted({(int(w), int(p)) for w, p in zip(self._wk[:m], self._pk[:m], strict=True)})
        self._fits: tuple[list[bool], dict[tuple[int, int], bool]] | None = None
        self._mask = np.zeros(self.enc.action_dim, dtype=bool)
        self._fresh = False

    def state(self) -> np.ndarray:
        """Shape ``(J·(L+5),)`` float32; a view that later actions change (copy to keep)."""
        return self._x.reshape(-1)

    def matrix(self) -> np.ndarray:
        """Shape ``(J, L+5)``: the same state, one row per job."""
        return self._x

    def counts(self, row: int) -> tuple[int, int]:
        """Workers and PS given so far this slot to the job of window row ``row``."""
        return self._w[row], self._p[row]

    def mask(self) -> np.ndarray:
        """Shape ``(3J+1,)`` bool (see the module docstring); a view, copy to keep."""
        if not self._fresh:
            fits = self._evaluate_fits()
            if fits != self._fits:
                self._fits = fits
                self._full_mask()
            self._fresh = True
        return self._mask

    def apply(self, action: int) -> tuple[int, np.ndarray]:
        """Place the tasks of ``action`` (not stop); returns ``(row, delta)``.

        ``delta`` (shape (3,), float32) is the change of state columns
        ``L+2 .. L+4`` of ``row``. Raises :class:`InfeasibleAction` for a
        masked action (the placer is then unchanged).
        """
        kind, i = self.enc.split(action)
        self.mask()  # current unless something was placed since the last call
        if kind == STOP or not self._mask_entry(kind, i):
            raise InfeasibleAction(f"action {action} is masked")
        job = self._jobs[i]
        ok = True
        if kind != PS:
            ok = self._place(job.job_id, "worker", job.worker_demand)
        if ok and kind != WORKER and not self._place(job.job_id, "ps", job.ps_demand):
            if kind == BUNDLE:  # as Placer.place_bundle: both or neither
                self.placer.unplace(job.job_id, "worker", job.worker_demand)
                self._release_last(job.worker_demand)
            ok = False
        if not ok:  # the mask said it fits; the placer is the authority
            raise InfeasibleAction(f"action {action}: placer refused a task the mask allowed")
        self._w[i] += kind != PS
        self._p[i] += kind != WORKER
        L = self.enc.num_types
        new = self._dynamic(i)
        delta = new - self._x[i, L + _COL_SHARE:]
        self._x[i, L + _COL_SHARE:] = new
        self._fresh = False
        self._update_row_mask(i)
        return i, delta

    def allocation(self) -> Allocation:
        """Everything placed so far (all windows), with explicit placement."""
        return self.placer.allocation()

    # -- internals ------------------------------------------------------------------

    def _dynamic(self, i: int) -> np.ndarray:
        w, p = self._w[i], self._p[i]
        ws, ps = self._wshare_rows[i], self._pshare_rows[i]
        share = max(w * ws[0] + p * ps[0], w * ws[1] + p * ps[1], w * ws[2] + p * ps[2])
        return np.array(
            [min(share * self.arrays.share_scale, 1.0), w / self._maxw[i], p / self._maxp[i]],
            dtype=np.float32,
        )

    def _place(self, job_id: int, role: str, demand: np.ndarray) -> bool:
        node = self.placer.place(job_id, role, demand)
        if node is None:
            return False
        f = self._free[node]
        f[0] -= demand[0]
        f[1] -= demand[1]
        f[2] -= demand[2]
        self._last_node = node
        return True

    def _release_last(self, demand: np.ndarray) -> None:
        f = self._free[self._last_node]
        f[0] += demand[0]
        f[1] += demand[1]
        f[2] += demand[2]

    def _evaluate_fits(self) -> tuple[list[bool], dict[tuple[int, int], bool]]:
        """Can a task of each distinct demand, and a bundle of each (worker, PS) pair, be placed now?"""
        node = [self.placer.peek(d) for d in self._demands]
        bf = {(wk, pk): self._bundle_fits(node[wk], node[pk], wk, pk) for wk, pk in self._pairs}
        return [n is not None for n in node], bf

    def _bundle_fits(self, a: int | None, b: int | None, wk: int, pk: int) -> bool:
        """Would a worker then a PS be placed (as :meth:`Placer.place_bundle` does)?

        The worker goes to node ``a`` (the placer's choice for it). If the PS's
        node ``b`` is another node it still fits after that; if it is the same,
        the bundle fits when ``a`` holds both. Otherwise (rare: a nearly full
        cluster) the PS needs ``a`` after the worker, or any other node: a worker
        and a PS may each fit somewhere yet not both. Reads, never changes, the placement.
        """
        if a is None or b is None:
            return False
        if a != b:
            return True
        wd, pd = self._demands[wk], self._demands[pk]
        f = self._free[a]
        both = (wd[0] + pd[0], wd[1] + pd[1], wd[2] + pd[2])
        after_worker = (f[0] - wd[0], f[1] - wd[1], f[2] - wd[2])
        if _fits(f, both) or _fits(after_worker, pd):
            return True
        return any(_fits(g, pd) for n, g in enumerate(self._free) if n != a)

    def _full_mask(self) -> None:
        assert self._fits is not None
        fit, bf = self._fits
        J = self.enc.window
        w, p = np.asarray(self._w), np.asarray(self._p)
        wroom = self._present & (w < self._maxw)
        proom = self._present & (p < self._maxp)
        fit_arr = np.asarray(fit or [False], dtype=bool)  # no jobs: no demands
        bfit = np.array([bf.get((int(a), int(b)), False) for a, b in zip(self._wk, self._pk, strict=True)],
                        dtype=bool)
        m = self._mask
        m[:J] = wroom & fit_arr[self._wk]
        m[J:2 * J] = proom & fit_arr[self._pk]
        m[2 * J:3 * J] = wroom & proom & bfit
        m[3 * J] = True

    def _mask_entry(self, kind: int, i: int) -> bool:
        return bool(self._mask[kind * self.enc.window + i])

    def _update_row_mask(self, i: int) -> None:
        """After an action on row i: only its caps changed (fits are rechecked in mask())."""
        if self._fits is None:
            return
        fit, bf = self._fits
        J = self.enc.window
        wk, pk = int(self._wk[i]), int(self._pk[i])
        wroom = self._w[i] < self._maxw[i]
        proom = self._p[i] < self._maxp[i]
        self._mask[i] = wroom and fit[wk]
        self._mask[J + i] = proom and fit[pk]
        self._mask[2 * J + i] = wroom and proom and bf.get((wk, pk), False)


def encode_window(view: ClusterView, enc: Encoding, k: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """State ``(J·(L+5),)`` and mask ``(3J+1,)`` of window ``k`` with nothing allocated yet."""
    s = SlotState(view, enc)
    s.begin(k)
    return s.state().copy(), s.mask().copy()
