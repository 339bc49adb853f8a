"""Online learning of the shape policy from a live cluster (``dl2ray cluster up --learn`` with a shape
``dl2:PATH``): :class:`LiveShapeLearner`.

The same learner as the simulated agents' (:class:`~clusters.a3c.local.CounterfactualStep`), fed by
what the live cluster shows. The scheduler decides every slot **greedily** with the current global
weights (the policy as deployed: the shape policy learns from counterfactual tries, not from sampled
actions) and hands each view to :class:`~dl2ray.learn.shape.twin.LiveObservations` (arrivals, types,
declared and trained epochs). Every ``steps_per_update`` slots (``live.learn.steps_per_update``: for
the shape policy, slots per push) it starts one push **in a background thread**, so the slot loop
never waits for rollouts: the observed trace of the last ``window_slots`` slots joins the twin
(operator-world replays, the config's operator profile, the twin's own draws), one update's tries run
in it, the KL-limited improvement of a learning copy of the weights gives the pseudo-gradient, and
the sink (the GlobalPolicy actor, which checks and applies it) answers with the new weights, taken
up by the next slot's decision. One push is computed at a time; a push that fails is counted and
logged, never raised into the slot loop.

A federation's live member runs it too (:class:`clusters.federation.live.FederatedLiveShapePolicy`:
the sink is its link to the federation's learner; ``learning=False`` in ``shadow`` and ``serve-only``).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import numpy as np

from clusters.a3c.local import CounterfactualStep, LocalSettings
from clusters.a3c.weights import load_vector, params_vector
from dl2ray.config import ExperimentConfig
from dl2ray.learn.shape.twin import LiveObservations
from dl2ray.policy.shape_net import NumpyShapePolicy, load_shape_policy
from dl2ray.schedulers.dl2 import DL2Scheduler
from dl2ray.view import Allocation, ClusterView

log = logging.getLogger(__name__)


class LiveShapeLearner:
    """The learning scheduler of the shape policy (module docstring); ``sink``: where pushes go
    (:class:`~clusters.a3c.live.GlobalPolicySink`, or a federation member's
    :class:`~clusters.federation.live.MemberSink`); ``learning=False``: greedy decisions only;
    ``streams``: what separates its tried jobs and rows from other learners'; ``salt``: its twin's seeds."""

    name = "dl2-learn"

    def __init__(self, cfg: ExperimentConfig, net: Any, sink: Any, slots_per_update: int, seed: int,
                 streams: list[int], learning: bool = True, window_slots: int = 200, salt: int = 0) -> None:
        self.cfg, self.net, self.sink = cfg, net, sink
        self.slots_per_update, self.learning = slots_per_update, learning
        settings = LocalSettings(twin="observed", own_cluster=False)
        self.step = CounterfactualStep(cfg, [0], seed, streams, settings, salt)
        self.observations = LiveObservations(window_slots)
        self.scheduler: DL2Scheduler | None = None
        self.version = -1
        self.pushed = self.slots = self.errors = 0
        self.refused_or_dropped = 0  # pushes the sink answered without applying them
        self._since = 0
        self._thread: threading.Thread | None = None
        self._result: tuple[int, np.ndarray | None] | None = None

    @classmethod
    def from_scheduler(cls, cfg: ExperimentConfig, learn: Any, path: Any, sink: Any,
                       incarnation: int = 0) -> LiveShapeLearner:
        """``cluster up --learn`` with a shape checkpoint at ``path``; starts from the sink's weights."""
        learner = cls(cfg, load_shape_policy(path, cfg), sink, learn.steps_per_update, learn.seed,
                      [1000, incarnation])
        learner.take(*sink.fetch())
        return learner

    def take(self, updates: int, weights: np.ndarray) -> None:
        """Decide from now on with ``weights`` (the flat vector of global update ``updates``)."""
        load_vector(self.net, None, weights)
        self.scheduler = DL2Scheduler.from_policy(NumpyShapePolicy(self.net))
        self.version = updates

    def decide(self, view: ClusterView) -> Allocation:
        if self.scheduler is None:
            self.take(*self.sink.fetch())
        self._collect_result()
        assert self.scheduler is not None
        alloc = self.scheduler.decide(view)
        if self.learning:
            self.observations.see(view)
            self.slots += 1
            self._since += 1
            if self._since >= self.slots_per_update and self._thread is None:
                trace = self.observations.trace()
                if trace:
                    self._since = 0
                    self._start(trace)
        return alloc

    def rejected(self) -> None:
        """The guardrail replaced this slot's allocation: nothing to undo (the twin learns from
        observations, not from the actions)."""

    def join(self, timeout: float | None = None) -> None:
        """Wait for the push being computed (tests; the slot loop never waits) and take up its answer."""
        if self._thread is not None:
            self._thread.join(timeout)
        self._collect_result()

    def stats(self) -> dict[str, Any]:
        return {"version": self.version, "pushed": self.pushed, "slots": self.slots, "errors": self.errors,
                "not_applied": self.refused_or_dropped, "computing": self._thread is not None,
                "observed_jobs": len(self.observations.jobs),
                "twin_traces": self.step.experience.twin.observed if self.step.experience.twin else 0}

    # -- the background push ---------------------------------------------------------------------------

    def _start(self, trace) -> None:
        weights, version = params_vector(self.net, None), self.version
        self._thread = threading.Thread(target=self._push, args=(trace, weights, version),
                                        name="dl2ray-live-shape-push", daemon=True)
        self._thread.start()

    def _push(self, trace, weights: np.ndarray, version: int) -> None:
        try:
            assert self.step.experience.twin is not None
            self.step.experience.twin.add(trace)
            self.step.take(weights)
            push = self.step.compute(version)
            self._result = self.sink.push(push.grad, push.row, version)
        except Exception as exc:  # a failed push is counted and logged; the slot loop goes on deciding
            self._push_failed(exc)

    def _push_failed(self, exc: Exception) -> None:
        log.error("live shape learner: push failed", exc_info=exc)
        self.errors += 1

    def _collect_result(self) -> None:
        if self._thread is None or self._thread.is_alive():
            return
        self._thread = None
        result, self._result = self._result, None
        if result is None:
            return
        updates, weights = result
        self.pushed += 1
        if updates <= self.version:
            self.refused_or_dropped += 1
        if weights is not None:
            self.take(updates, weights)
