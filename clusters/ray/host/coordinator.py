"""A job host's elastic MXNet coordinator: its config, its thread, and the client that reads it.

The coordinator (:class:`~elastic_mxnet.coordination.coordinator.Coordinator`) runs in a
thread of the host actor, on this node's address; its members reach it over
ZeroMQ. :class:`CoordinatorRunner` starts it (fresh, or in *rejoin* mode on a
restarted host's old address), reads its status through one persistent client
(no new ZeroMQ context per read), asks it to rescale, and stops it.
"""

from __future__ import annotations

import threading

from clusters.ray.host.members import HostMembers
from dl2ray.jobspec import JobSpec
from elastic_mxnet.config import JobConfig, Limits, Liveness
from elastic_mxnet.coordination.coordinator import Coordinator
from elastic_mxnet.job import ElasticJob, ScaleRefused
from elastic_mxnet.protocol.messages import ScaleReply as CoordinatorScaleReply
from elastic_mxnet.protocol.messages import ScalingEvent, StatusReply

STATUS_TIMEOUT_S = 10.0
"""Seconds a status read waits for the coordinator (a busy one answers late: the read says nothing)."""


class CoordinatorRunner:
    """The coordinator of one job (module docstring). ``liveness``: its heartbeat and orphan timeouts;
    ``register_timeout_s``: how long new members may take to register."""

    def __init__(self, members: HostMembers, liveness: Liveness, register_timeout_s: float) -> None:
        self.members = members
        self.liveness, self.register_timeout_s = liveness, register_timeout_s
        self.coordinator: Coordinator | None = None
        self.thread: threading.Thread | None = None
        self.events: list[ScalingEvent] = []  # its scaling events, as last read
        self._lock = threading.Lock()  # the one client, shared by every reader
        self._client: ElasticJob | None = None

    @property
    def address(self) -> str | None:
        """``tcp://host:port`` of the coordinator; None before it started."""
        return self.coordinator.address if self.coordinator else None

    @property
    def running(self) -> bool:
        """Whether its thread runs."""
        return self.thread is not None and self.thread.is_alive()

    def ended(self) -> int | None:
        """The coordinator's exit code once its thread ended (0: the job finished), else None."""
        if self.thread is None or self.thread.is_alive():
            return None
        assert self.coordinator is not None
        return self.coordinator.exit_code

    def config(self, spec: JobSpec, ps: int, workers: int, address: str | None = None) -> JobConfig:
        """The coordinator's config: on this node's address, a fresh port (or ``address``'s: a restart)."""
        import ray.util

        port = int(address.rsplit(":", 1)[1]) if address else 0
        return JobConfig(host=ray.util.get_node_ip_address(), port=port, initial_ps=ps,
                         initial_workers=workers, liveness=self.liveness,
                         limits=Limits(min_ps=1, max_ps=spec.ps_count.max, min_workers=0,
                                       max_workers=spec.workers.max,
                                       register_timeout_s=self.register_timeout_s))

    def start(self, cfg: JobConfig, rejoin: bool) -> None:
        """The coordinator in a thread; ``rejoin``: a restarted host's, rebuilding from its members."""
        self.coordinator = Coordinator(cfg, self.members.for_coordinator(), rejoin=rejoin)
        self.thread = threading.Thread(target=self.coordinator.serve, name="coordinator", daemon=True)
        self.thread.start()

    def read(self) -> StatusReply | None:
        """The coordinator's status now; None when there is none or it did not answer in time."""
        if self.coordinator is None:
            return None
        with self._lock:
            if self._client is None or self._client.address != self.coordinator.address:
                if self._client is not None:
                    self._client.close()
                self._client = ElasticJob(self.coordinator.address, timeout_s=STATUS_TIMEOUT_S)
            try:
                st = self._client.status(timeout_s=STATUS_TIMEOUT_S)
            except (TimeoutError, ScaleRefused):
                return None
        self.events = list(st.events)
        return st

    def scale(self, ps: int, workers: int) -> CoordinatorScaleReply:
        """Ask the running coordinator for ``ps`` PS and ``workers`` workers (waits for the new members to
        register); raises :class:`ScaleRefused` or :class:`TimeoutError`."""
        assert self.coordinator is not None
        with ElasticJob(self.coordinator.address, timeout_s=self.register_timeout_s + 60) as job:
            return job.scale(ps=ps, workers=workers)

    def stop(self, wait_s: float = 10.0) -> None:
        """End the coordinator's loop at its next tick (it stops the members) and wait for its thread."""
        if self.coordinator is None:
            return
        self.coordinator.state = "done"
        if self.thread is not None:
            self.thread.join(timeout=wait_s)
