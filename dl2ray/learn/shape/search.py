"""Rollout policy improvement over whole-slot job shapes: local search on ``(workers, PS)`` per job.

Why. :mod:`dl2ray.learn.improve` re-takes single decision *steps*; a better
shape (say 3 PS : 1 worker) is several unlikely steps away from a DRF-like
policy, and one changed step moves the slot's outcome by little. Here the
unit of improvement is a job's *shape* in the slot's allocation, and the
label is the whole slot, rebuilt step by step exactly as supervised learning
labels a teacher's allocation (:func:`dl2ray.learn.teacher.decompose`).

**Labels** (:class:`ShapeSearchCollector`), per training slot with view ``s_t``:

1. the greedy policy decides the slot; its task counts ``T_0`` (job → (w, p));
2. ``rounds`` times: every *move* of ``T`` — for one job ``j``: one more
   worker, one more PS, one worker fewer, one PS fewer (a job left with no
   worker or no PS gets nothing), or ``(1, 1)`` for a job that had nothing —
   is rebuilt through the decision loop (a move that does not fit is
   dropped) and followed by ``horizon − 1`` greedy slots from the same
   simulator snapshot (common random numbers), giving
   ``q(T') = Σ_{h<H} γ^h r_{t+h}``; ``T`` becomes the best move if it beats
   ``q(T)`` by more than ``min_gain``, else the search stops;
3. the labels are the steps that rebuild the final ``T`` (all steps of the
   slot; with no better move found, the steps that rebuild ``T_0``);
4. the episode goes on with the greedy decision (the learner's own states,
   as in DAgger).

**Futures.** A rollout from the snapshot plays the trace's own future (which
jobs arrive when, the simulator's noise draws), which the policy's state does
not show; a label chosen on it is partly hindsight. With ``futures`` F > 0
each move is instead scored by the mean of its returns over F re-drawn
futures (:func:`redraw_future`: the jobs still to arrive replaced by the
next jobs of another generated trace of the same config, the simulator's
generator re-seeded), the same F futures for every move of the slot.

``reward`` as in :mod:`dl2ray.learn.improve` (``jobs``: minus job-slots in
the system, so a run's sum is minus its total JCT). **Control**
(``select="random"``): each round moves to a uniformly drawn candidate
(including staying) without looking at the returns — same states, same
rollouts, same number of labels, no outcome information.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from dl2ray.learn.improve import Improvement, ImprovementCollector
from dl2ray.learn.teacher import decompose
from dl2ray.policy.decision import decide_slot
from dl2ray.policy.encoding import Encoding
from dl2ray.sim import Simulator
from dl2ray.view import Allocation, ClusterView, Tasks

Shape = dict[int, Tasks]


def redraw_future(sim: Simulator, trace_seed: int, noise_seed: int) -> None:
    """Replace what ``sim`` will see from now on by another draw of the same workload (in place).

    The jobs still to arrive keep their ids (and count) but take the type,
    epochs and arrival gaps of the first jobs of ``generate_trace(cfg,
    trace_seed)``: the ``i``-th pending job arrives ``1 + a_i − a_0`` slots
    after the current one (``a``: that trace's arrival slots). The generator
    (speed variation, loss noise) restarts from ``noise_seed``.
    """
    from dl2ray.traces.generate import generate_trace

    pending = sorted(sim._pending, key=lambda j: (j.arrival_slot, j.job_id))
    if pending:
        alt = generate_trace(sim.cfg, trace_seed)
        a0 = alt[0].arrival_slot
        new = [replace(alt[i % len(alt)], job_id=p.job_id,
                       arrival_slot=sim.slot + 1 + alt[i % len(alt)].arrival_slot - a0)
               for i, p in enumerate(pending)]
        sim._pending = sorted(new, key=lambda j: (j.arrival_slot, j.job_id), reverse=True)
    sim.rng = np.random.default_rng(noise_seed)


def shape_moves(view: ClusterView, tasks: Shape) -> list[Shape]:
    """Every one-task change of ``tasks`` over the jobs of ``view`` (see the module docstring, step 2).

    Caps are not checked here: the rebuild through the decision loop drops what does not fit.
    """
    out: list[Shape] = []
    for job in view.jobs:
        w, p = tasks.get(job.job_id, Tasks(0, 0))
        if w == 0 and p == 0:
            shapes = [Tasks(1, 1)]
        else:
            shapes = [Tasks(w + 1, p), Tasks(w, p + 1),
                      Tasks(w - 1, p) if w > 1 else Tasks(0, 0),
                      Tasks(w, p - 1) if p > 1 else Tasks(0, 0)]
        for s in dict.fromkeys(shapes):  # (1, 1) → both shrinks give (0, 0): try it once
            moved = dict(tasks)
            if s == (0, 0):
                moved.pop(job.job_id, None)
            else:
                moved[job.job_id] = s
            out.append(moved)
    return out


class ShapeSearchCollector(ImprovementCollector):
    """Training episodes side by side over ``trace_seeds``, labelled by shape search (module docstring).

    ``rng`` draws the control's picks; ``rounds`` bounds the moves per slot.
    """

    def __init__(self, sims: Sequence[Simulator], enc: Encoding, trace_seeds: Sequence[int],
                 rng: np.random.Generator, horizon: int = 10, reward: str = "jobs", gamma: float = 1.0,
                 select: str = "best", rounds: int = 1, min_gain: float = 0.0, futures: int = 0,
                 start_episode: int = 0) -> None:
        super().__init__(sims, enc, trace_seeds, 1, rng, horizon, reward, gamma, select=select,
                         start_episode=start_episode)
        self.rounds, self.min_gain, self.futures = max(1, rounds), min_gain, futures
        self._future_seeds: list[tuple[int, int]] = []

    def improve(self, policy, e: int) -> list[Improvement]:
        sim = self.sims[e]
        view = self.episode_view(e)
        greedy = decide_slot(view, policy, self.enc)
        snap = sim.snapshot()
        # the slot's futures (same for every move): far from the training/validation/test seed sets
        self._future_seeds = [(int(s), int(n)) for s, n in
                              self.rng.integers(900_000_000, 999_999_999, size=(self.futures, 2))]
        tasks: Shape = dict(greedy.allocation.tasks)
        q0 = q = self._evaluate(sim, snap, view, tasks, policy)
        assert q is not None  # the greedy counts rebuild exactly
        for _ in range(self.rounds):
            evaluated = [(m, self._evaluate(sim, snap, view, m, policy)) for m in shape_moves(view, tasks)]
            scored = [(m, v) for m, v in evaluated if v is not None]
            if not scored:
                break
            if self.select == "best":
                best, value = max(scored, key=lambda mv: mv[1])
                if value <= q + max(self.min_gain, 1e-9):
                    break
            else:
                pick = int(self.rng.integers(len(scored) + 1))
                if pick == len(scored):  # staying is one of the control's choices
                    break
                best, value = scored[pick]
            tasks, q = best, value
        labelled = decompose(view, Allocation(tasks), self.enc, record=True).decision.steps
        changed = tasks != dict(greedy.allocation.tasks)
        # returns (q of the greedy counts, q of the labelled counts): ``gain`` is the search's gain
        out = [Improvement(s.state, s.mask, np.array([s.action, s.action]), np.array([q0, q]), int(changed),
                           changed) for s in labelled]
        sim.restore(snap)
        res = sim.step(greedy.allocation)
        self._views[e] = None if res.done else res.view
        return out

    def _evaluate(self, sim: Simulator, snap, view: ClusterView, tasks: Shape, policy) -> float | None:
        """``q`` of the slot allocated as ``tasks`` (rebuilt by the decision loop); None: it does not fit."""
        rebuilt = decompose(view, Allocation(tasks), self.enc, record=False)
        if rebuilt.short or dict(rebuilt.decision.allocation.tasks) != tasks:
            return None
        if not self._future_seeds:
            sim.restore(snap)
            return self._return(sim, view, rebuilt.decision.allocation, policy)
        total = 0.0
        for trace_seed, noise_seed in self._future_seeds:
            sim.restore(snap)
            redraw_future(sim, trace_seed, noise_seed)
            total += self._return(sim, view, rebuilt.decision.allocation, policy)
        return total / len(self._future_seeds)

    def _return(self, sim: Simulator, view: ClusterView, allocation: Allocation, policy) -> float:
        """``Σ_{h<H} γ^h r_{t+h}``: ``allocation`` now, then greedy slots (from ``sim``'s current state)."""
        res, g = self._step(sim, view, allocation)
        discount = 1.0
        for _ in range(self.horizon - 1):
            if res.done:
                break
            res, r = self._step(sim, res.view, decide_slot(res.view, policy, self.enc).allocation)
            discount *= self.gamma
            g += discount * r
        return g
