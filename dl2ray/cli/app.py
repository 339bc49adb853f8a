"""The ``dl2ray`` command line: the composition root of every CLI entry point.

User errors (a bad config, trace, file or option) print one message naming
the field or line to stderr and exit with code 2, never a traceback.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import typer

from dl2ray.errors import UserError

if TYPE_CHECKING:
    from dl2ray.cli.commands import Plugins

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="DL2 deep-learning cluster scheduler: simulate, compare, train, serve.",
)


_registered: list[Plugins] = []


def _register() -> Plugins:
    """Attach every command and plugin once (lazily, so importing this module stays cheap)."""
    if not _registered:
        from dl2ray.cli.commands import register_all

        _registered.append(register_all(app))
    return _registered[0]


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point; the plugins' registry reaches every command as ``ctx.obj``."""
    plugins = _register()
    try:
        app(args=argv, standalone_mode=True, obj=plugins)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
