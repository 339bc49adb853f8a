"""The ``dl2ray`` command line: every composition root of the core's CLI (docs/architecture.md).

``run`` (the console script ``dl2ray = "dl2ray.cli:run"``) runs the Typer app of :mod:`.app` (``main``);
:mod:`.commands` holds the top-level commands and registers the groups — ``train``
(:mod:`.train`), ``experiment`` (:mod:`.experiment`), ``trace`` (:mod:`.trace`), ``bench``
(:mod:`.bench`), ``profile`` (:mod:`.profile`), ``experiment robustness`` (:mod:`.robustness`),
``train sched2`` and ``train harmony`` (:mod:`.sched2`, :mod:`.harmony`) — then the plugins'.
The libraries below (``learn``, ``sched2``, ``harmony``, ``traces``, ``studies``) import nothing of it.
"""

from dl2ray.cli.app import main, run

__all__ = ["main", "run"]
