"""The operator's profile measured on a live cluster: real elastic MXNet jobs, hot-scaled through the points.

``dl2ray profile --live JOB.yaml [--live JOB2.yaml ...]`` (its composition root:
:mod:`clusters.cli.profile_live`) writes the same file
as the simulated ``dl2ray profile`` (:mod:`dl2ray.knowledge.profile`), but every point is
a measurement of a real job on this machine. For each job spec
(:mod:`dl2ray.jobspec`):

1. its points are the requested ``(PS, workers)`` points inside the spec's
   bounds (``ps_count``, ``workers``) and its catalogue type's caps, measured in
   the order ``(workers, PS)`` ascending: a worker is an MXNet process whose
   start-up costs seconds, so each worker count is reached once; PS are cheap;
2. one elastic job starts at the first point
   (``python -m elastic_mxnet.launch`` in a process group of its own, workers
   running ``python -m elastic_mxnet.demo_train`` with ``spec.worker_args()``,
   training until stopped);
3. at each point the job is hot-scaled with
   :meth:`elastic_mxnet.job.ElasticJob.scale` (it keeps training; the call
   returns when the workers resumed on the new plan), its plan's members are
   checked against the point, ``Window.warmup_iterations`` iterations run,
   then the window is measured (below);
4. the job is stopped (:meth:`~elastic_mxnet.job.ElasticJob.stop`) and its
   process group killed — also on an error, Ctrl-C or SIGTERM.

**What is measured.** The speed is the rate of the coordinator's ``version``
(``status().version``: the updates every PS applied, i.e. the job's completed
synchronous iterations), not the coordinator's ``samples_per_s``: that one is
an exponentially weighted average of the *fastest* worker's heartbeat rate —
biased upwards by the maximum over noisy estimates and lagging behind a scale
change (it read 214 samples/s where the iteration count gave 180 at 1 PS × 2
workers of ``examples/jobs/mlp-small.yaml``; it is kept in the file for
comparison). ``version`` reaches the coordinator with the PS heartbeats
(every 0.1 s), so the time at which each new version is first seen lags its
true time by a heartbeat plus a poll; the window records the time of every
version change it sees and takes the least-squares slope of version over time
through them (:func:`iteration_rate`): the lags cancel in the slope and no
single late heartbeat moves it. The window is ``Window.iterations`` iterations
or ``Window.seconds`` seconds, from the first version change after the warm-up.

**Unit.** A job's epoch is ``samples`` samples, so at ``r`` iterations/s it
takes ``samples / (r · global_batch)`` seconds; the profile stores batches/s of
its catalogue type ``t`` such that ``batches_per_epoch(t) / speed`` is that
time::

    speed = batches_per_epoch(t) · r · global_batch / samples

Several specs of one type average their common points (as ``measure(runs>1)``
does). Types no spec measured are absent from the file, and
:meth:`dl2ray.knowledge.profile.Profile.covers` refuses the profile for a config whose
catalogue needs them.
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dl2ray.errors import UserError
from dl2ray.jobspec import JobSpec, load_jobspec
from dl2ray.knowledge.profile import Fit, Profile, fit_profile
from dl2ray.measurements import Measurement
from dl2ray.workload import JobCatalogue, JobType

if TYPE_CHECKING:
    from elastic_mxnet.job import ElasticJob
    from elastic_mxnet.protocol.messages import MemberInfo, StatusReply

Point = tuple[int, int]
Log = Callable[[str], None]
POLL_S = 0.05
"""Seconds between status polls in a window (the PS report their version every 0.1 s)."""


class LiveProfileError(UserError):
    """A live job failed or misbehaved while being profiled; the message names the job, point and log."""


@dataclass(frozen=True)
class Window:
    """How one point is measured: ``warmup_iterations`` iterations at the new size, then a window of
    ``iterations`` iterations or ``seconds`` seconds (exactly one of the two)."""

    iterations: int | None = 30
    seconds: float | None = None
    warmup_iterations: int = 5

    @classmethod
    def of(cls, iterations: int | None, seconds: float | None, warmup_iterations: int = 5) -> Window:
        """From the CLI's options: neither given means the default 30 iterations."""
        if iterations is None and seconds is None:
            iterations = 30
        return cls(iterations, seconds, warmup_iterations)

    def __post_init__(self) -> None:
        if (self.iterations is None) == (self.seconds is None):
            raise UserError("--window-iterations/--window-seconds: give exactly one of the two")
        if self.iterations is not None and self.iterations < 2:
            raise UserError(f"--window-iterations: {self.iterations} must be >= 2")
        if self.seconds is not None and not self.seconds > 0:
            raise UserError(f"--window-seconds: {self.seconds} must be > 0")
        if self.warmup_iterations < 0:
            raise UserError(f"--warmup-iterations: {self.warmup_iterations} must be >= 0")


@dataclass(frozen=True)
class Timeouts:
    """Seconds before a live job is declared stuck (hang protection, never part of a measurement)."""

    start_s: float = 300.0
    """launcher start to the first iteration (MXNet start-up of every initial member)"""
    scale_s: float = 300.0
    """one scale call (new workers start and register; ``--register-timeout`` of the launcher)"""
    point_s: float = 600.0
    """warm-up plus window of one point"""
    heartbeat_s: float = 10.0
    """a member silent this long is dead (generous: a loaded machine delays heartbeats)"""
    stop_s: float = 30.0
    """graceful stop at the end before the process group is killed"""


@dataclass(frozen=True)
class LiveSpec:
    """One job spec to profile: its file, the spec, its catalogue type and the points it measures."""

    path: Path
    spec: JobSpec
    job_type: JobType
    points: tuple[Point, ...]


@dataclass(frozen=True)
class PointResult:
    """One measured point of one job. Rates per second of wall time; ``batches_per_s`` in the type's unit."""

    job: str
    job_type: str
    ps: int
    workers: int
    iterations: int
    """version advance over the window"""
    seconds: float
    """window length: first to last version change seen"""
    iterations_per_s: float
    """least-squares slope of version over time (:func:`iteration_rate`)"""
    samples_per_s: float
    seconds_per_epoch: float
    batches_per_s: float
    coordinator_samples_per_s: float
    """the coordinator's own estimate at the window's end (not used; see the module docstring)"""
    members: tuple[MemberInfo, ...] = field(repr=False)
    """the job's plan members at the window's end (every one checked against the point)"""
    start_version: int = 0

    def record(self) -> dict:
        """The JSON form kept in the profile's ``source.measurements`` (members: role, id, pid and the
        iteration each had reached at the window's end)."""
        doc = {k: v for k, v in asdict(self).items() if k != "members"}
        doc = {k: round(v, 4) if isinstance(v, float) else v for k, v in doc.items()}
        doc["members"] = [{"role": m.role, "id": m.member_id, "pid": m.pid, "version": m.version}
                          for m in self.members]
        return doc


# -- input --------------------------------------------------------------------------------


def load_specs(paths: Sequence[Path], catalogue: JobCatalogue) -> list[tuple[Path, JobSpec, JobType]]:
    """Read every job spec; UserError naming the file and field (unknown file, bad field, unknown type)."""
    out = []
    for path in paths:
        spec = load_jobspec(path)
        if spec.job_type not in catalogue.names:
            raise UserError(f"{path}: job_type: unknown job type {spec.job_type!r}; "
                            f"the config's catalogue has {list(catalogue.names)}")
        out.append((Path(path), spec, catalogue.get(spec.job_type)))
    return out


def in_bounds(spec: JobSpec, jt: JobType, point: Point) -> bool:
    """Whether the spec's bounds and its type's caps allow ``point`` = (PS, workers)."""
    p, w = point
    return (spec.ps_count.min <= p <= min(spec.ps_count.max, jt.max_ps)
            and spec.workers.min <= w <= min(spec.workers.max, jt.max_workers))


def plan_points(specs: Sequence[tuple[Path, JobSpec, JobType]], points: Sequence[Point],
                explicit: bool) -> list[LiveSpec]:
    """Each spec with the points its bounds allow, ordered by (workers, PS) (module docstring).

    With ``explicit`` points (the user's ``--points``), a point no spec can measure is a UserError;
    default points are clipped silently. A spec left with no point is a UserError naming its bounds.
    """
    if explicit:
        for pt in points:
            if not any(in_bounds(spec, jt, pt) for _, spec, jt in specs):
                bounds = "; ".join(f"{spec.name}: ps_count {spec.ps_count.min}-{spec.ps_count.max}, "
                                   f"workers {spec.workers.min}-{spec.workers.max}" for _, spec, _ in specs)
                raise UserError(f"--points: {pt[0]}x{pt[1]} lies outside every job's bounds ({bounds})")
    out = []
    for path, spec, jt in specs:
        mine = sorted((pt for pt in dict.fromkeys(points) if in_bounds(spec, jt, pt)),
                      key=lambda pt: (pt[1], pt[0]))
        if not mine:
            raise UserError(f"{path}: ps_count/workers: bounds (ps {spec.ps_count.min}-{spec.ps_count.max}, "
                            f"workers {spec.workers.min}-{spec.workers.max}) exclude every point")
        out.append(LiveSpec(path, spec, jt, tuple(mine)))
    return out


# -- the job ------------------------------------------------------------------------------


def group_pids(pgid: int) -> list[int]:
    """Pids of the live (not zombie) processes in process group ``pgid``, from /proc."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(stat.parent.name))
    return pids


def _die_with_parent() -> Callable[[], None]:
    """A ``preexec_fn``: the launcher gets SIGTERM when this process dies, even by SIGKILL (Linux
    ``PR_SET_PDEATHSIG``), so a killed profiler leaves no job training forever; the launcher then ends
    its members (and they exit on their own once the coordinator is gone: ``Liveness.orphan_timeout_s``).
    Everything is looked up here, in the parent: the child between fork and exec only makes two calls."""
    import ctypes

    parent = os.getpid()
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: no parent-death signal
        return lambda: None

    def set_signal() -> None:
        prctl(1, int(signal.SIGTERM))  # 1 = PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before prctl
            os.kill(os.getpid(), signal.SIGTERM)

    return set_signal


class LiveJob:
    """One real elastic MXNet job on this machine, in a process group of its own.

    ``with LiveJob(...) as job`` starts the launcher (coordinator, PS and workers
    are all in its group); leaving the block, however it is left, kills the group
    and waits until no process of it is alive. ``log`` gets one line per step.
    """

    def __init__(self, spec: JobSpec, first: Point, workdir: Path, timeouts: Timeouts = Timeouts(),
                 log: Log = lambda _: None) -> None:
        self.spec = spec
        self.workdir = workdir
        self.timeouts = timeouts
        self.log = log
        self.first = first
        self.proc: subprocess.Popen | None = None
        self.job: ElasticJob | None = None
        self.log_path = workdir / "job.log"

    @property
    def pgid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def command(self) -> list[str]:
        spec = self.spec.model_copy(update={"output": None})
        p, w = self.first
        return [sys.executable, "-m", "elastic_mxnet.launch", "--ps", str(p), "--workers", str(w),
                "--max-ps", str(spec.ps_count.max), "--max-workers", str(spec.workers.max),
                "--heartbeat-timeout", repr(self.timeouts.heartbeat_s),
                "--register-timeout", repr(self.timeouts.scale_s),
                "--snapshot-dir", str(self.workdir / "snapshots"),
                "--address-file", str(self.workdir / "coordinator.addr"),
                "--", sys.executable, "-m", "elastic_mxnet.demo_train", *spec.worker_args(iterations=0)]

    def __enter__(self) -> LiveJob:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Start the launcher and connect to its coordinator (does not wait for training)."""
        from elastic_mxnet.job import ElasticJob

        (self.workdir / "snapshots").mkdir(parents=True, exist_ok=True)
        addr = self.workdir / "coordinator.addr"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         preexec_fn=_die_with_parent())
        deadline = time.monotonic() + self.timeouts.start_s
        while not addr.exists():
            self._check_alive("start-up")
            if time.monotonic() > deadline:
                raise LiveProfileError(f"{self.spec.name}: no coordinator address after "
                                       f"{self.timeouts.start_s:g} s (log: {self.log_path})")
            time.sleep(POLL_S)
        self.job = ElasticJob(addr.read_text(), timeout_s=self.timeouts.scale_s)
        self.log(f"{self.spec.name}: launcher pid {self.pgid} (process group {self.pgid}), "
                 f"coordinator {self.job.address}")

    def close(self) -> list[int]:
        """Kill the process group (first: a second Ctrl-C cannot skip it), reap the launcher, and wait
        up to 10 s until no member is alive; the pids still alive after that (normally none)."""
        if self.proc is None:
            return []
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, signal.SIGKILL)
        self.proc.wait()
        if self.job is not None:
            self.job.close()
            self.job = None
        deadline = time.monotonic() + 10.0
        while (left := group_pids(self.pgid)) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        if left:
            self.log(f"{self.spec.name}: processes {left} of group {self.pgid} survived SIGKILL")
        return left

    def stop(self) -> None:
        """Stop the job gracefully (workers end at one iteration) and wait for the launcher to exit;
        the caller's :meth:`close` kills whatever is left."""
        from elastic_mxnet.job import ScaleRefused

        assert self.job is not None and self.proc is not None
        try:
            self.job.stop(timeout_s=self.timeouts.stop_s)
            self.proc.wait(timeout=self.timeouts.stop_s)
        except (ScaleRefused, TimeoutError, subprocess.TimeoutExpired) as exc:
            self.log(f"{self.spec.name}: no graceful stop ({exc}); killing its processes")

    # -- status -----------------------------------------------------------------------

    def _check_alive(self, what: str) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise LiveProfileError(f"{self.spec.name}: the job's launcher exited with code "
                                   f"{self.proc.returncode} during {what} (log: {self.log_path})")

    def status(self, what: str) -> StatusReply:
        """The coordinator's status; LiveProfileError if the launcher died."""
        assert self.job is not None
        self._check_alive(what)
        try:
            return self.job.status(timeout_s=30)
        except TimeoutError:
            self._check_alive(what)
            raise LiveProfileError(f"{self.spec.name}: the coordinator did not answer for 30 s during {what} "
                                   f"(log: {self.log_path})") from None

    def wait(self, predicate: Callable[[StatusReply], bool], what: str, timeout_s: float) -> StatusReply:
        deadline = time.monotonic() + timeout_s
        while True:
            st = self.status(what)
            if predicate(st):
                return st
            if time.monotonic() > deadline:
                raise LiveProfileError(
                    f"{self.spec.name}: timed out after {timeout_s:g} s waiting for {what} "
                    f"(state {st.state}, version {st.version}; log: {self.log_path})")
            time.sleep(POLL_S)

    def wait_training(self) -> StatusReply:
        """Wait until the first plan runs and an iteration completed."""
        st = self.wait(lambda st: st.state == "running" and st.version >= 1, "start-up",
                       self.timeouts.start_s)
        self.log(f"{self.spec.name}: training at {self.first[0]} PS x {self.first[1]} workers")
        return st

    # -- one point --------------------------------------------------------------------

    def scale_to(self, point: Point) -> StatusReply:
        """Hot-scale to ``point`` (the job keeps training) and check the plan's members match it."""
        from elastic_mxnet.job import ScaleRefused

        assert self.job is not None
        p, w = point
        st = self.status(f"scaling to {p}x{w}")
        if plan_size(st) != point:
            t0 = time.monotonic()
            try:
                self.job.scale(ps=p, workers=w, timeout_s=self.timeouts.scale_s + 30)
            except (ScaleRefused, TimeoutError) as exc:
                self._check_alive(f"scaling to {p}x{w}")
                raise LiveProfileError(f"{self.spec.name}: scaling to {p} PS x {w} workers failed: {exc} "
                                       f"(log: {self.log_path})") from None
            self.log(f"{self.spec.name}: scaled to {p} PS x {w} workers in {time.monotonic() - t0:.1f} s")
            st = self.status(f"scaling to {p}x{w}")
        if plan_size(st) != point or st.state != "running":
            raise LiveProfileError(f"{self.spec.name}: after scaling to {p}x{w} the job runs "
                                   f"{plan_size(st)} ({st.state})")
        return st

    def measure(self, point: Point, window: Window) -> tuple[np.ndarray, StatusReply]:
        """Warm up, then record ``(seconds, version)`` at every version change seen in the window.

        Returns shape (K, 2) float64 (K >= 2; seconds on the monotonic clock) and the status at the
        window's end. LiveProfileError if the plan changed during the window (a failure recovered, a
        member lost) or the window saw fewer than two version changes.
        """
        what = f"the window at {point[0]}x{point[1]}"
        deadline = time.monotonic() + self.timeouts.point_s
        st0 = self.status(what)
        plan_id, events = st0.plan_id, len(st0.events)
        warm = st0.version + window.warmup_iterations
        st = self.wait(lambda st: st.version > warm, f"warm-up at {point[0]}x{point[1]}",
                       max(1.0, deadline - time.monotonic()))
        seen = [(time.monotonic(), st.version)]
        while True:
            time.sleep(POLL_S)
            st = self.status(what)
            now = time.monotonic()
            if st.plan_id != plan_id or len(st.events) != events or st.state != "running":
                raise LiveProfileError(f"{self.spec.name}: the job changed during {what} (plan {plan_id} -> "
                                       f"{st.plan_id}, state {st.state}; log: {self.log_path})")
            if st.version > seen[-1][1]:
                seen.append((now, st.version))
            if window.iterations is not None and seen[-1][1] - seen[0][1] >= window.iterations:
                break
            if window.seconds is not None and now - seen[0][0] >= window.seconds:
                break
            if now > deadline:
                raise LiveProfileError(f"{self.spec.name}: {what} did not finish within "
                                       f"{self.timeouts.point_s:g} s (log: {self.log_path})")
        if len(seen) < 2:
            raise LiveProfileError(f"{self.spec.name}: {what} saw fewer than two iterations; "
                                   "lengthen --window-seconds")
        return np.array(seen, dtype=np.float64), st


def plan_size(st: StatusReply) -> Point:
    """(PS, workers) of the job's current plan, from its members."""
    members = [m for m in st.members if m.state == "member"]
    return (sum(m.role == "ps" for m in members), sum(m.role == "worker" for m in members))


def iteration_rate(seen: np.ndarray) -> float:
    """Least-squares slope (iterations/s) of version over time; ``seen`` shape (K, 2), K >= 2."""
    t, v = seen[:, 0] - seen[0, 0], seen[:, 1]
    return float(np.polyfit(t, v, 1)[0])


def type_speed(jt: JobType, spec: JobSpec, iterations_per_s: float) -> float:
    """Batches/s of type ``jt`` with the same seconds per epoch as the job (module docstring)."""
    return jt.batches_per_epoch * iterations_per_s * spec.global_batch / spec.samples


def point_result(ls: LiveSpec, point: Point, seen: np.ndarray, st: StatusReply) -> PointResult:
    rate = iteration_rate(seen)
    if not rate > 0:
        raise LiveProfileError(f"{ls.spec.name}: no progress at {point[0]}x{point[1]} (slope {rate:g})")
    sps = rate * ls.spec.global_batch
    return PointResult(
        job=ls.spec.name, job_type=ls.job_type.name, ps=point[0], workers=point[1],
        iterations=int(seen[-1, 1] - seen[0, 1]), seconds=float(seen[-1, 0] - seen[0, 0]),
        iterations_per_s=rate, samples_per_s=sps, seconds_per_epoch=ls.spec.samples / sps,
        batches_per_s=type_speed(ls.job_type, ls.spec, rate),
        coordinator_samples_per_s=float(st.samples_per_s),
        members=tuple(m for m in st.members if m.state == "member"), start_version=int(seen[0, 1]))


def profile_job(ls: LiveSpec, window: Window, timeouts: Timeouts = Timeouts(),
                log: Log = lambda _: None) -> list[PointResult]:
    """Start ``ls``'s job at its first point, hot-scale it through every point, measure each, stop it.

    The job's working directory (its log) is removed on success and kept, named in the error, on failure.
    """
    workdir = Path(tempfile.mkdtemp(prefix=f"dl2ray-live-{ls.spec.name}-"))
    results = []
    try:
        with LiveJob(ls.spec, ls.points[0], workdir, timeouts, log) as job:
            job.wait_training()
            for point in ls.points:
                job.scale_to(point)
                seen, st = job.measure(point, window)
                results.append(r := point_result(ls, point, seen, st))
                log(f"{ls.spec.name}: {point[0]}x{point[1]}: {r.iterations} iterations in {r.seconds:.2f} s, "
                    f"{r.samples_per_s:.1f} samples/s, {r.seconds_per_epoch:.2f} s/epoch")
            job.stop()
    except LiveProfileError:
        raise  # its message names the log in workdir: keep it
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    shutil.rmtree(workdir, ignore_errors=True)
    return results


def measure_live(specs: Sequence[LiveSpec], window: Window, timeouts: Timeouts = Timeouts(),
                 log: Log = lambda _: None) -> list[PointResult]:
    """Every spec profiled in turn (SIGTERM cleans up as Ctrl-C does)."""
    results: list[PointResult] = []
    with terminate_raises():
        for ls in specs:
            results += profile_job(ls, window, timeouts, log)
    return results


def average_by_type(catalogue: JobCatalogue, results: Sequence[PointResult]) -> dict[str, list[Measurement]]:
    """Per measured type, each point's ``batches_per_s`` averaged over the jobs that measured it."""
    speeds: dict[str, dict[Point, list[float]]] = {}
    for r in results:
        speeds.setdefault(r.job_type, {}).setdefault((r.ps, r.workers), []).append(r.batches_per_s)
    return {t: [Measurement(t, catalogue.get(t).batch_size, p, w, float(np.mean(v)))
                for (p, w), v in pts.items()] for t, pts in speeds.items()}


@contextlib.contextmanager
def terminate_raises() -> Iterator[None]:
    """SIGTERM raises SystemExit(143) here, so cleanup (``finally``) runs as it does for Ctrl-C."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


# -- the profile --------------------------------------------------------------------------


def machine() -> dict:
    """Where the measurement ran: host, cores, load, Python and MXNet versions."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        mxnet = version("mxnet")
    except PackageNotFoundError:
        mxnet = None
    return {"host": platform.node(), "platform": platform.platform(), "cpus": os.cpu_count(),
            "python": platform.python_version(), "mxnet": mxnet,
            "loadavg": [round(x, 2) for x in os.getloadavg()]}


def live_profile(catalogue: JobCatalogue, specs: Sequence[LiveSpec], window: Window, fit: Fit,
                 source: dict, timeouts: Timeouts = Timeouts(),
                 log: Log = lambda _: None) -> tuple[Profile, list[PointResult]]:
    """Measure ``specs`` live and fit the measured types (types of ``catalogue`` no spec measured are
    left out). ``source`` gets ``live``, the specs, the window, the machine and every measurement."""
    before = machine()
    started = datetime.now(UTC).isoformat(timespec="seconds")
    results = measure_live(specs, window, timeouts, log)
    src = {**source, "started": started, "machine": before,
           "loadavg_after": [round(x, 2) for x in os.getloadavg()]}
    return profile_from(catalogue, specs, window, results, fit, src), results


def profile_from(catalogue: JobCatalogue, specs: Sequence[LiveSpec], window: Window,
                 results: Sequence[PointResult], fit: Fit, source: dict) -> Profile:
    """The fitted profile of the measured types only; ``source`` + ``live``, specs, window, measurements."""
    measured = average_by_type(catalogue, results)
    sub = JobCatalogue(types=tuple(t for t in catalogue.types if t.name in measured))
    src = {**source, "live": True,
           "specs": [{"path": str(ls.path), "points": [list(p) for p in ls.points],
                      **ls.spec.model_dump(mode="json")} for ls in specs],
           "window": asdict(window), "measurements": [r.record() for r in results]}
    return fit_profile(sub, measured, fit, src)
