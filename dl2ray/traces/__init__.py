"""Traces: seeded generators, real-trace importers, dl2ray's Parquet format.

- :mod:`dl2ray.traces.generate`: synthetic traces from ``cfg.workload``.
- :mod:`dl2ray.traces.importers`: Philly, Alibaba GPU 2023 and Helios CSVs.
- :mod:`dl2ray.traces.parquet`: the on-disk format every command reads.
- :mod:`dl2ray.traces.describe`: summary statistics of a trace.
"""

from __future__ import annotations

from dl2ray.errors import UserError


class TraceError(UserError, ValueError):
    """A trace file or trace option is malformed; the message names the file, line/row and field."""
