"""Testbed measurements and the speed functions fitted to them: the interpolated surfaces the simulator
takes as its ground truth (:class:`Surface`, :func:`fit_surfaces`; ``dl2ray fit-speed``, shipped in
``configs/speed/surfaces.json``) and Optimus's parametric form (:func:`fit_optimus_speed`).

Units: a *speed* is mini-batches per second summed over the job's workers (the measurements' unit).
How a speed becomes a placed job's speed in the simulator is :mod:`dl2ray.speed`. The JSON files of both
modules (surfaces, Optimus's fit, the placement calibration) carry ``schema_version``
(:data:`SCHEMA_VERSION`) and are read by one reader, :func:`read_versioned`.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dl2ray.errors import MissingInputError

SURFACES_FILE = "surfaces.json"
OPTIMUS_FILE = "optimus_fit.json"
SCHEMA_VERSION = 1


# -- measurements ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Measurement:
    """One testbed run: job speed (batches/s, summed over workers) at (ps, workers)."""

    model: str
    batch_size: int
    ps: int
    workers: int
    speed: float


def parse_measurements(path: str | Path) -> list[Measurement]:
    """Read the measurement file (one Python tuple literal per line).

    All-zero records (failed runs) are dropped as missing. A malformed line
    raises ``ValueError`` naming the line number.
    """
    out: list[Measurement] = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                rec = ast.literal_eval(line.strip())
                model, _mode, batch, ps, workers, speeds = rec[:6]
                speed = float(sum(speeds))
                if not (isinstance(model, str) and int(ps) >= 1 and int(workers) >= 1):
                    raise ValueError("bad model/ps/workers")
                if len(speeds) != int(workers):
                    raise ValueError(f"{len(speeds)} worker speeds for {workers} workers")
            except (ValueError, SyntaxError, TypeError) as exc:
                raise ValueError(f"{path}:{lineno}: malformed measurement: {exc}") from None
            if speed > 0:
                out.append(Measurement(model, int(batch), int(ps), int(workers), speed))
    if not out:
        raise ValueError(f"{path}: no usable measurements")
    return out


# -- interpolated surfaces -------------------------------------------------------------


@dataclass(frozen=True)
class Surface:
    """Job speed of one model on the grid ps = 1..P, workers = 1..W.

    ``speed[p-1, w-1]`` in batches/s; requests beyond the grid are clamped.
    """

    model: str
    speed: np.ndarray  # shape (P, W)
    points: int  # measured points behind it

    def __call__(self, ps: int, workers: int) -> float:
        if ps <= 0 or workers <= 0:
            return 0.0
        p = min(ps, self.speed.shape[0]) - 1
        w = min(workers, self.speed.shape[1]) - 1
        return float(self.speed[p, w])


def interpolate_surface(model: str, points: list[Measurement]) -> Surface:
    """Piecewise-linear surface through the measured points, monotone in PS."""
    from scipy.interpolate import griddata

    xy = np.array([(m.ps, m.workers) for m in points], dtype=np.float64)
    z = np.array([m.speed for m in points])
    # Average repeated runs of the same (p, w).
    keys, inverse = np.unique(xy, axis=0, return_inverse=True)
    zs = np.bincount(inverse.ravel(), weights=z) / np.bincount(inverse.ravel())
    max_p, max_w = int(keys[:, 0].max()), int(keys[:, 1].max())
    gp, gw = np.meshgrid(np.arange(1, max_p + 1), np.arange(1, max_w + 1), indexing="ij")
    grid = np.stack([gp.ravel(), gw.ravel()], axis=1).astype(np.float64)
    if len(keys) >= 3 and np.linalg.matrix_rank(keys - keys.mean(0)) == 2:
        lin = griddata(keys, zs, grid, method="linear")
    else:
        lin = np.full(len(grid), np.nan)
    near = griddata(keys, zs, grid, method="nearest")
    surface = np.where(np.isnan(lin), near, lin).reshape(max_p, max_w)
    surface = np.maximum.accumulate(surface, axis=0)
    return Surface(model, surface, len(points))


def fit_surfaces(measurements: list[Measurement]) -> dict[str, Surface]:
    by_model: dict[str, list[Measurement]] = {}
    for m in measurements:
        by_model.setdefault(m.model, []).append(m)
    return {name: interpolate_surface(name, pts) for name, pts in by_model.items()}


def save_surfaces(surfaces: dict[str, Surface], out_dir: str | Path, source: str) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "schema_version": SCHEMA_VERSION,
        "unit": "mini-batches per second, summed over workers",
        "grid": "speed[ps-1][workers-1]",
        "source": source,
        "models": {
            name: {"points": s.points, "speed": np.round(s.speed, 4).tolist()}
            for name, s in sorted(surfaces.items())
        },
    }
    path = out / SURFACES_FILE
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return path


def load_surfaces(directory: str | Path) -> dict[str, Surface]:
    """Read ``surfaces.json`` written by :func:`save_surfaces`."""
    path = Path(directory) / SURFACES_FILE
    doc = read_versioned(path, f"speed surfaces missing; run `dl2ray fit-speed FILE --out {directory}`")
    return {
        name: Surface(name, np.asarray(m["speed"], dtype=np.float64), int(m["points"]))
        for name, m in doc["models"].items()
    }


# -- Optimus's parametric form -----------------------------------------------------------


def optimus_features(ps: np.ndarray, workers: np.ndarray, batch: np.ndarray) -> np.ndarray:
    """Design matrix of Optimus's step time ``θ0·M/w + θ1 + θ2·w/p + θ3·w + θ4·p``.

    ``M`` is the global batch (``batch × w`` samples). Shape (n, 5).
    """
    w = workers.astype(np.float64)
    p = ps.astype(np.float64)
    m = batch.astype(np.float64) * w
    return np.stack([m / w, np.ones_like(w), w / p, w, p], axis=1)


def fit_optimus_speed(
    ps: np.ndarray, workers: np.ndarray, batch: np.ndarray, speed: np.ndarray
) -> np.ndarray:
    """Non-negative θ (shape (5,)) with step time ``w / speed`` ≈ features · θ."""
    from scipy.optimize import nnls

    a = optimus_features(ps, workers, batch)
    theta, _ = nnls(a, workers / speed)
    return theta


def optimus_speed(theta: np.ndarray, ps, workers, batch) -> np.ndarray:
    """Job speed in batches/s: ``w / step_time`` (0 where the step time is 0)."""
    ps, workers, batch = (
        np.atleast_1d(np.asarray(x, dtype=np.float64)) for x in (ps, workers, batch)
    )
    step = optimus_features(ps, workers, batch) @ theta
    return np.where(step > 0, workers / np.maximum(step, 1e-12), 0.0)


def fit_optimus_all(measurements: list[Measurement]) -> dict[str, dict]:
    """Per model: θ and the mean relative error over its measured points."""
    out: dict[str, dict] = {}
    for name in sorted({m.model for m in measurements}):
        pts = [m for m in measurements if m.model == name]
        ps = np.array([m.ps for m in pts])
        w = np.array([m.workers for m in pts])
        b = np.array([m.batch_size for m in pts])
        s = np.array([m.speed for m in pts])
        theta = fit_optimus_speed(ps, w, b, s)
        pred = optimus_speed(theta, ps, w, b)
        out[name] = {
            "theta": theta.tolist(),
            "mean_rel_error": float(np.mean(np.abs(pred - s) / s)),
            "points": len(pts),
        }
    return out


def surface_rel_error(surface: Surface, points: list[Measurement]) -> float:
    """Mean relative error of the surface at the measured points."""
    errs = [abs(surface(m.ps, m.workers) - m.speed) / m.speed for m in points]
    return float(np.mean(errs))


# -- the versioned files -------------------------------------------------------------------


def read_versioned(path: Path, missing: str) -> dict:
    """The JSON document at ``path`` (a file this module or :mod:`dl2ray.speed` wrote, with
    ``schema_version``); MissingInputError ``"{path}: {missing}"`` when there is none, ValueError for
    another version."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MissingInputError(f"{path}: {missing}") from None
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(f"{path}: schema_version must be {SCHEMA_VERSION}")
    return doc
