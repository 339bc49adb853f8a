"""``dl2ray profile``: measure the operator's speed profile on the (simulated) cluster and write it.

The composition root of :mod:`dl2ray.knowledge.profile`: config and truth speed model
in, profile file out. On a simulated cluster the measurement reads the
simulator (that is the cluster being measured); the file it writes is all a
deployable scheduler ever sees of speeds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from dl2ray.cli.options import ConfigOpt, JsonOpt
from dl2ray.errors import UserError
from dl2ray.knowledge.profile import DEFAULT_POINTS, Fit, Profile, fit_profile, measure, save_profile


def parse_points(text: str) -> tuple[tuple[int, int], ...]:
    """``"1x1,2x4"`` (PS x workers) → ``((1, 1), (2, 4))``; UserError naming the bad item."""
    out = []
    for item in (s.strip() for s in text.split(",")):
        p, sep, w = item.partition("x")
        if not sep or not p.isdigit() or not w.isdigit() or int(p) < 1 or int(w) < 1:
            raise UserError(f"--points: {item!r} is not PSxWORKERS with counts >= 1 (e.g. 2x4)")
        out.append((int(p), int(w)))
    if len(out) < 2:
        raise UserError("--points: give at least two (PS, workers) points")
    return tuple(dict.fromkeys(out))


def truth_error(profile: Profile, cfg) -> dict[str, float]:
    """Per type: mean |profile − truth| / truth of the job speed over the type's whole (p, w) grid up to
    its caps (the simulator's true type surface; only a simulated cluster can say this)."""
    from dl2ray.world import speed_model

    speed = speed_model(cfg)
    out = {}
    for t, jt in enumerate(cfg.catalogue.types):
        prof = profile.types[jt.name]
        errs = [abs(prof.batches_per_second(p, w) / speed.nominal_batches_per_second(t, p, w) - 1.0)
                for p in range(1, jt.max_ps + 1) for w in range(1, jt.max_workers + 1)]
        out[jt.name] = float(np.mean(errs))
    return out


def profile(
    ctx: typer.Context,
    config: ConfigOpt = None,
    out: Annotated[Path, typer.Option(help="profile file to write (JSON)")] = Path("profile.json"),
    seed: Annotated[int, typer.Option(help="seed of the profiling jobs and their measurement noise")] = 0,
    points: Annotated[str | None, typer.Option(
        help="(PS, workers) points per type, e.g. 1x1,2x4 (default: ten points up to 8x8)")] = None,
    runs: Annotated[int, typer.Option(min=1, help="profiling jobs per type (their points are averaged)")] = 1,
    fit: Annotated[str, typer.Option(help="optimus (Optimus's step-time form) or interpolate")] = "optimus",
    noise: Annotated[float | None, typer.Option(
        help="relative noise of one measurement, ±v (default: the config's speed.variation)")] = None,
    live: Annotated[list[Path] | None, typer.Option(
        help="job spec (YAML) to profile as a real elastic MXNet job on this machine; repeat for more "
             "(clusters/profile_live.py)")] = None,
    window_iterations: Annotated[int | None, typer.Option(
        help="--live: iterations measured per point (default 30)")] = None,
    window_seconds: Annotated[float | None, typer.Option(help="--live: seconds measured per point")] = None,
    warmup_iterations: Annotated[int, typer.Option(
        help="--live: iterations run at a point before its window")] = 5,
    json_out: JsonOpt = False,
) -> None:
    """Measure every job type at a few (PS, workers) points, fit, and write the operator's profile."""
    from dl2ray.config import load_config
    from dl2ray.world import speed_model

    if live:
        plugins = ctx.obj
        hook = getattr(plugins, "live_profile", None)
        if hook is None:
            raise UserError("--live needs the clusters plugin (it drives the elastic MXNet jobs): "
                            + str(getattr(plugins, "failed", {}).get("clusters", "not installed")))
        if noise is not None or runs != 1 or seed != 0:
            raise UserError("--noise/--runs/--seed: options of the simulated measurement, not of --live")
        hook(config, live, out, None if points is None else parse_points(points), fit,
             window_iterations, window_seconds, warmup_iterations, json_out)
        return
    if window_iterations is not None or window_seconds is not None:
        raise UserError("--window-iterations/--window-seconds: only with --live")
    cfg = load_config(config)
    if fit not in ("optimus", "interpolate"):
        raise UserError(f"--fit: {fit!r}; known: optimus, interpolate")
    v = cfg.speed.variation if noise is None else noise
    if not 0 <= v < 1:
        raise UserError(f"--noise: {v} must lie in [0, 1)")
    pts = DEFAULT_POINTS if points is None else parse_points(points)
    measured = measure(speed_model(cfg), seed, cfg.speed.job_deviation, v, pts, runs)
    fit_name: Fit = "optimus" if fit == "optimus" else "interpolate"
    source = {"config": cfg.name, "seed": seed, "runs": runs, "noise": v, "points": [list(p) for p in pts],
              "command": f"dl2ray profile --config {config or 'configs/testbed.yaml'} --seed {seed} "
                         f"--runs {runs} --fit {fit} --out {out}"}
    prof = fit_profile(cfg.catalogue, measured, fit_name, source)
    save_profile(prof, out)
    err = truth_error(prof, cfg)
    if json_out:
        print(json.dumps({"out": str(out), "fit": fit, "points": len(pts), "truth_rel_error": err,
                          "mean_truth_rel_error": float(np.mean(list(err.values())))}))
        return
    table = Table(title=f"profile of {cfg.name}: {len(pts)} points per type, fit {fit}")
    table.add_column("job type")
    table.add_column("points", justify="right")
    table.add_column("error vs truth (simulation only)", justify="right")
    for name, e in err.items():
        table.add_row(name, str(len(prof.types[name].points)), f"{e:.3f}")
    Console().print(table)
    print(f"wrote {out}")
