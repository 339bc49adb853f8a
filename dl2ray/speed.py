"""Training-speed models: the simulator's ground truth and the analytic PS model of placement.

The measurements and what is fitted to them (the surfaces below, Optimus's form) are
:mod:`dl2ray.measurements`.

Units: a job's *speed* is in mini-batches per second summed over its workers
(the measurements' unit); :meth:`SpeedModel.epochs_per_second` divides by the
type's ``batches_per_epoch``.

Ground truth (``speed.model: measured``), for a job of type ``t`` with ``p``
PS and ``w`` workers placed on nodes::

    speed = surface_t(p, w) × placement_factor_t(layout) [× variation × interference]

- ``surface_t`` interpolates the testbed measurements (``dl2ray fit-speed``,
  shipped in ``configs/speed/surfaces.json``;
  :func:`dl2ray.measurements.interpolate_surface`): piecewise-linear over the
  measured (p, w) points, nearest-neighbour outside their hull, then made
  non-decreasing in p (one more PS never slows a job: it can stay idle).
- ``placement_factor`` = t_ref / t_layout from the PS model below
  (:class:`PlacementModel`; ``speed.placement_model``), with ``t_ref`` the
  iteration time when every task has a node of its own (the measurement
  setting); co-location makes it > 1, crowded NICs < 1. The default,
  ``calibrated``, is the analytic model with full-duplex links, fitted to a
  measurement of real elastic MXNet jobs on emulated nodes
  (``tests/bench/bench_colocation.py``, ``configs/speed/placement.json``);
  ``analytic`` is the published model, kept so older results reproduce.
- job deviation (``speed.job_deviation`` = d): every job draws, once for its
  life, a compute factor ``a`` and a communication factor ``b``, each
  U(1 - d, 1 + d) (:func:`job_factors`); its iteration time is the type's
  times ``φ·a + (1 - φ)·b``, with ``φ`` the compute share of the iteration
  in the placement model for the job's layout (:meth:`SpeedModel.compute_fraction`).
  Since ``φ`` changes with ``(p, w)``, a job with slow communication gains more
  from PS than its type does: the best PS:worker ratio differs from job to job.
- variation: × U(1 - v, 1 + v) per job and slot (Fig. 13 of the DL2 paper), a hash of
  (seed, job, slot) rather than a shared stream (:func:`variation_factors`).
- interference (``speed.interference`` = s): × ``1 - s·o`` with ``o`` the
  largest share of any node of the job held by *other* jobs' tasks (dominant
  resource; :func:`colocation_factor`): synchronous training runs at its
  slowest task's pace, and a task on a node full of others is ``s`` slower.

Analytic PS model (``speed.model: analytic`` uses the placement model alone): every worker
pushes and pulls every PS shard once per iteration, ``2·M/p`` MB per
(worker, PS) pair for model size ``M``. On node ``n`` with ``w_n`` workers
and ``p_n`` PS of the job the cross-node bytes are
``2(M/p)·[w_n(p - p_n) + p_n(w - w_n)]`` through a link of ``bw_inter`` MB/s
and the intra-node bytes ``2(M/p)·w_n·p_n`` at ``bw_intra``; the iteration
time is ``compute + max_n max(cross_n / bw_inter, intra_n / bw_intra)`` and
the speed ``w / iteration time``. (The published simulator charged
cross-node time even when all PS were local; here bytes that do not cross
a node boundary cost only intra-node time.) The calibrated form splits those
bytes into the two directions of each phase (push, pull) and lets a node's
link carry both at once; :class:`PlacementModel` states it.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import numpy as np

from dl2ray.measurements import SCHEMA_VERSION, Surface, read_versioned
from dl2ray.workload import JobCatalogue, JobType

# -- analytic placement model ------------------------------------------------------------


Layout = tuple[tuple[int, int], ...]
"""Per node hosting the job: (workers on it, PS on it), sorted."""


def layout_of(worker_nodes: tuple[int, ...], ps_nodes: tuple[int, ...]) -> Layout:
    wc, pc = Counter(worker_nodes), Counter(ps_nodes)
    return tuple(sorted((wc[n], pc[n]) for n in set(wc) | set(pc)))


def spread_layout(workers: int, ps: int) -> Layout:
    """Every task on a node of its own (the reference of the placement factor)."""
    return tuple(sorted([(1, 0)] * workers + [(0, 1)] * ps))


def analytic_comm_time(layout: Layout, model_mb: float, bw_inter_mbps: float, bw_intra_mbps: float) -> float:
    """Seconds of communication per iteration in the analytic model: ``max_n max(cross_n / bw_inter,
    intra_n / bw_intra)`` with the bytes of the module docstring (MB, MB/s); ``inf`` without a worker or
    a PS."""
    w = sum(n[0] for n in layout)
    p = sum(n[1] for n in layout)
    if w == 0 or p == 0:
        return float("inf")
    shard = 2.0 * model_mb / p
    comm = 0.0
    for wn, pn in layout:
        cross = shard * (wn * (p - pn) + pn * (w - wn))
        intra = shard * wn * pn
        comm = max(comm, cross / bw_inter_mbps, intra / bw_intra_mbps)
    return comm


def analytic_iteration_time(jt: JobType, layout: Layout) -> float:
    """Seconds per synchronous iteration (see the module docstring)."""
    return jt.compute_s + analytic_comm_time(layout, jt.model_size_mb, jt.bw_inter_mbps, jt.bw_intra_mbps)


PlacementKind = Literal["analytic", "calibrated"]
PLACEMENT_FILE = "placement.json"
DEFAULT_PLACEMENT_PATH = Path(__file__).resolve().parent.parent / "configs" / "speed" / PLACEMENT_FILE
"""The shipped calibration (``configs/speed/placement.json``): a :class:`SpeedModel` given none uses it."""


@dataclass(frozen=True)
class PlacementModel:
    """How a job's layout sets its communication time: the analytic PS model or its calibrated form.

    Both charge, per synchronous iteration, a *push* phase (every worker sends each PS its shard of the
    gradients) and a *pull* phase (each PS sends every worker its shard of the values) of ``M/p`` MB per
    (worker, PS) pair. On node ``n`` with ``w_n`` workers and ``p_n`` PS of the job, one phase moves

    - ``o_n = (M/p)·w_n·(p − p_n)`` MB out of the node in the push phase (into it in the pull phase),
    - ``i_n = (M/p)·p_n·(w − w_n)`` MB into the node in the push phase (out of it in the pull phase),
    - ``l_n = (M/p)·w_n·p_n`` MB over its loopback in each phase.

    ``analytic`` (the published model): ``comm = max_n max(2(o_n + i_n) / bw_inter, 2 l_n / bw_intra)`` —
    a node's in- and outbound bytes share one rate (half duplex).

    ``calibrated``, fitted to the co-location benchmark (``tests/bench/bench_colocation.py``;
    docs/simulator.md): per phase a node's link needs ``x_n = (max(o_n, i_n) + duplex · min(o_n, i_n)) /
    bw_inter`` (a full-duplex NIC carries the two directions at once: ``duplex`` = 0; ``duplex`` = 1 is
    the half-duplex sum) and its loopback ``y_n = l_n / bw_intra``; the two run side by side, overlapping
    all but ``serial · min(x_n, y_n)``; both phases cost the same, so
    ``comm = max_n 2 (max(x_n, y_n) + serial · min(x_n, y_n))``. ``duplex`` = 1, ``serial`` = 0 is the
    analytic model again. Either way a node's cost depends only on its own ``(w_n, p_n)`` and the job's
    totals (what :func:`dl2ray.evaluation.references.best_layout_time`'s search needs), and the iteration
    time is ``compute_s + comm`` (seconds; sizes in MB, rates in MB/s).
    """

    kind: PlacementKind = "analytic"
    duplex: float = 1.0
    serial: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in ("analytic", "calibrated"):
            raise ValueError(f"unknown placement model {self.kind!r}: analytic or calibrated")
        if not (0.0 <= self.duplex <= 1.0 and 0.0 <= self.serial <= 1.0):
            raise ValueError("placement duplex and serial must lie in [0, 1]")

    def node_comm_time(self, wn: int, pn: int, workers: int, ps: int, model_mb: float,
                       bw_inter_mbps: float, bw_intra_mbps: float) -> float:
        """Seconds node ``n`` (``wn`` workers, ``pn`` PS of a job with ``workers`` and ``ps``) communicates
        per iteration."""
        if self.kind == "analytic":  # the very expression of analytic_comm_time (bit-identical)
            both = 2.0 * model_mb / ps
            return max(both * (wn * (ps - pn) + pn * (workers - wn)) / bw_inter_mbps,
                       both * wn * pn / bw_intra_mbps)
        shard = model_mb / ps
        out, inb, loop = shard * wn * (ps - pn), shard * pn * (workers - wn), shard * wn * pn
        x = (max(out, inb) + self.duplex * min(out, inb)) / bw_inter_mbps
        y = loop / bw_intra_mbps
        return 2.0 * (max(x, y) + self.serial * min(x, y))

    def comm_time(self, layout: Layout, model_mb: float, bw_inter_mbps: float,
                  bw_intra_mbps: float) -> float:
        """Seconds of communication per iteration of ``layout``; ``inf`` without a worker or a PS."""
        if self.kind == "analytic":
            return analytic_comm_time(layout, model_mb, bw_inter_mbps, bw_intra_mbps)
        w = sum(n[0] for n in layout)
        p = sum(n[1] for n in layout)
        if w == 0 or p == 0:
            return float("inf")
        return max(self.node_comm_time(wn, pn, w, p, model_mb, bw_inter_mbps, bw_intra_mbps)
                   for wn, pn in layout)

    def iteration_time(self, jt: JobType, layout: Layout) -> float:
        """Seconds per synchronous iteration of type ``jt`` laid out as ``layout``."""
        return jt.compute_s + self.comm_time(layout, jt.model_size_mb, jt.bw_inter_mbps, jt.bw_intra_mbps)

    def factor(self, jt: JobType, layout: Layout) -> float:
        """The placement factor ``t(spread) / t(layout)`` (1 for the spread layout itself)."""
        w = sum(n[0] for n in layout)
        p = sum(n[1] for n in layout)
        return self.iteration_time(jt, spread_layout(w, p)) / self.iteration_time(jt, layout)


ANALYTIC_PLACEMENT = PlacementModel()
"""The published analytic model (``speed.placement_model: analytic``): older results reproduce with it."""


def save_placement(model: PlacementModel, path: str | Path, source: str, fit: dict) -> Path:
    """Write a calibration (its parameters, the command that fitted it and the fit's report) as JSON."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"schema_version": SCHEMA_VERSION, "kind": model.kind, "duplex": round(model.duplex, 4),
           "serial": round(model.serial, 4), "source": source, "fit": fit}
    out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return out


def load_placement(path: str | Path) -> PlacementModel:
    """Read a calibration written by :func:`save_placement`."""
    doc = read_versioned(Path(path), "placement calibration missing; fit it with "
                                      "tests/bench/bench_colocation.py --fit")
    return PlacementModel(doc["kind"], float(doc["duplex"]), float(doc["serial"]))


@lru_cache(maxsize=8)
def _cached_placement(path: str) -> PlacementModel:
    return load_placement(path)


def placement_model(kind: PlacementKind = "calibrated", path: str | Path | None = None) -> PlacementModel:
    """The placement model a config names: ``analytic``, or ``calibrated`` read from ``path`` (default:
    the shipped ``configs/speed/placement.json``)."""
    if kind == "analytic":
        return ANALYTIC_PLACEMENT
    if kind != "calibrated":
        raise ValueError(f"unknown placement model {kind!r}: analytic or calibrated")
    return _cached_placement(str(Path(path or DEFAULT_PLACEMENT_PATH).resolve()))


def config_placement(cfg) -> PlacementModel:
    """The placement model of an experiment config: ``speed.placement_model`` with its calibration file
    ``speed.placement_calibration`` (relative to the config; unset: the shipped one)."""
    path = cfg.resolve(cfg.speed.placement_calibration) if cfg.speed.placement_calibration else None
    return placement_model(cfg.speed.placement_model, path)


def fit_placement(rows: list[dict]) -> tuple[PlacementModel, dict]:
    """Least-squares fit of ``duplex`` and ``serial`` (each in [0, 1]) to measured placement factors.

    ``rows``: the co-location benchmark's results (keys ``layout``, ``compute_s``, ``model_mb``,
    ``bw_inter_mbps``, ``bw_intra_mbps``, ``measured_factor``); spread rows (factor 1 by definition) are
    left out. The residual of a row is ``log(measured factor / model factor)``. Returns the model and a
    report: rows, and per model the RMS of the residuals and the measured/model ratios' range.
    """
    from scipy.optimize import least_squares

    data = [r for r in rows if r.get("layout_name") != "spread"]
    if not data:
        raise ValueError("no non-spread layouts to fit")

    def ratios(model: PlacementModel) -> np.ndarray:
        out = []
        for r in data:
            lay = tuple(tuple(n) for n in r["layout"])
            w, p = sum(n[0] for n in lay), sum(n[1] for n in lay)
            consts = (r["model_mb"], r["bw_inter_mbps"], r["bw_intra_mbps"])
            f = (r["compute_s"] + model.comm_time(spread_layout(w, p), *consts)) / (
                r["compute_s"] + model.comm_time(lay, *consts))  # type: ignore[arg-type]
            out.append(r["measured_factor"] / f)
        return np.array(out)

    def residuals(theta: np.ndarray) -> np.ndarray:
        return np.log(ratios(PlacementModel("calibrated", float(theta[0]), float(theta[1]))))

    sol = least_squares(residuals, x0=np.array([0.5, 0.0]), bounds=([0.0, 0.0], [1.0, 1.0]))
    fitted = PlacementModel("calibrated", float(sol.x[0]), float(sol.x[1]))

    def summary(model: PlacementModel) -> dict:
        q = ratios(model)
        return {"rms_log_ratio": round(float(np.sqrt(np.mean(np.log(q) ** 2))), 4),
                "min_ratio": round(float(q.min()), 4), "max_ratio": round(float(q.max()), 4)}

    return fitted, {"rows": len(data), "analytic": summary(ANALYTIC_PLACEMENT), "calibrated": summary(fitted)}


def analytic_speed(jt: JobType, layout: Layout) -> float:
    """Job speed in batches/s under the analytic model: ``w / iteration time``."""
    w = sum(n[0] for n in layout)
    t = analytic_iteration_time(jt, layout)
    return 0.0 if not np.isfinite(t) else w / t


# -- the simulator's speed model ---------------------------------------------------------


class SpeedModel:
    """Deterministic speed of a placed job; noise is applied by the caller's RNG.

    ``surfaces`` may be None for ``model="analytic"``. ``placement``: the model of communication time per
    layout behind the placement factor, the compute fraction ``φ`` and the ``analytic`` speed model
    (:class:`PlacementModel`); None reads the shipped calibration (``configs/speed/placement.json``);
    :data:`ANALYTIC_PLACEMENT` is the published model, under which older results reproduce.
    """

    def __init__(
        self,
        catalogue: JobCatalogue,
        surfaces: dict[str, Surface] | None,
        model: str = "measured",
        placement_aware: bool = True,
        placement: PlacementModel | None = None,
        bandwidth_scale: float = 1.0,
        compute_scale: float | Mapping[str, float] = 1.0,
    ) -> None:
        if model == "measured":
            missing = [t for t in catalogue.names if surfaces is None or t not in surfaces]
            if missing:
                raise ValueError(f"no measured speed surface for job types {missing}")
        elif model != "analytic":
            raise ValueError(f"unknown speed model {model!r}")
        self.catalogue = catalogue
        self.surfaces = surfaces or {}
        self.model = model
        self.placement_aware = placement_aware
        self.placement = placement if placement is not None else placement_model("calibrated")
        scales = compute_scales(catalogue, compute_scale)
        changed = bandwidth_scale != 1.0 or any(c != 1.0 for c in scales)
        if not bandwidth_scale > 0 or (changed and model == "measured" and not placement_aware):
            raise ValueError(f"bandwidth_scale {bandwidth_scale}, compute_scale {compute_scale}: must be "
                             "> 0, and 1 when the measured model ignores placement (a changed cluster "
                             "enters through the placement factor)")
        self.bandwidth_scale, self.compute_scales = bandwidth_scale, scales
        # the types as the cluster runs them now: cross-node links × bandwidth_scale, compute × its scale
        self._net_types = catalogue.types if not changed else tuple(
            t.model_copy(update={"bw_inter_mbps": t.bw_inter_mbps * bandwidth_scale,
                                 "compute_s": t.compute_s * c})
            for t, c in zip(catalogue.types, scales, strict=True))
        self._speed = lru_cache(maxsize=200_000)(self._speed_uncached)
        self._phi = lru_cache(maxsize=200_000)(self._phi_uncached)

    def batches_per_second(self, type_index: int, layout: Layout) -> float:
        """Job speed (batches/s) of the deterministic model, cached per layout."""
        return self._speed(type_index, layout)

    def epochs_per_second(self, type_index: int, layout: Layout) -> float:
        jt = self.catalogue.types[type_index]
        return self._speed(type_index, layout) / jt.batches_per_epoch

    def nominal_batches_per_second(self, type_index: int, ps: int, workers: int) -> float:
        """Speed ignoring placement (measured surface, or analytic spread layout)."""
        if ps <= 0 or workers <= 0:
            return 0.0
        jt = self.catalogue.types[type_index]
        if self.model == "analytic":
            net = self._net_types[type_index]
            return workers / self.placement.iteration_time(net, spread_layout(workers, ps))
        return self.surfaces[jt.name](ps, workers)

    def compute_fraction(self, type_index: int, layout: Layout) -> float:
        """``φ``: compute time over the placement model's iteration time for this layout, in (0, 1]."""
        return self._phi(type_index, layout)

    @property
    def network_types(self) -> tuple[JobType, ...]:
        """The catalogue's types as the cluster runs them now: the cross-node bandwidth it has
        (``bw_inter × bandwidth_scale``) and the compute time of its accelerators (``compute_s ×`` the
        type's ``compute_scale``): what the iteration time of a layout is computed with."""
        return self._net_types

    def _phi_uncached(self, type_index: int, layout: Layout) -> float:
        jt = self._net_types[type_index]
        t = self.placement.iteration_time(jt, layout)
        return 1.0 if not np.isfinite(t) else jt.compute_s / t

    def _speed_uncached(self, type_index: int, layout: Layout) -> float:
        w = sum(n[0] for n in layout)
        p = sum(n[1] for n in layout)
        if w == 0 or p == 0:
            return 0.0
        jt, net = self.catalogue.types[type_index], self._net_types[type_index]
        if self.model == "analytic":
            return w / self.placement.iteration_time(net, layout)
        base = self.surfaces[jt.name](p, w)
        if not self.placement_aware:
            return base
        # as base · t_ref / t_layout, in this order: the analytic placement's speeds stay bit-identical.
        # t_ref is the measurement setting (every task on its own node, the cluster as measured), t_layout
        # the job's layout on the cluster as it is now (bandwidth_scale, compute_scale)
        ref = self.placement.iteration_time(jt, spread_layout(w, p))
        return base * ref / self.placement.iteration_time(net, layout)


def compute_scales(catalogue: JobCatalogue, scale: float | Mapping[str, float]) -> tuple[float, ...]:
    """Per catalogue type, its compute-time factor (``speed.compute_scale``): one number for every type, or
    a mapping ``type name → factor`` (types it leaves out: 1). ValueError for a name the catalogue lacks
    or a factor ≤ 0."""
    if isinstance(scale, Mapping):
        unknown = sorted(set(scale) - set(catalogue.names))
        if unknown:
            raise ValueError(f"compute_scale: unknown job types {unknown}; known: "
                             f"{', '.join(catalogue.names)}")
        out = tuple(float(scale.get(name, 1.0)) for name in catalogue.names)
    else:
        out = (float(scale),) * len(catalogue.names)
    if not all(c > 0 for c in out):
        raise ValueError(f"compute_scale {scale}: every factor must be > 0")
    return out


def stream_variation(rng: np.random.Generator, v: float, n: int) -> np.ndarray:
    """Shape (n,): speed multipliers U(1 - v, 1 + v) drawn from ``rng`` (ones, no draw, when v = 0); gang
    mode's noise (:mod:`dl2ray.gang`), kept as it was so its recorded results reproduce."""
    if v <= 0:
        return np.ones(n)
    return rng.uniform(1.0 - v, 1.0 + v, size=n)


_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _splitmix64(x: Any) -> Any:
    """The splitmix64 finaliser, elementwise on uint64 (a counter-based hash: good bits from any input)."""
    with np.errstate(over="ignore"):
        x = (x + np.uint64(0x9E3779B97F4A7C15)) & _MASK64
        x = ((x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _MASK64
        x = ((x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _MASK64
        return x ^ (x >> np.uint64(31))


def variation_factors(seed: int, job_ids: np.ndarray, slot: int, v: float) -> np.ndarray:
    """Shape (n,): the speed multipliers U(1 - v, 1 + v) of jobs ``job_ids`` in ``slot`` (ones when v = 0).

    Each is a hash of ``(seed, job id, slot)`` — not a draw from a shared stream — so a job's noise in a
    slot does not depend on which other jobs exist or on what was decided before: a counterfactual branch
    of the simulator (a learner trying another decision from a snapshot) sees the same noise for every job
    (common random numbers).
    """
    ids = np.asarray(job_ids, dtype=np.int64)
    if v <= 0:
        return np.ones(len(ids))
    with np.errstate(over="ignore"):
        key = _splitmix64(np.uint64(seed & 0xFFFFFFFFFFFF) * np.uint64(0x100000001B3) + np.uint64(slot))
        h = _splitmix64(key ^ (ids.astype(np.uint64) * np.uint64(0xD6E8FEB86659FD93)))
    u = (h >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)  # 53 bits → [0, 1)
    return 1.0 - v + 2.0 * v * u


JOB_FACTOR_STREAM = 0xDE5
"""Third word of a job's factor seed ``[trace seed, job id, JOB_FACTOR_STREAM]``."""


def job_factors(seed: int, job_id: int, deviation: float) -> tuple[float, float]:
    """``(a, b)``: job ``job_id``'s compute and communication time factors, each U(1 - d, 1 + d).

    Drawn from a generator of its own, seeded by the run's seed and the job id, so
    a job's factors do not depend on which other jobs exist or on what a scheduler
    did (counterfactual branches and every scheduler see the same job). ``(1, 1)``
    without a draw when ``deviation`` is 0.
    """
    if deviation <= 0:
        return 1.0, 1.0
    a, b = np.random.default_rng([seed, job_id, JOB_FACTOR_STREAM]).uniform(1 - deviation, 1 + deviation, 2)
    return float(a), float(b)


def deviation_divisor(phi: float, factors: tuple[float, float]) -> float:
    """``φ·a + (1 - φ)·b``: a job's iteration time over its type's (module docstring)."""
    a, b = factors
    return phi * a + (1.0 - phi) * b


def colocation_factor(others_share: float, slowdown: float) -> float:
    """Speed multiplier ``1 - slowdown × others_share`` (``others_share`` in [0, 1])."""
    return 1.0 - slowdown * min(max(others_share, 0.0), 1.0)
