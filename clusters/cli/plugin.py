"""The ``clusters`` plugin of the ``dl2ray`` CLI: everything ``clusters`` adds to the command line.

The core may not import ``clusters`` (import-linter: the core sits below the
Ray layer), so this package adds its commands through the extension point the
core offers: the ``dl2ray.plugins`` entry point in ``pyproject.toml`` names
:func:`register`, which the core CLI calls with its
:class:`~dl2ray.cli.commands.Plugins` registry at start-up. Each command module of
:mod:`clusters.cli` is a composition root (only there are Ray, the config and
the output files wired together). Importing this module imports neither Ray
nor torch (every ``dl2ray`` command loads it); Ray is started by the commands,
never at import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from clusters.cli.a3c import register_a3c
from clusters.cli.federation import register_federation
from clusters.cli.k8s import register_k8s
from clusters.cli.live import register_live

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from clusters.profile_live import Point
    from dl2ray.cli.commands import Plugins


def register(plugins: Plugins) -> None:
    """The ``dl2ray.plugins`` entry point: ``train rl --agents N``, ``bench a3c``, the live cluster's
    commands (``submit``, ``jobs``, ``cluster``, ``bench live``, ``demo --live``), ``profile --live``,
    ``k8s`` and ``federation``."""
    register_a3c(plugins)
    register_live(plugins)
    register_k8s(plugins)
    register_federation(plugins)
    plugins.live_profile = live_profile


def live_profile(config: Path | None, specs: Sequence[Path], out: Path, points: Sequence[Point] | None,
                 fit: str, window_iterations: int | None, window_seconds: float | None,
                 warmup_iterations: int, json_out: bool) -> None:
    """``dl2ray profile --live``: every spec timed as a real elastic MXNet job on this machine
    (:mod:`clusters.cli.profile_live`, measured by :mod:`clusters.profile_live`); the window from the CLI's
    three options."""
    from clusters.cli.profile_live import run_cli
    from clusters.profile_live import Window

    window = Window.of(window_iterations, window_seconds, warmup_iterations)
    run_cli(config, specs, out, points, fit, window, json_out)
