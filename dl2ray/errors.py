"""The one exception type the CLI turns into ``exit 2`` with a clean message."""

from __future__ import annotations


class UserError(Exception):
    """Bad user input (config, trace, file, option); the message names the field or line."""


class MissingInputError(UserError, FileNotFoundError):
    """A file the user's config or options point to does not exist (still a ``FileNotFoundError``)."""
