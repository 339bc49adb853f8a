"""``dl2ray profile --live``: the composition root of the live profile (:mod:`clusters.profile_live`).

Config, specs and options in; the profile file and its report (a table, or JSON) out. The measuring itself
lives in :mod:`clusters.profile_live`, which never prints.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from clusters.profile_live import Point, PointResult, Window, live_profile, load_specs, plan_points
from dl2ray.errors import UserError
from dl2ray.knowledge.profile import Fit, Profile, save_profile


def run_cli(config: Path | None, spec_paths: Sequence[Path], out: Path, points: Sequence[Point] | None,
            fit: str, window: Window, json_out: bool) -> None:
    """``dl2ray profile --live``: the composition root (config, specs, options in; file and report out).

    ``points``: the user's ``--points`` (None: the default points, clipped to every spec silently).
    Every input is checked before any process starts.
    """
    import json

    from dl2ray.config import load_config
    from dl2ray.knowledge.profile import DEFAULT_POINTS

    cfg = load_config(config)
    if fit not in ("optimus", "interpolate"):
        raise UserError(f"--fit: {fit!r}; known: optimus, interpolate")
    pts = DEFAULT_POINTS if points is None else tuple(points)
    specs = plan_points(load_specs(spec_paths, cfg.catalogue), pts, explicit=points is not None)
    fit_name: Fit = "optimus" if fit == "optimus" else "interpolate"
    win = (f"--window-iterations {window.iterations}" if window.iterations is not None
           else f"--window-seconds {window.seconds:g}")
    command = ("dl2ray profile --config " + str(config or "configs/testbed.yaml")
               + "".join(f" --live {p}" for p in spec_paths)
               + (" --points " + ",".join(f"{p}x{w}" for p, w in points) if points else "")
               + f" {win} --warmup-iterations {window.warmup_iterations} --fit {fit} --out {out}")
    source = {"config": cfg.name, "command": command}

    def log(msg: str) -> None:
        print(f"live profile: {msg}", file=sys.stderr, flush=True)

    prof, results = live_profile(cfg.catalogue, specs, window, fit_name, source, log=log)
    save_profile(prof, out)
    missing = [n for n in cfg.catalogue.names if n not in prof.types]
    if json_out:
        print(json.dumps({"out": str(out), "fit": fit, "live": True, "measured_types": sorted(prof.types),
                          "missing_types": missing, "measurements": [r.record() for r in results]}))
        return
    _print_report(cfg.name, prof, results, missing, out)


def _print_report(name: str, prof: Profile, results: list[PointResult], missing: list[str],
                  out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"live profile for {name}: fit {prof.fit}")
    for col in ("job", "job type", "PS x workers", "iterations", "window s", "samples/s", "s/epoch",
                "type batches/s"):
        table.add_column(col, justify="left" if col.startswith("job") else "right")
    for r in results:
        table.add_row(r.job, r.job_type, f"{r.ps}x{r.workers}", str(r.iterations), f"{r.seconds:.2f}",
                      f"{r.samples_per_s:.1f}", f"{r.seconds_per_epoch:.2f}", f"{r.batches_per_s:.2f}")
    Console().print(table)
    print(f"measured job types: {', '.join(sorted(prof.types))}")
    if missing:
        print("not measured (absent from the profile; a config that needs them refuses it): "
              + ", ".join(missing))
    print(f"wrote {out}")
