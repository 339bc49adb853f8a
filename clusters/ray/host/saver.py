"""A job host's durable record (:mod:`clusters.ray.record`), written now or soon.

State changes and scale calls write the record at once; a slot's observation
is written by a thread of its own :data:`SAVE_DELAY_S` later, off the path of
the reading that closed it (a host restart may miss it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from clusters.ray.record import HostRecord, save_record

log = logging.getLogger(__name__)

SAVE_DELAY_S = 1.0
"""Seconds a slot's observation waits before the record is written (a host restart may miss it)."""


class RecordSaver:
    """Writes ``job``'s record as ``build`` makes it (module docstring)."""

    def __init__(self, job: str, build: Callable[[], HostRecord]) -> None:
        self.job, self.build = job, build
        self._lock = threading.Lock()
        self._dirty = threading.Event()
        threading.Thread(target=self._run, name="record-saver", daemon=True).start()

    def save(self) -> None:
        """Write the record now."""
        with self._lock:
            try:
                save_record(self.job, self.build())
            except Exception:  # the job goes on; only a later restart would miss this change
                log.exception("job %s: could not save the host record", self.job)

    def save_soon(self) -> None:
        """Write the record from the saver thread."""
        self._dirty.set()

    def _run(self) -> None:
        while True:
            self._dirty.wait()
            # a slot's observation is written a little after the reading that closed it, not while the
            # agent is still collecting every host's reading (the GCS write and JSON would compete with it)
            time.sleep(SAVE_DELAY_S)
            self._dirty.clear()
            self.save()
