"""The ``dl2ray`` command line: the composition root of every CLI entry point.

User errors (a bad config, trace, file or option) print one message naming
the field or line to stderr and exit with code 2, never a traceback.
"""

from __future__ import annotations

import sys

import typer

from dl2ray.errors import UserError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="DL2 deep-learning cluster scheduler: simulate, compare, train, serve.",
)


_registered: list[bool] = []


def _register() -> None:
    """Attach every command once (lazily, so importing this module stays cheap)."""
    if _registered:
        return
    from dl2ray.commands import register_all

    register_all(app)
    _registered.append(True)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    _register()
    try:
        app(args=argv, standalone_mode=True)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
