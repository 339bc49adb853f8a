"""Fixtures for the elastic_mxnet tests: real jobs in subprocesses, killed in teardown.

Every job runs ``python -m elastic_mxnet.launch`` in a new session, so the
launcher and every PS and worker it spawns share one process group; teardown
kills that group (and any group a test started) by id. Ports are chosen by
the coordinator (port 0) and read back from its address file.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from elastic_mxnet.coordination.coordinator import Coordinator
from elastic_mxnet.job import ElasticJob
from elastic_mxnet.protocol.messages import StatusReply

PY = sys.executable
TRAIN = [PY, "-m", "elastic_mxnet.demo_train"]


@dataclass
class Job:
    """A launched job: its launcher process, coordinator address and control client."""

    proc: subprocess.Popen
    address: str
    job: ElasticJob
    workdir: Path
    groups: list[int] = field(default_factory=list)

    def status(self) -> StatusReply:
        return self.job.status(timeout_s=10)

    def wait_for(
        self, predicate: Callable[[StatusReply], bool], what: str, timeout_s: float = 600
    ) -> StatusReply:
        """Poll status until ``predicate`` holds. Hang protection only, never a timing assertion: it fails
        after ``timeout_s`` seconds in which the job did not move (its state, clock and membership), so a
        loaded machine only makes the wait longer."""
        deadline = time.monotonic() + timeout_s
        seen: tuple | None = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"launcher exited with {self.proc.returncode} waiting for {what}"
                )
            try:
                st = self.status()
            except TimeoutError:
                continue
            if predicate(st):
                return st
            moved = (st.state, st.version, tuple((m.role, m.state) for m in st.members))
            if moved != seen:
                seen, deadline = moved, time.monotonic() + timeout_s
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}")

    def open_gate(self, iteration: int) -> None:
        (self.workdir / f"gate-{iteration}").touch()

    def wait_exit(self, timeout_s: float = 600) -> int:
        return self.proc.wait(timeout=timeout_s)

    def restart_coordinator(self, launch_args: list[str], worker_args: list[str]) -> None:
        """SIGKILL the launcher (members survive); start one on the same port with --rejoin."""
        self.proc.kill()
        self.proc.wait()
        port = self.address.rsplit(":", 1)[1]
        args = ["--rejoin", "--port", port, *launch_args, "--", *TRAIN, *worker_args]
        proc, address = _start_launch(args, self.workdir, "restarted")
        assert address == self.address
        self.proc = proc
        self.groups.append(proc.pid)


def _start_launch(args: list[str], workdir: Path, name: str) -> tuple[subprocess.Popen, str]:
    addr_file = workdir / f"{name}.addr"
    log = open(workdir / f"{name}.log", "wb")  # noqa: SIM115 (closed with the process)
    proc = subprocess.Popen(
        [PY, "-m", "elastic_mxnet.launch", "-v", "--address-file", str(addr_file), *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        cwd=workdir,
    )
    log.close()
    deadline = time.monotonic() + 600  # hang protection (a loaded machine imports MXNet slowly)
    while not addr_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"launcher did not start: {(workdir / f'{name}.log').read_text()}")
        time.sleep(0.05)
    return proc, addr_file.read_text()


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


@pytest.fixture
def launch_job(tmp_path: Path) -> Iterator[Callable[..., Job]]:
    """Factory: ``launch_job(launch_args, worker_args)`` starts a job; all killed at teardown."""
    jobs: list[Job] = []

    def start(launch_args: list[str], worker_args: list[str]) -> Job:
        proc, address = _start_launch(
            [*launch_args, "--", *TRAIN, *worker_args], tmp_path, f"job{len(jobs)}"
        )
        job = Job(proc, address, ElasticJob(address, timeout_s=120), tmp_path, [proc.pid])
        jobs.append(job)
        return job

    yield start
    for job in jobs:
        job.job.close()
        for pgid in job.groups:
            _kill_group(pgid)
        for pgid in job.groups:
            _wait_group_gone(pgid)


def _live_members(pgid: int) -> list[int]:
    """Pids in process group ``pgid`` that are not zombies (from /proc)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(stat.parent.name))
    return pids


def _wait_group_gone(pgid: int) -> None:
    deadline = time.monotonic() + 10
    while _live_members(pgid):
        if time.monotonic() > deadline:
            raise AssertionError(
                f"processes {_live_members(pgid)} of group {pgid} survived SIGKILL"
            )
        time.sleep(0.05)


@pytest.fixture
def coordinator_thread() -> Iterator[Coordinator]:
    """A real coordinator (no spawner) serving in a thread of the test process."""
    from elastic_mxnet.config import JobConfig

    coord = Coordinator(JobConfig())
    thread = threading.Thread(target=coord.serve, daemon=True)
    thread.start()
    yield coord
    coord.state = "done"
    thread.join(timeout=10)


@pytest.fixture
def reference() -> Callable[..., list[np.ndarray]]:
    """The no-scaling reference training (see :func:`reference_params`)."""
    return reference_params


def reference_params(
    model: str,
    iterations: int,
    optimizer: str,
    lr: float,
    momentum: float = 0.9,
    global_batch: int = 32,
    samples: int = 512,
    seed: int = 0,
) -> list[np.ndarray]:
    """The same training as ``demo_train`` in one process with stock ``gluon.Trainer``."""
    from elastic_mxnet._mx import mx
    from elastic_mxnet.training import models
    from elastic_mxnet.training.sharder import DataSharder

    net = models.build(model)
    models.init_params(net, seed)
    x, y = models.synthetic_data(model, samples, seed + 1)
    opt = {"learning_rate": lr, **({"momentum": momentum} if optimizer == "sgd" else {})}
    trainer = mx.gluon.Trainer(net.collect_params(), optimizer, opt, kvstore=None)
    sharder = DataSharder(samples, global_batch, seed)
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    for t in range(iterations):
        idx = sharder.global_indices(t)
        with mx.autograd.record():
            loss = loss_fn(net(mx.nd.array(x[idx])), mx.nd.array(y[idx]))
        loss.backward()
        trainer.step(len(idx))
    return [p.data().asnumpy() for p in net.collect_params().values()]
