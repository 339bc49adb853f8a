"""Early refusal under overload: answer "busy" at once rather than decide seconds late.

A decision is CPU work on the replica's one event loop (a few ms for a 40-job
view); requests that arrive faster than that queue on the loop. A scheduler
asks once per slot and can decide locally with a heuristic, so a late answer
is worth less than an immediate refusal. :class:`Admission` keeps every
request the replica holds within ``bound_s`` of its arrival:

- **at arrival** (:meth:`Admission.arrive`): behind ``held`` requests, this
  one is expected to finish after ``(held + 1) × service_s`` seconds,
  where ``service_s`` is the recent mean time one decision takes on the replica
  (an exponentially weighted mean, weight ``alpha`` on the latest; the first
  decision, which compiles the decision loop, is left out, and a sample counts at
  most ``bound_s``: one slow outlier must not refuse the next hundred). Beyond
  ``bound_s`` the request is refused on the spot — reading no body, deciding
  nothing, so refusing costs a small fraction of deciding;
- **before its decision** (:meth:`Ticket.late`): a request admitted on a
  prediction that turned out short (a burst, the cores taken by another
  process) and that has already waited so long that ``waited + service_s``
  exceeds the bound is refused then, not decided.

A refused HTTP request gets ``503`` with ``Retry-After: retry_after_s``; a gRPC
call ``RESOURCE_EXHAUSTED``. The bound holds for the time the replica holds a
request; what happens before it reaches the replica (the kernel's accept queue,
Serve's proxy when there is one) is bounded separately by Serve's
``max_queued_requests`` (docs/serve.md, "Overload").

The bound is on *waiting*: a request with nothing ahead of it is always
decided, however long its own decision takes (a huge view, a slow moment of
the machine). ``bound_s = 0`` turns admission off (every request is decided,
however late).
The decisions run one at a time on a thread of their own (:meth:`serve.service.DecisionCore.admitted`),
so the event loop stays free to read, count and refuse new requests while one is decided; the
counters change only on the event loop (:meth:`Ticket.late` only reads): no locks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass
class Ticket:
    """One admitted request: when it arrived (``perf_counter`` seconds). ``done()`` when answered."""

    admission: Admission
    arrived: float
    ahead: int  # requests the replica held when this one arrived
    open: bool = True

    def late(self) -> bool:
        """True if deciding it now would finish past the bound. Reads only: safe on the decision thread;
        the caller then refuses it on the event loop (:meth:`Admission.refuse_late`)."""
        a = self.admission
        return not (a.bound_s <= 0 or self.ahead == 0
                    or time.perf_counter() - self.arrived + a.service_s <= a.bound_s)

    def done(self, service_s: float | None = None) -> None:
        """The request left the replica; ``service_s``: the seconds its decision took, if it was decided."""
        if self.open:
            self.open = False
            self.admission.held -= 1
        if service_s is not None:
            self.admission.observe(service_s)


@dataclass
class Admission:
    """Admission control for one replica (module docstring). Counters are read by ``GET /v1/policy``."""

    bound_s: float
    retry_after_s: int = 1
    alpha: float = 0.1
    service_s: float = 0.003  # prior: a 40-job decision on this machine (docs/BENCHMARKS.md)
    held: int = 0
    decided: int = 0
    admitted: int = 0
    refused_arrival: int = 0
    refused_late: int = 0

    def arrive(self) -> Ticket | None:
        """A ticket for a new request, or None if it must be refused now (counted)."""
        if self.bound_s > 0 and self.held > 0 and (self.held + 1) * self.service_s > self.bound_s:
            self.refused_arrival += 1
            return None
        ticket = Ticket(self, time.perf_counter(), self.held)
        self.held += 1
        self.admitted += 1
        return ticket

    def refuse_late(self, ticket: Ticket) -> None:
        """``ticket`` was found late before its decision: refused, counted, out of the queue."""
        self.refused_late += 1
        ticket.done()

    def observe(self, seconds: float) -> None:
        """One decision's duration into the running mean (module docstring)."""
        self.decided += 1
        if self.decided > 1:
            sample = min(seconds, self.bound_s) if self.bound_s > 0 else seconds
            self.service_s += self.alpha * (sample - self.service_s)

    @property
    def refused(self) -> int:
        return self.refused_arrival + self.refused_late

    def stats(self) -> dict[str, float | int]:
        return {"bound_ms": self.bound_s * 1e3, "service_ms": round(self.service_s * 1e3, 3),
                "held": self.held, "admitted": self.admitted, "refused_arrival": self.refused_arrival,
                "refused_late": self.refused_late}
