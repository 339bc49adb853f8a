"""What one A3C agent call reports (either architecture's agents)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class AgentReport:
    """What one agent call did: gradients pushed, slots and steps collected."""

    agent_id: int
    pushed: int
    slots: int
    steps: int
    seconds: float
    last_update: int  # the largest global update count a reply reported (-1: none yet)
    incarnation: int  # 1 if this agent is a Ray restart, else 0
