"""A job host's pushed readings (:mod:`clusters.ray.readings`): the slot clock it follows and the writes.

Once a backend hands the host the agent's slot clock
(:class:`~clusters.ray.record.SlotClock`), a thread of the host opens each slot
``lead_s`` before it starts — closing the slot before — and writes the job's
reading to the GCS. Every status read, scale call and cancel writes one too, so
the stored reading is the host's latest knowledge; a read older than the one
last written never overwrites it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from clusters.ray.host.slots import SlotBook
from clusters.ray.messages import PushedReading, SlotObservation
from clusters.ray.readings import put_reading
from clusters.ray.record import SlotClock
from elastic_mxnet.protocol.messages import StatusReply

log = logging.getLogger(__name__)

Read = Callable[[], tuple[float, StatusReply | None]]
"""Reads the coordinator: (monotonic time of the read, its status or None)."""
Close = Callable[[int, StatusReply | None], SlotObservation | None]
"""Opens slot ``k`` (closing ``k - 1``) from a status read."""
Build = Callable[[StatusReply | None, SlotClock], PushedReading]
"""The reading of a status read at the followed clock."""


class ReadingPusher:
    """Follows the agent's slot clock for one job (module docstring). ``clock``: the one a restarted host
    follows (its record's), None: none until a backend hands one over."""

    def __init__(self, job: str, slots: SlotBook, read: Read, close: Close, build: Build,
                 clock: SlotClock | None = None) -> None:
        self.job, self.slots = job, slots
        self._read, self._close, self._build = read, close, build
        self.clock = clock
        self._lock = threading.Lock()  # closing a slot and writing the reading, in order
        self._pushed_at = 0.0  # monotonic time of the coordinator read behind the last reading written
        self._pushed_st: StatusReply | None = None  # that read
        self._wake = threading.Event()  # a new clock: the thread computes its next push time again

    def start(self) -> None:
        threading.Thread(target=self._run, name="slot-pusher", daemon=True).start()

    def follow(self, clock: SlotClock) -> bool:
        """Push at ``clock``'s slots from now on; whether it is a new clock (the record must keep it)."""
        if clock == self.clock:
            return False
        self.clock = clock
        self._wake.set()
        return True

    def close_slot(self, slot: int, st: StatusReply | None) -> SlotObservation | None:
        """Open ``slot`` (closing the one before) in order with the pushes."""
        with self._lock:
            return self._close(slot, st)

    def publish(self, st: StatusReply | None, at: float, opens: int | None = None) -> None:
        """Open slot ``opens`` (if given) and write the reading built from ``st`` (the coordinator's status
        read at monotonic time ``at``). If a later read was written meanwhile, the reading is written again
        only if a slot was opened, from that later read (never an older state)."""
        with self._lock:
            opened = opens is not None and opens > self.slots.opened
            if opens is not None:
                self._close(opens, st)
            clock = self.clock
            if clock is None:
                return
            if at < self._pushed_at:
                if not opened:
                    return
                st = self._pushed_st
            else:
                self._pushed_at, self._pushed_st = at, st
            try:
                put_reading(self.job, self._build(st, clock))
            except Exception:  # the reader finds the previous one, treats the job as late, asks directly
                log.exception("job %s: could not write its reading", self.job)

    def _run(self) -> None:
        """Open each slot of the followed clock at its push time: close the slot before, push the reading."""
        while True:
            clock = self.clock
            if clock is None:
                self._wake.wait()
                self._wake.clear()
                continue
            slot = clock.next_slot(time.time())
            if self._wake.wait(max(clock.push_time(slot) - time.time(), 0.0)):
                self._wake.clear()  # a new clock
                continue
            try:
                at, st = self._read()
                self.publish(st, at, opens=slot)
            except Exception:  # the next slot tries again; the agent asks directly meanwhile
                log.exception("job %s: could not push the reading of slot %d", self.job, slot)
