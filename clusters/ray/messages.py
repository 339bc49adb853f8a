"""What a job host answers across processes: typed replies and readings instead of ``dict[str, Any]``.

A job host (:mod:`clusters.ray.job`) is a Ray actor; its answers travel to the
backend (:mod:`clusters.ray.backend`) pickled by Ray, and its pushed readings
travel through the GCS as JSON (:mod:`clusters.ray.readings`). Each is one
model here, the way :mod:`elastic_mxnet.protocol.messages` types the coordinator's wire:

* :class:`MemberActorInfo` — what a member actor says of itself (:mod:`clusters.ray.member`);
* :class:`SlotObservation` — what the job did in one slot (a row of its history);
* :class:`MemberRow` — one member actor alive, joined with the coordinator's view of it;
* :class:`ScaleCall` — one scale call as the host records it (a row of its actions);
* :class:`ScaleReply` — the answer of :meth:`~clusters.ray.job.JobHostImpl.scale_to` and ``cancel``;
* :class:`HostStatus` — the answer of ``status``/``slot_status``; :class:`PushedReading` — the one the host
  writes to the GCS itself, labelled with the slot it opens.

:meth:`HostStatus.to_dict` is the JSON a user sees (``dl2ray jobs status``, the
dashboard, the jobs API): the same keys as the dicts these models replaced.
Times are Unix seconds unless named otherwise.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from dl2ray.jobspec import JobSpec
from dl2ray.view import Observation
from elastic_mxnet.protocol.messages import ScalingEvent

TERMINAL = ("finished", "failed", "cancelled")
"""States a job never leaves."""


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MemberActorInfo(_Frozen):
    """A member actor's own account (``MemberImpl.info``): its process ``pid`` and Ray ``node`` id; the
    ``job`` and ``role`` it serves and its ``coordinator`` (``tcp://host:port``), all None while it idles
    in the warm pool; the ``exit_code`` of its run (None while it runs or idles); ``warm``: started by the
    pool (MXNet imported before any job)."""

    pid: int
    node: str
    job: str | None
    role: str | None
    coordinator: str | None
    exit_code: int | None
    warm: bool


class SlotObservation(_Frozen):
    """What the job did in slot ``slot``: ``epochs`` trained in ``seconds`` of wall time with ``ps`` PS and
    ``workers`` workers (its plan when the slot closed); ``loss`` NaN (live jobs report none)."""

    slot: int
    ps: int = Field(ge=0)
    workers: int = Field(ge=0)
    epochs: float = Field(ge=0)
    seconds: float
    loss: float = math.nan

    @field_validator("loss", mode="before")
    @classmethod
    def _null_is_nan(cls, v: Any) -> Any:
        return math.nan if v is None else v  # JSON has no NaN: a stored record writes it as null

    def observation(self) -> Observation:
        return Observation(self.slot, self.ps, self.workers, self.epochs, self.seconds, self.loss)


class MemberRow(_Frozen):
    """One member actor alive. ``pid``/``node`` None until it started (``node``: the wanted node then);
    ``member_id`` None until it registered; ``state``: ``member`` (in the plan), ``standby``, ``starting``
    (no process yet) or ``unregistered`` (a process the coordinator does not know)."""

    name: str
    role: Literal["ps", "worker"]
    pid: int | None
    node: str | None
    member_id: int | None
    state: str


class ScaleCall(_Frozen):
    """One scale call that reached the coordinator (or tried to start it): at ``time``, targets
    ``ps``/``workers`` (after clamping), ``seconds`` it took; ``plan_id``/``clock`` of the new plan when
    the coordinator rescaled (both None: it was not asked)."""

    time: float
    ok: bool
    reason: str
    ps: int
    workers: int
    seconds: float
    plan_id: int | None = None
    clock: int | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.plan_id is None and self.clock is None:
            return self.model_dump(exclude={"plan_id", "clock"})
        return self.model_dump()


class ScaleReply(_Frozen):
    """The answer of a control call. ``ps``/``workers``/``seconds``/``plan_id``/``clock`` as in
    :class:`ScaleCall` when the call ran; ``members``: the member actors alive afterwards (a scale call's
    reply, so the backend does not read the host again in the same slot); None where not given."""

    ok: bool
    reason: str = ""
    ps: int | None = None
    workers: int | None = None
    seconds: float | None = None
    plan_id: int | None = None
    clock: int | None = None
    members: tuple[MemberRow, ...] | None = None

    def call(self, time: float) -> ScaleCall:
        """The record of this reply as a call made at ``time`` (one that ran: ``ps``, ``workers`` set)."""
        assert self.ps is not None and self.workers is not None and self.seconds is not None
        return ScaleCall(time=time, ok=self.ok, reason=self.reason, ps=self.ps, workers=self.workers,
                         seconds=self.seconds, plan_id=self.plan_id, clock=self.clock)


class HostStatus(_Frozen):
    """A job as its host knows it now.

    ``state``: pending → running ⇄ paused → finished | failed | cancelled. ``ps``/``workers``: members in
    the running plan; ``epochs_done`` of ``est_epochs``; ``iteration`` the coordinator's version (None: no
    coordinator); ``samples_per_s``; ``operation`` the change in progress; ``busy``: a scale call runs;
    ``spawned``/``warm_taken``: member actors started / taken from the warm pool; ``restarts`` of the host.

    A full status (``status()``) has ``spec``, ``events``, ``history`` and ``actions``. A brief one
    (``slot_status()``, a pushed reading) has no events or actions and of the history only the
    observations from index ``history_from`` on; ``history_len`` is the full count. A pushed reading has
    no ``spec`` either (the reader has it from its first, direct read).
    """

    name: str
    job_id: int
    job_type: str
    state: str
    reason: str
    spec: JobSpec | None = None
    submitted_at: float
    started_at: float | None
    finished_at: float | None
    ps: int
    workers: int
    members: tuple[MemberRow, ...]
    epochs_done: float
    est_epochs: float
    iteration: int | None
    samples_per_s: float
    operation: str | None
    events: tuple[ScalingEvent, ...] = ()
    history: tuple[SlotObservation, ...] = ()
    actions: tuple[ScaleCall, ...] = ()
    busy: bool
    spawned: int
    warm_taken: int
    restarts: int
    history_from: int | None = None
    history_len: int | None = None

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    def to_dict(self) -> dict[str, Any]:
        """The status as JSON-ready values (the keys of ``dl2ray jobs status``); the optional fields only
        when set; a history loss stays NaN."""
        out = self.model_dump(exclude={k for k in _OPTIONAL if getattr(self, k) is None})
        if self.spec is not None:
            out["spec"] = self.spec.model_dump(mode="json")
        out.update(members=[m.model_dump() for m in self.members],
                   events=[e.model_dump(mode="json") for e in self.events],
                   history=[h.model_dump() for h in self.history],
                   actions=[a.to_dict() for a in self.actions])
        return out


_OPTIONAL = ("spec", "history_from", "history_len")


class PushedReading(HostStatus):
    """A brief status the host wrote to the GCS itself (:mod:`clusters.ray.readings`): on opening slot
    ``slot`` of the clock (``epoch``, ``slot_seconds``) it follows, or after any change; ``pushed_at``: when
    written. Its history is the last :data:`~clusters.ray.readings.TAIL` observations."""

    slot: int
    epoch: float
    slot_seconds: float
    pushed_at: float

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PushedReading:
        return cls.model_validate(d)
