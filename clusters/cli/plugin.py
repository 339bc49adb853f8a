"""The ``clusters`` plugin of the ``dl2ray`` CLI: ``train rl --agents N`` (N ≥ 2), ``bench a3c`` and
the live cluster's commands (``submit``, ``jobs``, ``cluster``, ``bench live``, ``demo --live``;
:mod:`clusters.cli.live`).

The core may not import ``clusters`` (import-linter: the core sits below the
Ray layer), so this package adds its commands through the extension point the
core offers: the ``dl2ray.plugins`` entry point in ``pyproject.toml`` names
:func:`register`, which the core CLI calls with its
:class:`~dl2ray.commands.Plugins` registry at start-up.

This module is the A3C composition root: only here are Ray, the config and the
output files wired together. Importing it imports neither Ray nor torch (every
``dl2ray`` command loads it); Ray is started by the commands, never at import.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from dl2ray.config import load_config
from dl2ray.errors import UserError
from dl2ray.report import emit

if TYPE_CHECKING:
    from collections.abc import Callable

    from dl2ray.commands import Plugins
    from dl2ray.config import ExperimentConfig
    from dl2ray.learn.rl import RLOptions, RLResult, ValidationRow


def register(plugins: Plugins) -> None:
    """The ``dl2ray.plugins`` entry point: ``bench a3c``, and the trainer of ``train rl --agents N``."""
    plugins.groups["bench"].command("a3c")(bench_a3c)
    plugins.multi_agent_rl = train_multi_agent
    from clusters.cli.federation import register_federation
    from clusters.cli.k8s import register_k8s
    from clusters.cli.live import register_live

    register_live(plugins)
    register_k8s(plugins)
    register_federation(plugins)


INLINE_BYTES = 4 << 20
"""Objects up to this size travel inside the actor call itself, not through the shared-memory object store.

A push carries one flat gradient and its reply the weights (0.8 MB each for the
testbed networks); through the object store each costs a few IPC round trips
with the raylet, which on a busy 2-core machine waits for a core (see
docs/BENCHMARKS.md, A3C).
"""


def start_ray(cpus: int) -> bool:
    """A local Ray instance with ``cpus`` CPUs on loopback, unless one is running; True if started here."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # keep the node on 127.0.0.1
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    if ray.is_initialized():
        return False
    ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False,
             _system_config={"max_direct_call_object_size": INLINE_BYTES})
    return True


def train_multi_agent(cfg: ExperimentConfig, init: Path | None, updates: int, seed: int, out: Path,
                      options: RLOptions, agents: int, logdir: Path, resume: bool,
                      on_progress: Callable[[int, ValidationRow | None], None]) -> tuple[RLResult, dict]:
    """``train rl --agents N``: A3C with N agents (:class:`~dl2ray.learn.cli.MultiAgentRL`)."""
    from clusters.a3c.training import A3COptions, checkpoint_kind, train_a3c
    from dl2ray.learn.rl import ValidationRow

    if options.replay or options.prioritized:
        raise UserError(f"--agents {agents}: A3C learns on each agent's fresh experience; "
                        "it has no replay (drop --replay/--prioritized)")
    if options.traces < agents:
        raise UserError(f"--traces {options.traces}: fewer training traces than --agents {agents}; "
                        "every agent needs traces of its own")
    if resume and out.exists() and (kind := checkpoint_kind(out)) != "a3c":
        raise UserError(f"--resume: {out} is a {kind!r} checkpoint; --agents {agents} resumes only A3C ones")
    a3c = A3COptions(agents=agents, traces=options.traces, val_traces=options.val_traces,
                     val_every=options.val_every, checkpoint_every=options.checkpoint_every,
                     critic=options.critic, exploration=options.exploration,
                     critic_warmup=options.critic_warmup, steps_per_update=options.steps_per_update,
                     max_grad_norm=options.max_grad_norm)

    def progress(stats: dict) -> None:
        last = stats["last_val"]
        on_progress(stats["updates"], ValidationRow(**last) if last else None)

    started = start_ray(max(agents, os.cpu_count() or 1))
    try:
        history, summary = train_a3c(cfg, init, updates, seed, out, a3c, logdir, resume, progress)
    finally:
        if started:
            import ray

            ray.shutdown()
    extra = {"per_agent": {str(k): v for k, v in sorted(summary.per_agent.items())}, "slots": summary.slots,
             "steps": summary.steps, "restarted_calls": summary.restarts}
    return history, extra


def bench_a3c(
    agents: Annotated[list[int] | None, typer.Option(
        "--agents", metavar="N [N ...]", help="agent counts to measure, e.g. --agents 1 2 (default)")] = None,
    # click gives an option one value: in "--agents 1 2" the 2 arrives as this argument
    more: Annotated[list[int] | None, typer.Argument(hidden=True, metavar="N")] = None,
    seconds: Annotated[float, typer.Option(min=0.1, help="measured seconds per agent count")] = 30.0,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="experiment YAML")] = None,
    seed: Annotated[int, typer.Option(help="network and sampling seed")] = 0,
    warmup: Annotated[float, typer.Option(min=0.0, help="unmeasured seconds before each measurement")] = 2.0,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object on stdout")] = False,
) -> None:
    """Federated A3C throughput: slots of experience per second, all agents together, per agent count."""
    counts = [*(agents or []), *(more or [])] or [1, 2]
    if min(counts) < 1:
        raise UserError(f"--agents: {min(counts)}: every agent count must be at least 1")
    cfg = load_config(config)
    from clusters.a3c.bench import bench_a3c as run_bench

    started = start_ray(max(*counts, os.cpu_count() or 1))
    try:
        doc = run_bench(cfg, counts, seconds, seed, warmup)
    finally:
        if started:
            import ray

            ray.shutdown()
    emit(doc, json_out)
