"""Nodes, capacities and the placement policies.

A :class:`Placer` is a *tentative* placement over one cluster snapshot: a
scheduler asks it, task by task, to place a worker or a PS of a job, and it
answers with a node (or ``None`` when no node can host the task). What it
accepted is feasible by construction, so a scheduler that decides through a
placer never produces an over-capacity allocation; :meth:`Placer.allocation`
turns it into an :class:`~dl2ray.view.Allocation` with explicit placement.

Policies (:data:`PLACEMENTS`; each scheduler carries its own, ``ClusterConfig.placement`` may force one
on all, see :mod:`dl2ray.schedulers.placed`):

- ``load_balancing`` — least-used node first (the DL2 paper's cluster default). "Used" is the
  node's dominant usage over the resources the task asks for,
  ``max_{r: d_r > 0} used_r / capacity_r`` — so a PS (CPU only) is not kept
  off a node merely because its GPUs are busy, and does not eat the CPU of
  nodes whose GPUs are idle; ties go to the lowest node index.
- ``packing`` — fullest node that fits first (fewest nodes in use), "full"
  measured the same way.
- ``optimus`` — the Optimus principle: each job's PS and workers spread
  evenly over the fewest nodes that fit them. Tasks are placed by packing
  while a scheduler decides; :meth:`Placer.allocation` then lays every job
  out again by the principle (largest jobs first) and keeps the packed
  layout only if that re-layout does not fit.
- ``tetris`` — Tetris's alignment (Grandl et al., SIGCOMM 2014, §3.2): the
  node whose free resources align best with the task's demand,
  ``max_n Σ_r (d_r / C_nr)(F_nr / C_nr)``; ties go to the lowest node index.
  On identical nodes that is the node with the most free capacity in the
  resources the task asks for, so it spreads much as ``load_balancing`` does.

Speed: every policy keeps one lazy heap per distinct task demand of the
catalogue, holding exactly the nodes that can host that demand, so a
placement costs O(K log N) for K distinct demands (K = 3 for the testbed
catalogue) instead of a scan of all N nodes.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

import numpy as np

from dl2ray.allocation import Allocation, JobPlacement, Tasks
from dl2ray.workload import JobCatalogue

_EPS = 1e-9
Role = str  # "worker" or "ps"
Key = tuple[float, float, float]

PLACEMENTS = ("load_balancing", "packing", "optimus", "tetris")
"""Every placement policy a :class:`Placer` implements."""
LEAST_USED, FULLEST, ALIGNED = 1, -1, 2
"""A placer's node order (``mode``): least-used first, fullest first, best Tetris alignment first."""


def _key(demand: np.ndarray) -> Key:
    """A demand vector as a hashable (cpu, gpu, mem) tuple of floats."""
    return (float(demand[0]), float(demand[1]), float(demand[2]))


def _initial_heap(
    capacity: np.ndarray, free: np.ndarray, inv: np.ndarray, key: Key, mode: int
) -> list[tuple[float, int, int]]:
    """``(score, node, version 0)`` of every node that fits ``key``, heapified.

    The same numbers as :meth:`Placer._score` / :meth:`Placer._fits` (the same
    float operations, node by node), computed over all nodes at once.
    """
    d = np.array(key)
    fits = np.all(free + _EPS >= d, axis=1)
    if mode == ALIGNED:
        score = np.zeros(len(free))
        for r in (0, 1, 2):
            score = score + key[r] * free[:, r] * inv[:, r] * inv[:, r]
        score = -score
    else:
        used = np.zeros(len(free))
        for r in (0, 1, 2):
            if key[r] > 0:
                used = np.maximum(used, (capacity[:, r] - free[:, r]) * inv[:, r])
        score = mode * used
    nodes = np.flatnonzero(fits)
    heap = list(zip(score[nodes].tolist(), nodes.tolist(), [0] * len(nodes), strict=True))
    heapq.heapify(heap)
    return heap


class Placer:
    """Tentative task placement over a ``(N, 3)`` free-capacity snapshot.

    ``mode``: :data:`LEAST_USED` (+1) picks the least-used fitting node, :data:`FULLEST` (-1) the
    fullest one, :data:`ALIGNED` (2) the one with the best Tetris alignment.
    """

    def __init__(
        self,
        capacity: np.ndarray,
        free: np.ndarray,
        demands: Iterable[np.ndarray] = (),
        mode: int = LEAST_USED,
    ) -> None:
        capacity = np.asarray(capacity, dtype=np.float64)
        free = np.asarray(free, dtype=np.float64)
        inv = np.divide(1.0, capacity, out=np.zeros_like(capacity), where=capacity > 0)
        self._cap: list[list[float]] = capacity.tolist()
        self._free: list[list[float]] = free.tolist()
        self._inv: list[list[float]] = inv.tolist()
        self._mode = mode
        self._version = [0] * len(self._cap)
        self._workers: dict[int, list[int]] = {}
        self._ps: dict[int, list[int]] = {}
        self._failed: list[tuple[float, float, float]] = []
        self._heaps: dict[tuple[float, float, float], list[tuple[float, int, int]]] = {}
        for d in demands:
            key = _key(d)
            if key not in self._heaps:
                self._heaps[key] = _initial_heap(capacity, free, inv, key, mode)

    # -- public API -----------------------------------------------------------------

    @property
    def num_nodes(self) -> int:
        return len(self._cap)

    def free(self) -> np.ndarray:
        """Shape (N, 3): free capacity after what was placed so far."""
        return np.array(self._free, dtype=np.float64)

    def tasks(self, job_id: int) -> Tasks:
        return Tasks(len(self._workers.get(job_id, ())), len(self._ps.get(job_id, ())))

    def job_ids(self) -> list[int]:
        """Jobs with at least one task, in the order they got their first."""
        return list(dict.fromkeys([*self._workers, *self._ps]))

    def place(self, job_id: int, role: Role, demand: np.ndarray) -> int | None:
        """Place one task; return its node, or None (nothing changes) if none fits."""
        key = _key(demand)
        if self._known_to_fail(key):
            return None
        node = self._peek(key)
        if node is None:
            self._failed.append(key)
            return None
        self._assign(job_id, role, demand, node)
        return node

    def place_bundle(self, job_id: int, worker_demand: np.ndarray, ps_demand: np.ndarray) -> bool:
        """Place one worker and one PS (each where the policy puts it), or neither.

        (The published DL2 simulator put a bundle's two tasks on one node. With
        the analytic PS model that crowds every node's link with both worker and
        PS traffic once a job has several bundles: it was 1.5× slower on the
        large config, so tasks are placed one by one.)
        """
        if self.place(job_id, "worker", worker_demand) is None:
            return False
        if self.place(job_id, "ps", ps_demand) is None:
            self.unplace(job_id, "worker", worker_demand)
            return False
        return True

    def _assign(self, job_id: int, role: Role, demand: np.ndarray, node: int) -> None:
        self._take(node, _key(demand), -1.0)
        (self._workers if role == "worker" else self._ps).setdefault(job_id, []).append(node)

    def unplace(self, job_id: int, role: Role, demand: np.ndarray) -> None:
        """Remove the most recently placed task of ``role`` of ``job_id``."""
        book = self._workers if role == "worker" else self._ps
        nodes = book.get(job_id)
        if not nodes:
            raise ValueError(f"job {job_id} has no {role} to remove")
        node = nodes.pop()
        if not nodes:
            del book[job_id]
        self._take(node, _key(demand), +1.0)
        self._failed.clear()

    def can_place(self, demand: np.ndarray) -> bool:
        """Would :meth:`place` succeed for this demand right now?"""
        return self.peek(demand) is not None

    def peek(self, demand: np.ndarray) -> int | None:
        """The node :meth:`place` would choose for this demand now (None: none fits).

        Places nothing; lets a scheduler score a candidate by its node (Tetris).
        """
        key = _key(demand)
        return None if self._known_to_fail(key) else self._peek(key)

    def allocation(self) -> Allocation:
        """The tasks placed so far as an Allocation with explicit placement."""
        tasks = {j: self.tasks(j) for j in self.job_ids()}
        placement = {
            j: JobPlacement(tuple(self._workers.get(j, ())), tuple(self._ps.get(j, ())))
            for j in tasks
        }
        return Allocation(tasks, placement)

    # -- internals ------------------------------------------------------------------

    def _score(self, node: int, key: Key) -> float:
        """Smaller is preferred: ``mode ×`` the node's dominant usage over the resources ``key`` asks for,
        or (:data:`ALIGNED`) minus the alignment ``Σ_r key_r · free_r / capacity_r²``."""
        cap, free, inv = self._cap[node], self._free[node], self._inv[node]
        if self._mode == ALIGNED:
            a = 0.0
            for r in (0, 1, 2):
                a += key[r] * free[r] * inv[r] * inv[r]
            return -a
        used = 0.0
        for r in (0, 1, 2):
            if key[r] > 0:
                used = max(used, (cap[r] - free[r]) * inv[r])
        return self._mode * used

    def _fits(self, node: int, key: tuple[float, float, float]) -> bool:
        f = self._free[node]
        return f[0] + _EPS >= key[0] and f[1] + _EPS >= key[1] and f[2] + _EPS >= key[2]

    def _known_to_fail(self, key: tuple[float, float, float]) -> bool:
        # Within one decision nodes only fill up, so a demand at least as large
        # as one that already failed fails too (cleared on every release).
        return any(
            key[0] >= f[0] and key[1] >= f[1] and key[2] >= f[2] for f in self._failed
        )

    def _peek(self, key: tuple[float, float, float]) -> int | None:
        heap = self._heaps.get(key)
        if heap is None:
            return self._scan(key)
        while heap:
            _, node, version = heap[0]
            if version == self._version[node] and self._fits(node, key):
                return node
            heapq.heappop(heap)
        return None

    def _scan(self, key: tuple[float, float, float]) -> int | None:
        """Linear fallback for a demand the catalogue does not list."""
        best: tuple[float, int] | None = None
        for n in range(len(self._cap)):
            if self._fits(n, key):
                cand = (self._score(n, key), n)
                if best is None or cand < best:
                    best = cand
        return None if best is None else best[1]

    def _take(self, node: int, key: tuple[float, float, float], sign: float) -> None:
        f = self._free[node]
        f[0] += sign * key[0]
        f[1] += sign * key[1]
        f[2] += sign * key[2]
        self._version[node] += 1
        version = self._version[node]
        for dkey, heap in self._heaps.items():
            if self._fits(node, dkey):
                heapq.heappush(heap, (self._score(node, dkey), node, version))


class OptimusPlacer(Placer):
    """Packs while deciding; lays each job out by the Optimus principle at the end."""

    def __init__(self, capacity: np.ndarray, free: np.ndarray, demands: list[np.ndarray]) -> None:
        super().__init__(capacity, free, demands, mode=FULLEST)
        self._initial_free = free.copy()
        self._job_demands: dict[int, tuple[np.ndarray | None, np.ndarray | None]] = {}

    def _assign(self, job_id: int, role: Role, demand: np.ndarray, node: int) -> None:
        super()._assign(job_id, role, demand, node)
        wd, pd = self._job_demands.get(job_id, (None, None))
        self._job_demands[job_id] = (demand, pd) if role == "worker" else (wd, demand)

    def allocation(self) -> Allocation:
        return final_layout("optimus", self._initial_free, super().allocation(), self._job_demands)


def _even_split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def optimus_layout(
    free: np.ndarray,
    packed: Allocation,
    demands: dict[int, tuple[np.ndarray | None, np.ndarray | None]],
) -> Allocation | None:
    """Lay out every job of ``packed`` over the fewest nodes, tasks spread evenly.

    Jobs go largest first; for k = 1, 2, ... the job's workers and PS are split
    into k near-equal groups (one worker group and one PS group per node) and
    the groups are put on the k nodes with the most free capacity that fit
    them. Returns None if some job cannot be laid out this way.
    """
    free = free.copy()
    zero = np.zeros(3)
    out: dict[int, JobPlacement] = {}
    order = sorted(packed.tasks, key=lambda j: -(packed.tasks[j].workers + packed.tasks[j].ps))
    for job_id in order:
        t = packed.tasks[job_id]
        wd, pd = demands.get(job_id, (None, None))
        wd = zero if wd is None else wd
        pd = zero if pd is None else pd
        laid = _lay_out_job(free, t, wd, pd)
        if laid is None:
            return None
        out[job_id] = laid
    return Allocation(dict(packed.tasks), {j: out[j] for j in packed.tasks})


def _lay_out_job(free: np.ndarray, t: Tasks, wd: np.ndarray, pd: np.ndarray) -> JobPlacement | None:
    """Fewest nodes k with the job split evenly; groups go largest first to the
    fitting node with the most room (pairs of one worker + one PS it could host)."""
    if t.workers + t.ps == 0:
        return JobPlacement((), ())
    pair = wd + pd
    room = np.min(np.where(pair > 0, free / np.maximum(pair, _EPS), np.inf), axis=1)
    for k in range(1, t.workers + t.ps + 1):
        groups = sorted(zip(_even_split(t.workers, k), _even_split(t.ps, k), strict=True), reverse=True)
        taken = np.zeros(len(free), dtype=bool)
        chosen: list[int] = []
        for wk, pk in groups:
            fits = np.all(free + _EPS >= wk * wd + pk * pd, axis=1) & ~taken
            if not fits.any():
                break
            node = int(np.argmax(np.where(fits, room, -np.inf)))
            taken[node] = True
            chosen.append(node)
        if len(chosen) == k:
            workers: list[int] = []
            ps: list[int] = []
            for node, (wk, pk) in zip(chosen, groups, strict=True):
                free[node] -= wk * wd + pk * pd
                workers += [node] * wk
                ps += [node] * pk
            return JobPlacement(tuple(workers), tuple(ps))
    return None


def make_placer(
    capacity: np.ndarray, free: np.ndarray, policy: str, catalogue: JobCatalogue
) -> Placer:
    """A placer for ``policy`` that knows the catalogue's distinct task demands."""
    demands = [*catalogue.worker_demand, *catalogue.ps_demand]
    mode = placement_mode(policy)
    if policy == "optimus":
        return OptimusPlacer(capacity, free, demands)
    return Placer(capacity, free, demands, mode=mode)


def placement_mode(policy: str) -> int:
    """The node order of ``policy``'s placer while tasks are placed (:data:`LEAST_USED`, :data:`FULLEST`
    or :data:`ALIGNED`); ValueError naming the known policies for any other name."""
    modes = {"load_balancing": LEAST_USED, "packing": FULLEST, "optimus": FULLEST, "tetris": ALIGNED}
    if policy not in modes:
        raise ValueError(f"unknown placement policy {policy!r}; known: {', '.join(PLACEMENTS)}")
    return modes[policy]


def final_layout(
    policy: str,
    initial_free: np.ndarray,
    packed: Allocation,
    demands: dict[int, tuple[np.ndarray | None, np.ndarray | None]],
) -> Allocation:
    """What ``policy``'s placer returns from ``allocation()`` once it placed the tasks of ``packed``.

    ``optimus`` lays the jobs out again (:func:`optimus_layout`, ``demands`` as
    there) if that fits; every other policy keeps the placement as it was made.
    """
    if policy != "optimus":
        return packed
    relaid = optimus_layout(initial_free, packed, demands)
    return packed if relaid is None else relaid


def node_usage(capacity: np.ndarray, allocation: Allocation, demand_of) -> np.ndarray:
    """Shape (N, 3): resources the placed tasks of ``allocation`` use per node.

    ``demand_of(job_id) -> (worker_demand, ps_demand)``, each shape (3,).
    """
    usage = np.zeros_like(capacity)
    if not allocation.placement:
        return usage
    for job_id, pl in allocation.placement.items():
        wd, pd = demand_of(job_id)
        if pl.worker_nodes:
            np.add.at(usage, np.asarray(pl.worker_nodes), wd)
        if pl.ps_nodes:
            np.add.at(usage, np.asarray(pl.ps_nodes), pd)
    return usage
