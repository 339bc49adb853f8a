"""``python -m dl2ray`` is the ``dl2ray`` command."""

from dl2ray.cli.app import run

run()
