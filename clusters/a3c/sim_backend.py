"""A :class:`~clusters.agent.backend.ClusterBackend` over dl2ray's trace-driven simulator."""

from __future__ import annotations

from clusters.agent.backend import SlotOutcome
from dl2ray.config import ExperimentConfig
from dl2ray.sim import Simulator
from dl2ray.view import Allocation, ClusterView
from dl2ray.world import build_simulator


class SimBackend:
    """The simulator behind the backend protocol; ``reset(seed)`` generates (or replays) trace ``seed``."""

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim

    @classmethod
    def from_config(cls, cfg: ExperimentConfig) -> SimBackend:
        return cls(build_simulator(cfg))

    def reset(self, seed: int) -> ClusterView:
        return self.sim.reset(seed)

    def step(self, allocation: Allocation) -> SlotOutcome:
        res = self.sim.step(allocation)
        return SlotOutcome(res.view, float(res.reward), bool(res.done))
