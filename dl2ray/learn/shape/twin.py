"""The twin a learning agent fits of its own cluster from what the cluster showed (issue 22).

An agent that learns on a real cluster cannot re-run a slot to see what another choice would have
done: the counterfactual credit of :mod:`dl2ray.learn.shape.counterfactual` is computed in a *twin*, a
simulator the agent builds from its observations. This module is that twin.

What the twin knows of each episode its cluster ran (:func:`observed_trace`) is what an operator
has: each job's arrival slot, type, declared epochs and requested size (what a submission carries)
and, for a job that finished, the epochs it trained (the cluster sees a job end); a job still
running when the episode stopped counts ``max(declared, epochs done)``. So the twin's arrival
process and job mix are the observed ones: it replays the newest ``window`` observed traces.

What it does not know: the true speed surfaces, each job's hidden compute/communication factors,
the slot noise. The twin runs in the operator's world (``build_simulator(world="operator")``: the
operator's profile in place of the true surfaces, the config's uncertainty model) and draws its own
per-job factors and noise from :data:`dl2ray.seeds.TWIN` seeds, never a real trace's seed.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from dl2ray import seeds as seedsets
from dl2ray.config import ExperimentConfig
from dl2ray.sim import Simulator
from dl2ray.workload import JobSpec, Trace, sort_trace


def observed_trace(sim: Simulator) -> Trace:
    """What an operator saw of the episode ``sim`` just ran (module docstring); jobs that never
    arrived before the episode stopped are not in it."""
    jobs: list[JobSpec] = []
    for spec in sim.trace:
        if spec.job_id in sim.finished:
            epochs = sim.finished[spec.job_id].done
        elif spec.job_id in sim.jobs:
            epochs = max(spec.est_epochs, sim.jobs[spec.job_id].done)
        else:
            continue
        jobs.append(JobSpec(spec.job_id, spec.job_type, spec.arrival_slot, float(epochs), spec.est_epochs,
                            spec.requested_bundles))
    return sort_trace(jobs)


@dataclass
class SeenJob:
    """What a live scheduler saw of one job (:class:`LiveObservations`)."""

    job_type: str
    arrival: int  # slot
    declared: float  # epochs
    requested: int | None  # bundles
    epochs: float = 0.0  # trained, as last seen (all of them once finished)
    finished: bool = False


class LiveObservations:
    """What a live scheduler has seen of its cluster, as an observed trace (:meth:`trace`).

    :meth:`see` takes every slot's view: a job's first view gives its arrival slot, type, declared epochs
    and requested size; its last one the epochs it had trained. A job that left the view finished: it
    trained ``max(declared, last seen)`` epochs. :meth:`trace` is the jobs that arrived in the last
    ``window_slots`` slots, arrival slots shifted so the earliest is 0 (the twin replays that stretch).
    """

    def __init__(self, window_slots: int = 200) -> None:
        if window_slots < 1:
            raise ValueError(f"window_slots: {window_slots}: need at least 1")
        self.window_slots = window_slots
        self.jobs: dict[int, SeenJob] = {}
        self.slot = 0

    def see(self, view) -> None:
        """One slot's :class:`~dl2ray.view.ClusterView`."""
        self.slot = view.slot
        now = {j.job_id for j in view.jobs}
        for j in view.jobs:
            seen = self.jobs.setdefault(j.job_id, SeenJob(j.job_type, j.arrival_slot, j.est_epochs,
                                                          j.requested_bundles))
            seen.epochs = max(seen.epochs, j.done_epochs)
        for jid, seen in self.jobs.items():
            if not seen.finished and jid not in now:
                seen.epochs, seen.finished = max(seen.epochs, seen.declared), True
        horizon = self.slot - self.window_slots
        for jid in [jid for jid, seen in self.jobs.items() if seen.finished and seen.arrival < horizon]:
            del self.jobs[jid]

    def trace(self) -> Trace:
        """The observed trace of the window (empty before any job was seen)."""
        horizon = self.slot - self.window_slots
        kept = [(jid, seen) for jid, seen in self.jobs.items() if seen.arrival >= horizon]
        if not kept:
            return ()
        start = min(seen.arrival for _, seen in kept)
        return sort_trace([JobSpec(jid, seen.job_type, seen.arrival - start,
                                   float(max(seen.epochs, seen.declared)), float(seen.declared),
                                   seen.requested) for jid, seen in kept])


class ObservedTwin:
    """The newest ``window`` observed traces and the operator-world simulators that replay them.

    :meth:`episode` is an episode source for
    :class:`~dl2ray.learn.shape.counterfactual.CounterfactualCollector`: twin episode ``k`` replays
    observed trace ``k mod n`` (of the ``n`` held) under twin seed ``salt·100 000 + k``.
    """

    def __init__(self, cfg: ExperimentConfig, window: int, salt: int = 0) -> None:
        if window < 1:
            raise ValueError(f"twin window: {window}: need at least one observed trace")
        if cfg.gang is not None:
            raise ValueError("a twin replays the DL2 simulator's traces; gang mode has none to replay")
        self.cfg, self.salt = cfg, salt
        self.traces: deque[Trace] = deque(maxlen=window)
        self.observed = 0  # episodes observed in all (the window keeps the newest)

    def observe(self, sim: Simulator) -> Trace:
        """Add the episode ``sim`` just ran; returns its observed trace."""
        return self.add(observed_trace(sim))

    def add(self, trace: Trace) -> Trace:
        """Add an observed trace (of a simulated episode, or :class:`LiveObservations` of a live cluster)."""
        if trace:
            self.traces.append(trace)
        self.observed += 1
        return trace

    def simulators(self, n: int) -> list[Simulator]:
        """``n`` operator-world simulators (the twin's side-by-side episodes)."""
        from dl2ray.world import build_simulator

        return [build_simulator(self.cfg, world="operator") for _ in range(n)]

    def episode(self, k: int) -> tuple[int, Trace]:
        """``(seed, trace)`` of twin episode ``k``; ValueError before the first observation."""
        if not self.traces:
            raise ValueError("the twin has observed no episode of its cluster yet")
        return seedsets.twin(1, self.salt * 100_000 + k)[0], self.traces[k % len(self.traces)]


class TwinExperience:
    """Where a shape learner's tries come from (the single-process trainer and each A3C agent alike).

    ``twin="config"``: operator-world episodes (``policy.train_world``) generated from the config's
    workload on ``trace_seeds``. ``twin="observed"``: every ``observe_every``-th :meth:`collect` first
    runs one episode of the learner's own cluster (the truth-world simulator, next seed of
    ``trace_seeds``) with the greedy policy, as deployed, and the tries come from an
    :class:`ObservedTwin` replaying the newest ``window`` of those episodes. ``rng`` draws the tried
    jobs and rows; ``salt`` separates the twin seeds of learners side by side. ``own_cluster=False``
    (a live cluster's learner): the observed twin's traces come from :meth:`ObservedTwin.add` alone.
    """

    def __init__(self, cfg: ExperimentConfig, trace_seeds: list[int], rng, twin: str = "config",
                 window: int = 8, observe_every: int = 1, salt: int = 0, own_cluster: bool = True) -> None:
        from dl2ray.learn.shape.counterfactual import CounterfactualCollector
        from dl2ray.policy.shape import ShapeEncoding
        from dl2ray.world import build_simulator

        if twin not in ("config", "observed"):
            raise ValueError(f"twin: {twin!r}: known: config, observed")
        if observe_every < 1:
            raise ValueError(f"observe_every: {observe_every}: need at least 1")
        s = cfg.policy.shape
        self.cfg, self.trace_seeds, self.observe_every = cfg, list(trace_seeds), observe_every
        self.twin = ObservedTwin(cfg, window, salt) if twin == "observed" else None
        self.own_cluster = own_cluster and self.twin is not None
        if self.own_cluster:
            self.cluster = build_simulator(cfg)  # the learner's own cluster: it only runs episodes there
        sims = self.simulators()
        self.collector = CounterfactualCollector(
            sims, ShapeEncoding.from_config(cfg), self.trace_seeds, rng, s.horizon, s.gamma, s.jobs_per_slot,
            s.samples, s.uniform, s.temperature, source=self.twin.episode if self.twin is not None else None)
        self.cluster_jct: list[float] = []  # average JCT (slots) of each episode run on its own cluster
        self.collects = 0

    @property
    def episodes(self) -> int:
        return self.collector.episodes

    def simulators(self) -> list:
        """``policy.shape.envs`` new simulators of the world the tries come from (the observed twin's, or
        the config's operator world): the counterfactual collector's, and the mixed learner's on-policy
        episodes' own (side-by-side episodes must not share a simulator)."""
        from dl2ray.world import build_simulator

        n = self.cfg.policy.shape.envs
        if self.twin is not None:
            return self.twin.simulators(n)
        return [build_simulator(self.cfg, world=self.cfg.policy.train_world) for _ in range(n)]

    def collect(self, policy):
        """One update's tries (:class:`~dl2ray.learn.shape.counterfactual.Collected`) with ``policy`` (a
        :class:`~dl2ray.policy.shape_net.NumpyShapePolicy`), observing the cluster first when due."""
        self.observe_if_due(policy)
        return self.collector.collect(policy, self.cfg.policy.shape.slots_per_update)

    def observe_if_due(self, policy) -> None:
        """Before an update's experience: one episode of the own cluster every ``observe_every`` updates
        (and whenever the observed twin has none yet); counts the update."""
        due = self.collects % self.observe_every == 0 or (self.twin is not None and not self.twin.traces)
        if self.own_cluster and due:
            self.observe(policy)
        self.collects += 1

    def observe(self, policy) -> None:
        """One episode of the learner's own cluster with the greedy ``policy``; the twin takes what it
        showed."""
        from dl2ray.evaluation.metrics import censored_avg_jct
        from dl2ray.schedulers.dl2 import DL2Scheduler
        from dl2ray.sim import run_episode

        assert self.twin is not None
        seed = self.trace_seeds[self.twin.observed % len(self.trace_seeds)]
        result = run_episode(self.cluster, DL2Scheduler.from_policy(policy), seed)
        self.cluster_jct.append(float(censored_avg_jct(result)))
        self.twin.observe(self.cluster)
