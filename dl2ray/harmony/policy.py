"""Harmony's placement state, masks, reward and decision loop (numpy; no torch).

Jobs start in arrival order (each that fits, as the baselines do); a starting job's tasks
are placed one action at a time:

- **state** (``M·(5+L) + L + 4`` floats): per server its free (cpu, gpu, mem) / capacity, the
  tasks of every job type already on it / 4, and this job's workers and PS placed on it / 4;
  then the job: one-hot type, workers / 4, PS / 4, workers and PS still to place / 4.
  (Harmony's ``x, r, w, p, v, d`` for the one job being placed; running jobs enter through
  the per-server type counts.)
- **actions** ``2M``: ``m`` puts a worker on server ``m``, ``M + m`` a PS. Masked: the role has
  tasks left and server ``m`` fits the task. If no action is allowed before the job is
  placed, the job is rolled back (not started this slot).
- **reward** of a placed job (on its last action; 0 before): the reward model's predicted
  normalised speed of the new job plus the predicted change of every job sharing a server
  with it: ``R = ŷ_new + Σ_k (ŷ_k,after − ŷ_k,before)``.

``choose(state, mask, hint) -> action`` picks actions (``-1``: leave the job waiting, rolled back;
an imitation teacher uses it where its baseline gives up a job; ``hint``: the load-balancing and the
bin-packing action, for ε-greedy exploration); ``record(state, mask, action)`` sees each
step and ``finish(job_id, reward)`` each placed job; ``rollback()`` says the steps since the last
``finish`` were undone.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dl2ray.harmony.baselines import WaitingJobsPlacer, lb_score, load_of, place_job
from dl2ray.harmony.nets import rm_features
from dl2ray.view import ClusterView, JobPlacement, JobView

_EPS = 1e-9


def dims(servers: int, types: int) -> tuple[int, int, int]:
    """``(server_dim, job_dim, state_dim)``."""
    sd, jd = 5 + types, types + 4
    return sd, jd, servers * sd + jd


class Placed:
    """Jobs on the cluster this slot: type and nodes, and per-node task counts by type."""

    def __init__(self, servers: int, types: int, max_nodes: int = 8) -> None:
        self.jobs: dict[int, tuple[int, tuple[int, ...], tuple[int, ...]]] = {}
        self.counts = np.zeros((servers, types))
        self.types, self.max_nodes = types, max_nodes

    def add(self, job_id: int, t: int, wn, pn) -> None:
        self.jobs[job_id] = (t, tuple(wn), tuple(pn))
        for node in (*wn, *pn):
            self.counts[node, t] += 1

    @classmethod
    def running(cls, view: ClusterView, placement: dict, max_nodes: int = 8) -> Placed:
        """The running jobs of ``view`` at ``placement`` (``keep_running``'s), before any new job."""
        placed = cls(view.num_nodes, len(view.catalogue), max_nodes)
        types = {j.job_id: j.type_index for j in view.jobs}
        for j, pl in placement.items():
            placed.add(j, types[j], pl.worker_nodes, pl.ps_nodes)
        return placed

    def remove(self, job_id: int) -> None:
        t, wn, pn = self.jobs.pop(job_id)
        for node in (*wn, *pn):
            self.counts[node, t] -= 1

    def features(self, job_id: int) -> np.ndarray:
        """The reward model's input for ``job_id`` as placed now (:func:`~.nets.rm_features`)."""
        t, wn, pn = self.jobs[job_id]
        return rm_features(t, wn, pn, self.counts, self.max_nodes)

    def neighbours(self, job_id: int) -> list[int]:
        _, wn, pn = self.jobs[job_id]
        mine = set(wn) | set(pn)
        return [j for j, (_, w, p) in self.jobs.items() if j != job_id and mine & (set(w) | set(p))]


def placement_reward(placed: Placed, job_id: int, predict: Callable[[np.ndarray], np.ndarray]) -> float:
    """``R = ŷ_new + Σ_k (ŷ_k,after − ŷ_k,before)`` over the jobs sharing a server with ``job_id``."""
    nb = placed.neighbours(job_id)
    after = predict(np.stack([placed.features(j) for j in (job_id, *nb)]))
    if not nb:
        return float(after[0])
    entry = placed.jobs[job_id]
    placed.remove(job_id)
    before = predict(np.stack([placed.features(j) for j in nb]))
    placed.add(job_id, *entry)
    return float(after[0] + np.sum(after[1:] - before))


def encode(
    job: JobView, free: np.ndarray, cap: np.ndarray, placed: Placed, own: np.ndarray, left: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray]:
    """``(state, mask (2M,))`` for placing the next task of ``job``."""
    assert job.fixed_tasks is not None
    inv = np.divide(1.0, cap, out=np.zeros_like(cap), where=cap > 0)
    servers = np.concatenate([free * inv, placed.counts / 4.0, own / 4.0], axis=1)
    onehot = np.zeros(placed.types)
    onehot[job.type_index] = 1.0
    w, p = job.fixed_tasks
    jobpart = np.concatenate([onehot, [w / 4.0, p / 4.0, left[0] / 4.0, left[1] / 4.0]])
    fits_w = np.all(free + _EPS >= job.worker_demand, axis=1) & (left[0] > 0)
    fits_p = np.all(free + _EPS >= job.ps_demand, axis=1) & (left[1] > 0)
    state = np.concatenate([servers.ravel(), jobpart]).astype(np.float32)
    return state, np.concatenate([fits_w, fits_p])


def decode(state: np.ndarray, servers: int, types: int) -> dict[str, np.ndarray]:
    """Inverse of :func:`encode`'s layout: ``free_share`` (M, 3) free / capacity, ``counts`` (M, L)
    tasks of each type per server, ``own`` (M, 2), ``type`` (L,) one-hot, ``size`` (2,) and
    ``left`` (2,) workers / PS (in tasks, not / 4)."""
    sd, _, _ = dims(servers, types)
    rows = np.asarray(state, np.float64)[: servers * sd].reshape(servers, sd)
    job = np.asarray(state, np.float64)[servers * sd :]
    return {
        "free_share": rows[:, :3],
        "counts": np.round(rows[:, 3 : 3 + types] * 4.0),
        "own": np.round(rows[:, 3 + types :] * 4.0),
        "type": job[:types],
        "size": np.round(job[types : types + 2] * 4.0),
        "left": np.round(job[types + 2 :] * 4.0),
    }


def hints(mask: np.ndarray, free: np.ndarray, cap: np.ndarray, left: tuple[int, int]) -> tuple[int, int]:
    """The load-balancing and the bin-packing action: the role with more tasks left (workers on a
    tie) on the least / most loaded allowed server."""
    m = len(free)
    load = load_of(free, cap)
    role = 0 if (left[0] >= left[1] and mask[:m].any()) or not mask[m:].any() else 1
    allowed = mask[role * m : (role + 1) * m]
    lb = int(np.argmin(np.where(allowed, load, np.inf)))
    bp = int(np.argmax(np.where(allowed, load, -np.inf)))
    return role * m + lb, role * m + bp


Choose = Callable[[np.ndarray, np.ndarray, tuple[int, int]], int]


class HarmonyScheduler(WaitingJobsPlacer):
    """FIFO start, learned task placement (see the module docstring)."""

    name = "harmony"

    def __init__(
        self,
        choose: Choose,
        predict: Callable[[np.ndarray], np.ndarray] | None = None,
        record: Callable[[np.ndarray, np.ndarray, int], None] | None = None,
        finish: Callable[[int, float], None] | None = None,
        rollback: Callable[[], None] | None = None,
        max_nodes: int = 8,
        precheck: bool = True,
    ) -> None:
        self.choose, self.predict, self.record, self.finish = choose, predict, record, finish
        self.rollback, self.max_nodes, self.precheck = rollback, max_nodes, precheck

    def begin(self, view: ClusterView, placement: dict[int, JobPlacement]) -> Placed:
        return Placed.running(view, placement, self.max_nodes)

    def place_waiting(self, job: JobView, free: np.ndarray, cap: np.ndarray,
                      placed: Placed) -> JobPlacement | None:
        if self.precheck and place_job(job, free, cap, placed.counts, lb_score) is None:
            return None  # does not fit even by load balancing: wait
        return self.place(job, free, cap, placed)

    def place(self, job: JobView, free: np.ndarray, cap: np.ndarray, placed: Placed) -> JobPlacement | None:
        """Place ``job``'s tasks one action at a time (``placed`` gains it), or None (rolled back)."""
        assert job.fixed_tasks is not None
        m = len(free)
        free = free.copy()
        own = np.zeros((m, 2))
        left = [job.fixed_tasks.workers, job.fixed_tasks.ps]
        wn: list[int] = []
        pn: list[int] = []
        steps = []
        while left[0] + left[1] > 0:
            state, mask = encode(job, free, cap, placed, own, (left[0], left[1]))
            a = -1
            if mask.any():
                a = int(self.choose(state, mask, hints(mask, free, cap, (left[0], left[1]))))
            if a == -1:
                for node in (*wn, *pn):
                    placed.counts[node, job.type_index] -= 1
                if self.rollback is not None:
                    self.rollback()
                return None  # roll back: the job waits
            if not 0 <= a < len(mask) or not mask[a]:
                raise ValueError(f"harmony: action {a} is masked")
            steps.append((state, mask, a))
            role, node = divmod(a, m)
            free[node] -= job.ps_demand if role else job.worker_demand
            own[node, role] += 1
            placed.counts[node, job.type_index] += 1
            (pn if role else wn).append(node)
            left[role] -= 1
        for node in (*wn, *pn):  # Placed.add counts them again
            placed.counts[node, job.type_index] -= 1
        placed.add(job.job_id, job.type_index, wn, pn)
        if self.record is not None:
            for s, mk, a in steps:
                self.record(s, mk, a)
        if self.finish is not None and self.predict is not None:
            self.finish(job.job_id, placement_reward(placed, job.job_id, self.predict))
        return JobPlacement(tuple(wn), tuple(pn))


def load(arg: str | None, cfg) -> HarmonyScheduler:
    """``harmony:PATH``: greedy placement by a checkpoint of ``dl2ray train harmony``."""
    from pathlib import Path

    from dl2ray.errors import UserError
    from dl2ray.harmony.nets import NumpyPolicy, read_checkpoint

    if cfg is None or getattr(cfg, "gang", None) is None:
        raise UserError("harmony needs a gang-mode config (e.g. configs/harmony.yaml)")
    if not arg:
        raise UserError("harmony needs a checkpoint: harmony:PATH (e.g. harmony:models/harmony.pt)")
    if not Path(arg).is_file():
        raise UserError(f"harmony: {arg}: no such checkpoint")
    ck = read_checkpoint(arg)
    servers, types = int(cfg.cluster.capacity.shape[0]), len(cfg.catalogue)
    if (ck["servers"], ck["types"]) != (servers, types):
        raise UserError(
            f"harmony: {arg} is for {ck['servers']} servers and {ck['types']} job types; the "
            f"config has {servers} and {types}"
        )
    sd, _, _ = dims(servers, types)
    net = NumpyPolicy(servers, sd, ck["ac"])
    return HarmonyScheduler(lambda s, mk, h: net.greedy(s, mk))
