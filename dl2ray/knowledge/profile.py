"""The operator's speed profile: every job type measured at a few ``(PS, workers)`` points, with error.

What a deployable scheduler may know of job speeds is what an operator can
measure on its own cluster, not the simulator's truth. ``dl2ray profile``
runs one *profiling job* of every type at each of a few ``(p, w)`` points
(:data:`DEFAULT_POINTS`, ten as in Optimus's "less than 10% error using 10 data
points"), every task on a node of its own, measures its speed, and fits a
surface over the type's whole ``(p, w)`` range. On the simulated cluster a
measurement of type ``t`` at ``(p, w)`` in run ``r`` is::

    measured = surface_t(p, w) / (φ·a + (1 - φ)·b) × U(1 - v, 1 + v)

with ``(a, b)`` the profiling job's own compute and communication factors
(drawn like any job's, ``speed.job_deviation``: the profile is of *a* job of the
type, not of the type's mean), ``φ`` the compute share of its iteration and
``v`` = ``speed.variation`` (the noise of one measurement). ``runs`` > 1
profiles that many jobs per type and averages their points. On a live
cluster the same file comes from timing real elastic MXNet jobs
(:mod:`clusters.profile_live`).

Fits (``fit``), per type, over its measured points:

- ``optimus``: Optimus's step-time form ``w / f(p, w) = θ0·B + θ1 + θ2·w/p + θ3·w + θ4·p``
  by non-negative least squares (:func:`dl2ray.measurements.fit_optimus_speed`);
- ``interpolate``: the piecewise-linear surface through the points, monotone in
  PS, nearest point outside their hull (:func:`dl2ray.measurements.interpolate_surface`).

The file (JSON, :func:`save_profile` / :func:`load_profile`) keeps the raw
points, the fit and the fitted grid ``speed[p-1][w-1]`` (batches/s) up to the
type's caps; :meth:`Profile.seconds_per_epoch` is what the planner plans with
and :meth:`Profile.surfaces` what the operator's simulator (the DL2 policy's
training world, :func:`dl2ray.world.build_simulator` with
``world="operator"``) runs on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from dl2ray.errors import MissingInputError, UserError
from dl2ray.measurements import Measurement, Surface, fit_optimus_speed, interpolate_surface, optimus_speed
from dl2ray.speed import SpeedModel, deviation_divisor, spread_layout
from dl2ray.workload import JobCatalogue

SCHEMA_VERSION = 1
Fit = Literal["optimus", "interpolate"]
DEFAULT_POINTS: tuple[tuple[int, int], ...] = (
    (1, 1), (1, 2), (2, 1), (2, 2), (2, 4), (4, 2), (4, 4), (4, 8), (8, 4), (8, 8))
"""``(PS, workers)`` measured per type by default."""
PROFILE_STREAM = 0x9F0F
"""Third word of a profiling job's seed ``[seed, type index, PROFILE_STREAM, run]``."""


class ProfileError(UserError, ValueError):
    """A profile file is missing, malformed or does not cover the config's job types."""


@dataclass(frozen=True)
class TypeProfile:
    """One type's measured points ``(ps, workers, batches/s)`` and its fitted grid ``speed`` (P, W)."""

    name: str
    points: tuple[tuple[int, int, float], ...]
    speed: np.ndarray
    theta: tuple[float, ...] | None = None

    def batches_per_second(self, ps: int, workers: int) -> float:
        """Fitted speed (batches/s summed over workers); beyond the grid the nearest edge; 0 without tasks."""
        if ps <= 0 or workers <= 0:
            return 0.0
        return float(self.speed[min(ps, self.speed.shape[0]) - 1, min(workers, self.speed.shape[1]) - 1])


@dataclass(frozen=True)
class Profile:
    """Per job type name: its :class:`TypeProfile`; ``fit`` and ``source`` say how it was made."""

    types: dict[str, TypeProfile]
    fit: str
    source: dict

    def covers(self, catalogue: JobCatalogue, what: str = "profile") -> None:
        """ProfileError naming the types of ``catalogue`` this profile lacks."""
        missing = [n for n in catalogue.names if n not in self.types]
        if missing:
            raise ProfileError(f"{what}: no measurements of job types {missing}; "
                               "run `dl2ray profile` for a config that has them")

    def seconds_per_epoch(self, catalogue: JobCatalogue):
        """``cost(type_index, ps, workers) -> s/epoch`` (inf when the job cannot train), cached."""
        self.covers(catalogue)
        rows = [(self.types[t.name], t.batches_per_epoch) for t in catalogue.types]
        cache: dict[tuple[int, int, int], float] = {}

        def cost(t: int, p: int, w: int) -> float:
            key = (t, p, w)
            v = cache.get(key)
            if v is None:
                prof, per_epoch = rows[t]
                bps = prof.batches_per_second(p, w)
                v = cache[key] = per_epoch / bps if bps > 0 else float("inf")
            return v

        return cost

    def surfaces(self) -> dict[str, Surface]:
        """The fitted grids as :class:`~dl2ray.measurements.Surface`\\ s (for a :class:`SpeedModel`)."""
        return {n: Surface(n, p.speed, len(p.points)) for n, p in self.types.items()}


# -- measuring ----------------------------------------------------------------------------


def measure(speed: SpeedModel, seed: int, deviation: float, noise: float,
            points: tuple[tuple[int, int], ...] = DEFAULT_POINTS,
            runs: int = 1) -> dict[str, list[Measurement]]:
    """Simulated measurements (module docstring) of every catalogue type: name → points (runs averaged).

    Points beyond a type's caps are skipped. Every draw comes from the
    generator of ``(seed, type, run)``.
    """
    if runs < 1:
        raise ValueError("runs must be >= 1")
    out: dict[str, list[Measurement]] = {}
    for t, jt in enumerate(speed.catalogue.types):
        sums: dict[tuple[int, int], float] = {}
        for r in range(runs):
            rng = np.random.default_rng([seed, t, PROFILE_STREAM, r])
            a, b = rng.uniform(1 - deviation, 1 + deviation, 2) if deviation > 0 else (1.0, 1.0)
            for p, w in points:
                if p > jt.max_ps or w > jt.max_workers:
                    continue
                layout = spread_layout(w, p)
                true = speed.batches_per_second(t, layout) / deviation_divisor(
                    speed.compute_fraction(t, layout), (float(a), float(b)))
                seen = true * (rng.uniform(1 - noise, 1 + noise) if noise > 0 else 1.0)
                sums[(p, w)] = sums.get((p, w), 0.0) + seen / runs
        out[jt.name] = [Measurement(jt.name, jt.batch_size, p, w, v) for (p, w), v in sums.items()]
    return out


def fit_profile(catalogue: JobCatalogue, measured: dict[str, list[Measurement]], fit: Fit,
                source: dict) -> Profile:
    """Fit every type's points into a grid up to its caps (module docstring)."""
    types = {}
    for jt in catalogue.types:
        pts = measured.get(jt.name)
        if not pts:
            raise ProfileError(f"profile: no measurements of job type {jt.name!r}")
        theta = None
        if fit == "optimus":
            ps = np.array([m.ps for m in pts])
            w = np.array([m.workers for m in pts])
            th = fit_optimus_speed(ps, w, np.full(len(pts), jt.batch_size), np.array([m.speed for m in pts]))
            gp, gw = np.meshgrid(np.arange(1, jt.max_ps + 1), np.arange(1, jt.max_workers + 1), indexing="ij")
            grid = optimus_speed(th, gp.ravel(), gw.ravel(), np.full(gp.size, jt.batch_size))
            speed = grid.reshape(gp.shape)
            theta = tuple(float(x) for x in th)
        elif fit == "interpolate":
            surf = interpolate_surface(jt.name, pts)
            gp, gw = np.meshgrid(np.arange(1, jt.max_ps + 1), np.arange(1, jt.max_workers + 1), indexing="ij")
            speed = np.vectorize(surf)(gp, gw).astype(np.float64)
        else:
            raise ProfileError(f"--fit: unknown fit {fit!r}; known: optimus, interpolate")
        types[jt.name] = TypeProfile(jt.name, tuple((m.ps, m.workers, float(m.speed)) for m in pts),
                                     np.asarray(speed, dtype=np.float64), theta)
    return Profile(types, fit, source)


# -- files --------------------------------------------------------------------------------


def save_profile(profile: Profile, path: str | Path) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "schema_version": SCHEMA_VERSION,
        "unit": "mini-batches per second, summed over workers",
        "grid": "speed[ps-1][workers-1]",
        "fit": profile.fit,
        "source": profile.source,
        "types": {
            n: {"points": [[p, w, round(v, 4)] for p, w, v in tp.points],
                "theta": None if tp.theta is None else [float(x) for x in tp.theta],
                "speed": np.round(tp.speed, 4).tolist()}
            for n, tp in sorted(profile.types.items())
        },
    }
    out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return out


def load_profile(path: str | Path) -> Profile:
    """Read a profile file; ProfileError naming the file and field for any problem."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MissingInputError(
            f"{path}: profile missing; run `dl2ray profile --config CONFIG --out {path}`") from None
    except (OSError, ValueError) as exc:
        raise ProfileError(f"{path}: not a readable JSON profile: {exc}") from None
    if not isinstance(doc, dict) or doc.get("schema_version") != SCHEMA_VERSION:
        raise ProfileError(f"{path}: schema_version: must be {SCHEMA_VERSION}")
    types = {}
    for name, t in (doc.get("types") or {}).items():
        where = f"{path}: types.{name}"
        try:
            speed = np.asarray(t["speed"], dtype=np.float64)
            points = tuple((int(p), int(w), float(v)) for p, w, v in t["points"])
            theta = None if t.get("theta") is None else tuple(float(x) for x in t["theta"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ProfileError(f"{where}: malformed ({exc!r})") from None
        if speed.ndim != 2 or speed.size == 0 or not np.all(np.isfinite(speed)) or np.any(speed < 0):
            raise ProfileError(f"{where}.speed: must be a non-empty grid of finite speeds >= 0")
        types[name] = TypeProfile(name, points, speed, theta)
    if not types:
        raise ProfileError(f"{path}: types: no job types")
    return Profile(types, str(doc.get("fit", "?")), dict(doc.get("source") or {}))


def config_profile(cfg) -> Profile:
    """The profile a config names (``profile:``), checked against its catalogue."""
    if cfg.profile_path is None:
        raise ProfileError(f"{cfg.name}: profile: the config names no operator profile; run `dl2ray profile "
                           "--config CONFIG --out FILE` and set `profile: FILE`")
    prof = load_profile(cfg.profile_path)
    prof.covers(cfg.catalogue, str(cfg.profile_path))
    return prof
