"""How a federation member reaches the learner: a *link*. :class:`ActorLink` (same Ray cluster: calls on
the named actor, retried by Ray while the learner restarts) or :class:`clusters.federation.http.HttpLink`
(another Ray cluster: the learner's HTTP endpoint with the shared token). Both raise :class:`LinkDown`
when the learner cannot be reached."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import ray

from clusters.runtime import NAMESPACE
from dl2ray.learn.records import UpdateRecord


class LinkDown(RuntimeError):
    """The learner cannot be reached now (the member backs off and retries)."""


class Link(Protocol):
    def join(self, name: str) -> dict[str, Any]: ...
    def push(self, name: str, flat_grad: np.ndarray, row: UpdateRecord, version: int, boot: int,
             pull: bool) -> dict[str, Any]: ...
    def pull(self, name: str, since: int, boot: int) -> dict[str, Any]: ...
    def report(self, name: str, update: int, val_jct: float, drf_jct: float) -> None: ...


class ActorLink:
    """Calls on the named learner actor of the current Ray cluster."""

    def __init__(self, actor_name: str, timeout_s: float = 60.0) -> None:
        self.actor_name, self.timeout_s = actor_name, timeout_s
        self.bytes_last = 0  # no HTTP: nothing to measure

    def _call(self, method: str, *args: Any) -> Any:
        try:
            actor = ray.get_actor(self.actor_name, namespace=NAMESPACE)
            return ray.get(getattr(actor, method).remote(*args), timeout=self.timeout_s)
        except (ValueError, ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
            raise LinkDown(f"learner {self.actor_name}: {type(exc).__name__}: {exc}") from exc

    def join(self, name: str) -> dict[str, Any]:
        return self._call("join", name)

    def push(self, name, flat_grad, row, version, boot, pull):
        return self._call("push_member", name, flat_grad, row, version, boot, pull, 0)

    def pull(self, name, since, boot):
        return self._call("pull_member", name, since, boot)

    def report(self, name, update, val_jct, drf_jct):
        self._call("report", name, update, val_jct, drf_jct)

    def status(self) -> dict[str, Any]:
        """The learner's status: updates and each member's counts and staleness (the agent's dashboard)."""
        return self._call("status")
