"""``train rl --agents N`` (N ≥ 2: A3C on Ray actors) and ``bench a3c`` (composition root)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from clusters.runtime import ray_session, start_ray
from dl2ray.config import load_config
from dl2ray.errors import UserError
from dl2ray.evaluation.report import emit

if TYPE_CHECKING:
    from collections.abc import Callable

    from dl2ray.cli.commands import Plugins
    from dl2ray.config import ExperimentConfig
    from dl2ray.learn.records import RLOptions, RLResult, ValidationRow


def register_a3c(plugins: Plugins) -> None:
    """``bench a3c``, and the trainer of ``train rl --agents N``."""
    plugins.groups["bench"].command("a3c")(bench_a3c)
    plugins.multi_agent_rl = train_multi_agent
    plugins.ray_session = ray_session


def train_multi_agent(cfg: ExperimentConfig, init: Path | None, updates: int, seed: int, out: Path,
                      options: RLOptions, agents: int, logdir: Path, resume: bool,
                      on_progress: Callable[[int, ValidationRow | None], None]) -> tuple[RLResult, dict]:
    """``train rl --agents N``: A3C with N agents (:class:`~dl2ray.cli.train.MultiAgentRL`)."""
    from clusters.a3c.global_policy import A3COptions
    from clusters.a3c.training import train_a3c
    from clusters.a3c.weights import checkpoint_kind
    from dl2ray.learn.records import ValidationRow, algorithm
    from dl2ray.policy.shape_net import checkpoint_arch

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
                     max_grad_norm=options.max_grad_norm, zero_advantage=options.zero_advantage,
                     twin=options.twin, credit=options.credit,
                     algo="pg" if options.algo == "pg" else "counterfactual",
                     share_baseline=options.share_baseline, defer_validation=options.defer_validation)
    # The algorithm names the architecture the agents train: counterfactual the shape policy, paper the
    # paper's networks (an init checkpoint must be of the same one).
    arch = algorithm(options.algo).arch
    if init is not None and (have := checkpoint_arch(init)) != arch:
        raise UserError(f"--init: {init} is a {have!r} checkpoint; --algo {options.algo} trains the {arch!r} "
                        "architecture")
    cfg = cfg.model_copy(update={"policy": cfg.policy.model_copy(update={"arch": arch})})

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
             "steps": summary.steps, "restarted_calls": summary.restarts, "refused": summary.refused}
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
    single_process: Annotated[bool, typer.Option(
        "--single-process", help="also measure the single-process trainer (the reference), first")] = False,
    init: Annotated[Path | None, typer.Option(
        help="start every row from this checkpoint (its architecture), as a warm-started run does")] = None,
    plain: Annotated[bool, typer.Option(
        "--plain", help="before each Ray row, the agents' same work in plain processes without Ray "
                        "(what the machine gives)")] = False,
    same_traces: Annotated[bool, typer.Option(
        "--same-traces", help="every agent cycles the same training traces, so every row does the same "
                              "work per push (the control; training splits them)")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object on stdout")] = False,
) -> None:
    """Federated A3C throughput: slots of experience per second, all agents together, per agent count."""
    counts = [*(agents or []), *(more or [])] or [1, 2]
    if min(counts) < 1:
        raise UserError(f"--agents: {min(counts)}: every agent count must be at least 1")
    cfg = load_config(config)
    if init is not None:
        from dl2ray.policy.shape_net import checkpoint_arch

        checkpoint_arch(init)  # an unreadable checkpoint is refused before Ray starts
    from clusters.a3c.bench import bench_a3c as run_bench

    started = start_ray(max(*counts, os.cpu_count() or 1))
    try:
        doc = run_bench(cfg, counts, seconds, seed, warmup, single_process=single_process, init=init,
                        plain=plain, same_traces=same_traces)
    finally:
        if started:
            import ray

            ray.shutdown()
    emit(doc, json_out)
