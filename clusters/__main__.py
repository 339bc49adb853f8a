"""``python -m clusters``: the ``dl2ray-a3c`` command line."""

from clusters.cli import main

main()
