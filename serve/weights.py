"""The served policy's weights: a versioned reference, swapped in by a background watcher.

:class:`PolicyStore` holds one immutable :class:`Loaded` (a version string and
the :class:`~dl2ray.schedulers.dl2.DL2Scheduler` built from it). A request
reads :attr:`PolicyStore.current` once and decides with that object, so a swap
never touches a decision in flight: requests that started before it finish on
the old weights, later ones use the new, and none waits or fails. New weights
are loaded off the request path, by a daemon thread that polls a
:class:`Source` every ``period_s`` seconds and swaps the reference only after
the new scheduler is built; a source that fails (a half-written file, an
unreachable actor) is logged and counted, and the old weights stay.

Sources (both return the bytes of a checkpoint file, which
:meth:`DL2Scheduler.from_checkpoint_bytes` reads with the same checks as
``dl2:PATH``):

- :class:`CheckpointFile`: a file watched for changes (mtime, size, inode);
  version ``NAME@SHA12`` (the first 12 hex digits of the content's SHA-256,
  so rewriting identical bytes is not a new version). Write new weights with
  an atomic rename (``os.replace``), as the trainers do.
- :class:`GlobalPolicyPull`: the federated trainer's ``GlobalPolicy`` Ray actor,
  found by name; version ``global:NAME@UPDATES``. It talks to the actor only
  through its ``checkpoint_bytes(since)`` method (no import of ``clusters``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from dl2ray.errors import UserError
from dl2ray.schedulers.dl2 import DL2Scheduler

log = logging.getLogger("dl2ray.serve")


@dataclass(frozen=True)
class Loaded:
    """One set of weights as served: ``version`` names it in every response."""

    version: str
    scheduler: DL2Scheduler
    source: str
    loaded_at: float  # Unix time of the swap


class Source(Protocol):
    name: str  # "checkpoint:PATH" or "global:ACTOR"

    def poll(self, current: str | None) -> tuple[str, bytes] | None:
        """New ``(version, checkpoint bytes)`` if the weights differ from version ``current``, else None."""
        ...


class CheckpointFile:
    """A checkpoint file, re-read when its (mtime, size, inode) changes."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.name = f"checkpoint:{self.path}"
        self._stat: tuple[int, int, int] | None = None

    def poll(self, current: str | None) -> tuple[str, bytes] | None:
        st = os.stat(self.path)
        key = (st.st_mtime_ns, st.st_size, st.st_ino)
        if key == self._stat:
            return None
        data = self.path.read_bytes()
        self._stat = key  # if the file changed again meanwhile, the next poll sees a new key and re-reads
        version = f"{self.path.name}@{hashlib.sha256(data).hexdigest()[:12]}"
        return None if version == current else (version, data)


class GlobalPolicyPull:
    """The ``GlobalPolicy`` actor named ``actor`` (in Ray ``namespace``), asked for newer weights."""

    def __init__(self, actor: str, namespace: str | None = None, timeout_s: float = 30.0) -> None:
        self.actor, self.namespace, self.timeout_s = actor, namespace, timeout_s
        self.name = f"global:{actor}"
        self._handle: Any = None  # the GlobalPolicy actor, looked up on the first poll
        self._updates = -1

    def poll(self, current: str | None) -> tuple[str, bytes] | None:
        import ray

        if self._handle is None:
            self._handle = ray.get_actor(self.actor, namespace=self.namespace)
        try:
            ref = self._handle.checkpoint_bytes.remote(self._updates)
            updates, data = ray.get(ref, timeout=self.timeout_s)
        except Exception:
            self._handle = None  # look the actor up again next time (it may have been replaced)
            raise
        if data is None:
            return None
        self._updates = int(updates)
        version = f"global:{self.actor}@{updates}"
        return None if version == current else (version, data)


class PolicyStore:
    """The current weights and the watcher that replaces them (module docstring).

    ``initial``: where the first weights come from (loaded before the
    constructor returns; a failure raises :class:`UserError`); ``watch``: the
    source polled every ``period_s`` seconds afterwards (``None`` or
    ``period_s`` 0: never). Call :meth:`close` to stop the watcher.
    """

    def __init__(self, cfg, initial: Source, watch: Source | None, period_s: float) -> None:
        self.cfg = cfg
        self.reloads = 0  # swaps after the first load
        self.failures = 0  # polls that raised
        self.last_error: str | None = None
        got = self._poll(initial, None)
        if got is None:
            raise UserError(f"{initial.name}: no weights to serve")
        self._current = got
        self._watch, self._period = watch, period_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if watch is not None and period_s > 0:
            self._thread = threading.Thread(target=self._run, name="dl2ray-serve-weights", daemon=True)
            self._thread.start()

    @property
    def current(self) -> Loaded:
        return self._current

    @property
    def watching(self) -> bool:
        """True while the watcher thread runs (or none was asked for)."""
        return self._thread is None or self._thread.is_alive()

    def _poll(self, source: Source, current: str | None) -> Loaded | None:
        try:
            got = source.poll(current)
            if got is None:
                return None
            version, data = got
            scheduler = DL2Scheduler.from_checkpoint_bytes(data, self.cfg)
        except UserError as exc:
            raise UserError(f"{source.name}: {exc}") from None
        except OSError as exc:
            raise UserError(f"{source.name}: {exc}") from None
        return Loaded(version, scheduler, source.name, time.time())

    def refresh(self) -> bool:
        """Poll the watched source once; True if new weights were swapped in. Raises what the poll raised."""
        if self._watch is None:
            return False
        new = self._poll(self._watch, self._current.version)
        if new is None:
            return False
        self._current = new  # one reference assignment: atomic for the requests that read it
        self.reloads += 1
        log.info("serving policy %s (from %s)", new.version, new.source)
        return True

    def _run(self) -> None:
        while not self._stop.wait(self._period):
            try:
                self.refresh()
            except Exception as exc:  # the loop must outlive any one failed poll; the old weights stay
                self.failures += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("weights not reloaded: %s", self.last_error)

    def close(self) -> None:
        """Stop the watcher (waits for a poll in progress)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=60)
