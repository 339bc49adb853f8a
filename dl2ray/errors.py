"""The one exception type the CLI turns into ``exit 2`` with a clean message."""

from __future__ import annotations


class UserError(Exception):
    """Bad user input (config, trace, file, option); the message names the field or line."""


class MissingInputError(UserError, FileNotFoundError):
    """A file the user's config or options point to does not exist (still a ``FileNotFoundError``)."""


class Refused(RuntimeError):
    """A remote decider refused to decide this view because it is overloaded (HTTP 503, gRPC
    RESOURCE_EXHAUSTED): nothing is wrong with the view; decide it locally (a fallback heuristic) and ask
    again after ``retry_after_s`` seconds."""

    def __init__(self, message: str, retry_after_s: float = 0.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
