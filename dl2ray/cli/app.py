"""The ``dl2ray`` command line: the composition root of every CLI entry point.

User errors (a bad config, trace, file or option) print one message naming
the field or line to stderr and exit with code 2, never a traceback.
"""

from __future__ import annotations

import os
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


BLAS_THREADS = "OPENBLAS_NUM_THREADS"
"""numpy's BLAS threads in the ``dl2ray`` command and every process it starts (1 unless the user set it)."""


def run() -> None:
    """The ``dl2ray`` command (the console script and ``python -m dl2ray``): :func:`main` with numpy's
    BLAS on one thread, in this process (threadpoolctl: numpy is loaded by now) and in every process it
    starts (the environment: a process pool's workers, Ray's workers load numpy after it is set).

    Every matrix the schedulers and learners multiply in numpy is small (a policy's layers over tens of
    jobs): a second BLAS thread only spins against the other workers' cores. Beside one busy process,
    ``NumpyShapePolicy.logits`` took ~10× longer with two BLAS threads than with one
    (``tests/bench/bench_blas_threads.py``, docs/BENCHMARKS.md). ``OPENBLAS_NUM_THREADS`` set by the user
    is kept."""
    from threadpoolctl import threadpool_limits

    value = os.environ.setdefault(BLAS_THREADS, "1")
    if not value.isdigit() or int(value) < 1:
        print(f"error: {BLAS_THREADS}={value!r}: a number of threads >= 1", file=sys.stderr)
        raise SystemExit(2)
    with threadpool_limits(limits=int(value), user_api="blas"):
        main()


def main(argv: list[str] | None = None) -> None:
    """The command line in this process (tests call it with ``argv``); the plugins' registry reaches every
    command as ``ctx.obj``. The console script is :func:`run`."""
    plugins = _register()
    try:
        app(args=argv, standalone_mode=True, obj=plugins)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
