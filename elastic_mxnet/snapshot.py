"""Periodic shard snapshots of a PS, written in the background, one file per chunk.

``<dir>/chunk-<cid>.npz`` holds the chunk's values, its optimizer state arrays,
its update count and the PS version it was taken at. Files are written to a
temporary name and renamed, so a reader sees either the previous complete
snapshot or the new one. The directory must be shared by all PS of a job
(local disk for ``launch``; a shared volume on Kubernetes).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from elastic_mxnet.optim import ChunkState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Restored:
    """A chunk read back from its snapshot, and the PS version it was taken at."""

    chunk: ChunkState
    version: int


def chunk_path(directory: str, cid: int) -> Path:
    return Path(directory) / f"chunk-{cid}.npz"


def write_chunk(directory: str, cid: int, chunk: ChunkState, version: int) -> None:
    """Write one chunk snapshot atomically."""
    final = chunk_path(directory, cid)
    tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    arrays = {"values": chunk.values, **{f"state_{k}": v for k, v in chunk.state.items()}}
    with open(tmp, "wb") as f:
        np.savez(f, steps=np.int64(chunk.steps), version=np.int64(version), **arrays)
    os.replace(tmp, final)


def read_chunk(directory: str, cid: int) -> Restored:
    """Read the snapshot of chunk ``cid``; raise ``FileNotFoundError`` if there is none."""
    with np.load(chunk_path(directory, cid)) as z:
        state = {k[len("state_") :]: np.array(z[k]) for k in z.files if k.startswith("state_")}
        chunk = ChunkState(np.array(z["values"]), state, int(z["steps"]))
        return Restored(chunk, int(z["version"]))


class Snapshotter:
    """Writes copies of chunks in a background thread; at most one snapshot queued."""

    def __init__(self) -> None:
        self._queue: queue.Queue[tuple[str, dict[int, ChunkState], int] | None] = queue.Queue(1)
        self._thread = threading.Thread(target=self._run, name="snapshot", daemon=True)
        self._thread.start()
        self.skipped = 0

    def submit(self, directory: str, chunks: dict[int, ChunkState], version: int) -> bool:
        """Queue a copy of ``chunks`` at ``version``; False (skipped) if one is still pending."""
        copies = {
            cid: ChunkState(c.values.copy(), {k: v.copy() for k, v in c.state.items()}, c.steps)
            for cid, c in chunks.items()
        }
        try:
            self._queue.put_nowait((directory, copies, version))
            return True
        except queue.Full:
            self.skipped += 1
            return False

    def close(self) -> None:
        """Finish the pending snapshot, then stop the thread."""
        self._queue.put(None)
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            directory, chunks, version = item
            try:
                for cid, chunk in chunks.items():
                    write_chunk(directory, cid, chunk, version)
            except OSError as exc:
                log.error("snapshot at version %d failed: %s", version, exc)
