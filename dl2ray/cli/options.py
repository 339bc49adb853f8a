"""Options every ``dl2ray`` command spells the same way (typer annotations), below the command modules that
use them (:mod:`dl2ray.cli.commands`, :mod:`dl2ray.cli.profile`, ...)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

ConfigOpt = Annotated[
    Path | None, typer.Option("--config", "-c", help="experiment YAML (default: configs/testbed.yaml)")
]
TraceOpt = Annotated[
    Path | None, typer.Option("--trace", help="dl2ray Parquet trace (default: generate from config)")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON object on stdout, nothing else")]
PlacementOpt = Annotated[
    str | None, typer.Option(
        "--placement", help="where every scheduler places its tasks: own (each its paper's: optimus for "
        "Optimus, tetris for Tetris, load_balancing for FIFO/SRTF/DRF, the validated one for the planner and "
        "a DL2 checkpoint) or one of load_balancing, packing, optimus, tetris for all (default: the config's "
        "cluster.placement, own in the shipped configs)")
]
