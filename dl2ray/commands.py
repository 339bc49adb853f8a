"""Wires every command group into the ``dl2ray`` Typer app (called once by :mod:`dl2ray.cli`)."""

from __future__ import annotations

import typer


def register_all(app: typer.Typer) -> None:
    from dl2ray.traces.cli import app as trace_app

    app.add_typer(trace_app, name="trace", help="Import, generate and describe traces.")
