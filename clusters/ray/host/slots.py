"""A job's slot observations: what it did in each slot the agent opened (its history), and the slot mark.

The agent's slots are closed one at a time: opening slot ``k`` closes slot
``k - 1`` into one :class:`~clusters.ray.messages.SlotObservation` — the epochs
trained since the previous mark, the wall seconds, the PS/workers of the plan.
Closing is idempotent per slot (the pusher and the direct reads both open slots).
"""

from __future__ import annotations

import time

from clusters.ray.messages import SlotObservation
from elastic_mxnet.protocol.messages import StatusReply


class SlotBook:
    """The history of one job and its last mark. ``opened``: the latest slot opened (its readings'
    label); ``mark``: (Unix time, epochs done) at the last close, None before the job ran."""

    def __init__(self, history: list[SlotObservation] | None = None) -> None:
        self.history: list[SlotObservation] = list(history or [])
        self.opened = self.history[-1].slot + 1 if self.history else -1
        self.mark: tuple[float, float] | None = None

    def last_epochs(self) -> float:
        """Epochs done at the last mark (0 before any)."""
        return self.mark[1] if self.mark else 0.0

    def close(self, slot: int, st: StatusReply | None, epochs: float,
              started: bool) -> SlotObservation | None:
        """Open ``slot``: close slot ``slot - 1`` (``st``: the coordinator's status, None: none; ``epochs``:
        the epochs done then; ``started``: the job left ``pending``, so the mark is taken). The new
        observation, the one already closed for ``slot - 1``, or None (no mark before: nothing to close)."""
        self.opened = max(self.opened, slot)
        if self.history and self.history[-1].slot >= slot - 1:
            return self.history[-1] if self.history[-1].slot == slot - 1 else None
        now = time.time()
        plan = [m for m in st.members if m.state == "member"] if st else []
        obs = None
        if self.mark is not None:
            t0, e0 = self.mark
            obs = SlotObservation(slot=slot - 1, ps=sum(m.role == "ps" for m in plan),
                                  workers=sum(m.role == "worker" for m in plan),
                                  epochs=max(epochs - e0, 0.0), seconds=now - t0)
            self.history.append(obs)
        if started:
            self.mark = (now, epochs)
        return obs
