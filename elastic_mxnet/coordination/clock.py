"""The scaling clock: the first iteration no worker can have started when a plan arrives.

Pure arithmetic over what heartbeats tell the coordinator; no sockets, no time source.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

PROCESSING_S = 0.010
"""Allowance (seconds) for handling a Prepare on both ends, added to two round trips."""


@dataclass(frozen=True)
class Progress:
    """One worker as last heard: it started ``iteration`` at ``since_s`` seconds ago.

    ``rate``: iterations per second (moving average); ``rtt_s``: heartbeat round trip (s).
    """

    iteration: int
    since_s: float
    rate: float
    rtt_s: float


def estimated_iteration(workers: Sequence[Progress], extrapolate_s: float) -> float:
    """Furthest iteration a worker has started, extrapolating at most ``extrapolate_s`` seconds.

    ``max_w(iteration_w + rate_w * min(since_w, extrapolate_s))``; -1 without workers.
    """
    return max((w.iteration + w.rate * min(w.since_s, extrapolate_s) for w in workers), default=-1)


def scaling_clock(
    workers: Sequence[Progress],
    ps_versions: Sequence[int] = (),
    extrapolate_s: float = 0.2,
    floor: int = -1,
    margin: bool = True,
) -> int:
    """``max(floor(estimate), floor) + 1``, at least every PS version, plus the in-flight margin.

    The margin ``ceil(max rate * (2 * max rtt + PROCESSING_S))`` counts the
    iterations a worker can start while Prepare travels and is answered.
    Without ``margin`` (recovery after a failure: the workers are blocked)
    progress is not extrapolated either. ``floor``: an iteration a worker
    reported in a refusal, which the clock must pass.
    """
    estimate = estimated_iteration(workers, extrapolate_s if margin else 0.0)
    clock = max(math.floor(estimate), floor) + 1
    clock = max([clock, *ps_versions])
    if margin:
        rate = max((w.rate for w in workers), default=0.0)
        rtt = max((w.rtt_s for w in workers), default=0.0)
        clock += math.ceil(rate * (2 * rtt + PROCESSING_S))
    return clock
