"""The cluster as an online learner has it: act, observe, reward (issue 37).

A live agent never rewinds its cluster, never copies it and never reads its truth (true speeds,
hidden per-job factors, the noise): it sees a :class:`~dl2ray.view.ClusterView` at the start of a
slot, applies an :class:`~dl2ray.view.Allocation`, and one slot later sees what the cluster showed:
the next view, the jobs that finished and when, and the progress each job reported. An online
learner in this project talks to its environment through exactly that, :class:`ClusterEnvironment`
(:meth:`~ClusterEnvironment.observe`, :meth:`~ClusterEnvironment.act`), and the simulator behind it
stays private. ``tests/learn/test_online.py`` runs the online learners with an environment that
answers those two calls and nothing else.

**Stretches.** A live cluster runs on; the simulator that stands in for it runs one trace at a time.
The environment plays *stretches* (one trace each) back to back: when a stretch ends (every job of
its trace finished, or ``sim.max_slots`` reached) the feedback says so (``ended``) and the next
:meth:`~ClusterEnvironment.observe` starts the next one from the stretch source. Stretch ``k``
replays ``source(k) = (seed, trace)`` (``trace`` None: the one ``seed`` generates).

**Feedback** of one slot ``t`` (:class:`Feedback`), all of it what a cluster reports:

- ``progress = Σ_j epochs_j(t) / E_j``: the epochs each job trained in the slot over its *declared*
  epochs ``E_j`` (the DL2 paper's reward);
- ``in_system = Σ_j min(1, end_j − t)`` over the jobs of the slot's view (``end_j`` the slot-time the
  job finished; 1 for a job still running): job-slots spent in the system, whose sum over a stretch
  is its total JCT (the shape learners' reward is ``−in_system``);
- ``finished``: job id → ``end_j`` (slots, fractional) of the jobs that finished in the slot.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from dl2ray.config import ExperimentConfig
from dl2ray.sim import Simulator
from dl2ray.view import Allocation, ClusterView
from dl2ray.workload import Trace

StretchSource = Callable[[int], tuple[int, Trace | None]]
"""Stretch ``k`` → ``(seed, trace)``: the seed its simulator resets with and the trace it replays."""


@dataclass(frozen=True)
class Feedback:
    """What the cluster showed of one slot (module docstring). ``view``: the next slot's view (None when
    the stretch ``ended``); ``slot``: the slot it is the feedback of."""

    view: ClusterView | None
    slot: int
    progress: float
    in_system: float
    finished: Mapping[int, float]
    ended: bool


class ClusterEnvironment:
    """One cluster behind the live agent's interface (module docstring). The simulator is private:
    nothing but :meth:`observe` and :meth:`act` reaches it."""

    def __init__(self, sim: Simulator, source: StretchSource, first_stretch: int = 0) -> None:
        self._sim, self._source = sim, source
        self._view: ClusterView | None = None
        self._seed = -1  # the seed of the stretch in progress (or the last one)
        self.stretches = first_stretch  # stretches started so far (the next one's index)

    @classmethod
    def over_seeds(cls, sim: Simulator, trace_seeds: list[int], first_stretch: int = 0) -> ClusterEnvironment:
        """Stretch ``k`` replays trace seed ``trace_seeds[k mod len]``."""
        if not trace_seeds:
            raise ValueError("need at least one training trace seed")
        seeds = list(trace_seeds)
        return cls(sim, lambda k: (seeds[k % len(seeds)], None), first_stretch)

    @property
    def stretch_seed(self) -> int:
        """The seed of the stretch in progress (or the last one), for the records; −1 before any."""
        return self._seed

    def observe(self) -> ClusterView:
        """The view at the start of the slot in progress (starting the next stretch if none runs)."""
        if self._view is None:
            self._seed, trace = self._source(self.stretches)
            self.stretches += 1
            self._view = self._sim.reset(self._seed, trace)
        return self._view

    def act(self, allocation: Allocation) -> Feedback:
        """Apply ``allocation`` to the slot :meth:`observe` showed; what the cluster showed of it.
        AllocationError (naming the job or node) for an allocation the cluster refuses."""
        view = self.observe()
        res = self._sim.step(allocation)
        end = self._sim.result.end_time
        finished = {j: float(end[j]) for j in res.completed}
        in_system = sum(min(1.0, end[j.job_id] - view.slot) if j.job_id in end else 1.0 for j in view.jobs)
        self._view = None if res.done else res.view
        return Feedback(self._view, view.slot, float(res.reward), float(in_system), finished, bool(res.done))


def learning_environment(cfg: ExperimentConfig, trace_seeds: list[int], first_stretch: int = 0,
                         traces: Sequence[Trace] | None = None) -> ClusterEnvironment:
    """Where an on-policy learner's stretches come from (``cfg.policy.experience``): ``cluster``, its own
    cluster (the truth-world simulator, stretch ``k`` on trace seed ``trace_seeds[k mod len]``);
    ``twin``, the ``policy.train_world`` simulator on the same seeds. With fixed ``traces`` (Parquet
    files: ``train rl --train-trace``) stretch ``k`` replays ``traces[k mod len]`` with seed
    ``trace_seeds[k mod len]``'s noise and hidden per-job factors."""
    from dl2ray.world import build_simulator

    world = "truth" if cfg.policy.experience == "cluster" else cfg.policy.train_world
    sim = build_simulator(cfg, world=world)
    if not traces:
        return ClusterEnvironment.over_seeds(sim, trace_seeds, first_stretch)
    if not trace_seeds:
        raise ValueError("need at least one training trace seed")
    seeds, fixed = list(trace_seeds), list(traces)
    return ClusterEnvironment(sim, lambda k: (seeds[k % len(seeds)], fixed[k % len(fixed)]), first_stretch)
