"""What every benchmark script ends with: its one JSON object on stdout, a user error as one line."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

from dl2ray.errors import UserError


def print_json(parser: argparse.ArgumentParser, build: Callable[[], dict]) -> int:
    """Print ``build()`` as one JSON object and return 0; a :class:`UserError` it raises becomes the parser's
    one-line error (exit 2, no traceback)."""
    try:
        doc = build()
    except UserError as exc:
        parser.error(str(exc))
    print(json.dumps(doc))
    return 0
