"""The incremental decision loop: one slot's :class:`~dl2ray.view.Allocation`, one action at a time.

For each window of J jobs (see :mod:`dl2ray.policy.encoding`): encode →
mask → if only stop is allowed, the window is done → ask a :class:`Chooser`
for one action → stop ends the window, any other action is placed through
the slot's placer and updates the state → repeat. Every task goes through
:class:`~dl2ray.cluster.Placer`, and masked actions are refused, so the
result never exceeds a node's capacity or a job's caps.

The same loop serves the learned policy (:class:`PolicyChooser`) and the
supervised teacher (``dl2ray.learn.teacher``), so both produce the same
``(state, mask, action)`` steps; an actor-critic learner can replay those.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import numpy as np

from dl2ray.policy.encoding import Encoding, SlotState
from dl2ray.view import Allocation, ClusterView


class Step(NamedTuple):
    """One inference: state ``(J·(L+5),)`` float32, mask ``(3J+1,)`` bool, chosen action."""

    state: np.ndarray
    mask: np.ndarray
    action: int


@dataclass
class Decision:
    """A slot's allocation (with placement), its recorded steps and its inference count."""

    allocation: Allocation
    steps: list[Step] = field(default_factory=list)
    inferences: int = 0


class Chooser(Protocol):
    def begin(self, slot: SlotState) -> None:
        """A new window is current in ``slot``."""

    def choose(self, slot: SlotState, mask: np.ndarray) -> int:
        """One allowed action index (``mask[a]`` is True)."""

    def applied(self, row: int, delta: np.ndarray) -> None:
        """The chosen action changed state columns L+2..L+4 of ``row`` by ``delta``."""


def run_decision(view: ClusterView, enc: Encoding, chooser: Chooser, record: bool = False) -> Decision:
    """Run the loop over every window of ``view``; see the module docstring."""
    slot = SlotState(view, enc)
    steps: list[Step] = []
    inferences = 0
    stop = enc.stop
    for k in range(slot.num_windows):
        slot.begin(k)
        chooser.begin(slot)
        while True:
            mask = slot.mask()
            if not mask[:stop].any():
                break
            action = chooser.choose(slot, mask)
            inferences += 1
            if record:
                steps.append(Step(slot.state().copy(), mask.copy(), action))
            if action == stop:
                break
            row, delta = slot.apply(action)
            chooser.applied(row, delta)
    return Decision(slot.allocation(), steps, inferences)


def sample_masked(logits: np.ndarray, mask: np.ndarray, rng: np.random.Generator) -> int:
    """Draw from ``softmax(logits)`` restricted to ``mask``; shapes (A,).

    Gumbel-max: ``argmax(logits + G)`` with ``G`` i.i.d. standard Gumbel is an
    exact sample of the softmax, and is cheaper here than a cumulative sum.
    """
    return int(np.argmax(np.where(mask, logits + rng.gumbel(size=logits.shape[0]), -np.inf)))


def greedy_masked(logits: np.ndarray, mask: np.ndarray) -> int:
    """The allowed action with the largest logit (ties: lowest index)."""
    return int(np.argmax(np.where(mask, logits, -np.inf)))


class PolicyChooser:
    """Chooses with a :class:`~dl2ray.policy.network.NumpyPolicy`: greedy, or sampled from ``rng``.

    Keeps the first layer's pre-activation across steps and updates it from
    each action's state delta (exactly the full product up to float32 rounding).
    """

    def __init__(self, policy, greedy: bool = True, rng: np.random.Generator | None = None) -> None:
        if not greedy and rng is None:
            raise ValueError("sampling needs an explicit numpy Generator")
        self.policy, self.greedy, self.rng = policy, greedy, rng
        self._pre1: np.ndarray | None = None

    def begin(self, slot: SlotState) -> None:
        self._pre1 = self.policy.first(slot.state())

    def choose(self, slot: SlotState, mask: np.ndarray) -> int:
        assert self._pre1 is not None
        logits = self.policy.head(self._pre1)
        if self.greedy:
            return greedy_masked(logits, mask)
        assert self.rng is not None
        return sample_masked(logits, mask, self.rng)

    def applied(self, row: int, delta: np.ndarray) -> None:
        assert self._pre1 is not None
        self._pre1 = self._pre1 + self.policy.first_delta(row, delta)


def decide_slot(
    view: ClusterView,
    policy,
    enc: Encoding,
    greedy: bool = True,
    rng: np.random.Generator | None = None,
    record: bool = False,
) -> Decision:
    """One slot's decision by a :class:`~dl2ray.policy.network.NumpyPolicy`."""
    return run_decision(view, enc, PolicyChooser(policy, greedy, rng), record)
