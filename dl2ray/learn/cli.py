"""``dl2ray train ...``: the learners' command line (composition root for training runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

from dl2ray.config import load_config
from dl2ray.errors import UserError
from dl2ray.report import emit

app = typer.Typer(no_args_is_help=True, add_completion=False)
_err = Console(stderr=True)


@app.command("sl")
def train_sl(
    out: Annotated[Path, typer.Option(help="checkpoint to write (its .json run record goes beside it)")],
    config: Annotated[Path | None, typer.Option("--config", "-c", help="experiment YAML")] = None,
    teacher: Annotated[str | None, typer.Option(help="heuristic to imitate (default policy.teacher)")] = None,
    traces: Annotated[int | None, typer.Option(min=1, help="training traces")] = None,
    val_traces: Annotated[int | None, typer.Option(min=1, help="validation traces")] = None,
    epochs: Annotated[int | None, typer.Option(min=1, help="default: policy.sl_epochs")] = None,
    seed: Annotated[int, typer.Option(help="network init and shuffling seed")] = 0,
    logdir: Annotated[Path | None, typer.Option(help="TensorBoard logs (default: OUT.tb/)")] = None,
    threads: Annotated[int, typer.Option(min=1, help="torch CPU threads")] = 1,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object on stdout")] = False,
) -> None:
    """Supervised warm-start: imitate a heuristic through the incremental decision loop."""
    import torch

    from dl2ray.learn.sl import SLRun, run_sl
    from dl2ray.schedulers.base import make_scheduler, scheduler_names

    cfg = load_config(config)
    p = cfg.policy
    name = (teacher or p.teacher).strip().lower()
    if name.startswith("dl2") or name not in scheduler_names():
        raise UserError(f"--teacher: {name!r} is not a heuristic; choose from "
                        f"{[n for n in scheduler_names() if n != 'dl2']}")
    make_scheduler(name, cfg)
    if out.suffix != ".pt":
        raise UserError(f"--out: {out}: expected a .pt checkpoint path")
    run = SLRun(name, traces or p.sl_traces, val_traces or p.sl_val_traces, epochs or p.sl_epochs,
                seed, p.sl_max_slots)
    torch.set_num_threads(threads)
    with Progress(
        "[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), console=_err, transient=True, disable=not _err.is_terminal,
    ) as bar:
        tasks = {
            "record": bar.add_task(f"recording {name}", total=run.traces + run.val_traces),
            "train": bar.add_task("training", total=run.epochs),
            "evaluate": bar.add_task("validation JCT", total=1),
        }
        _, _, result = run_sl(cfg, run, out, logdir or out.with_suffix(".tb"),
                              lambda stage, n: bar.advance(tasks[stage], n))
    doc = {"out": str(out), "teacher": name, "seed": seed, "samples": result.samples,
           "val_accuracy": result.val_accuracy, "policy_avg_jct": result.jct["policy_avg_jct"],
           "teacher_avg_jct": result.jct["teacher_avg_jct"], "jct_ratio": result.jct["ratio"]}
    emit(doc, json_out)


def check_checkpoint_paths(out: Path, init: Path | None) -> None:
    """``--out`` must name a ``.pt`` file and ``--init``, if given, must exist (UserError otherwise)."""
    if out.suffix != ".pt":
        raise UserError(f"--out: {out}: expected a .pt checkpoint path")
    if init is not None and not init.is_file():
        raise UserError(f"--init: {init}: no such checkpoint")


@app.command("rl")
def train_rl(
    out: Annotated[Path, typer.Option(help="checkpoint to write (OUT.best.pt, OUT.json, OUT.tb/ beside it)")],
    updates: Annotated[int, typer.Option(min=1, help="total updates (a resumed run counts its done ones)")],
    config: Annotated[Path | None, typer.Option("--config", "-c", help="experiment YAML")] = None,
    init: Annotated[
        Path | None, typer.Option(help="start from this (SL) checkpoint; default: scratch")
    ] = None,
    seed: Annotated[int, typer.Option(help="init, sampling, exploration and replay seed")] = 0,
    critic: Annotated[bool, typer.Option("--critic/--no-critic",
                                         help="TD actor-critic, or REINFORCE with a mean baseline")] = True,
    exploration: Annotated[bool, typer.Option("--exploration/--no-exploration",
                                              help="job-aware exploration")] = True,
    replay: Annotated[bool, typer.Option("--replay/--no-replay", help="experience replay")] = True,
    prioritized: Annotated[bool, typer.Option(help="prioritised replay (TD-error priorities)")] = False,
    traces: Annotated[int, typer.Option(min=1, help="training traces, cycled")] = 100,
    val_traces: Annotated[int, typer.Option(min=1, help="validation traces")] = 3,
    val_every: Annotated[int, typer.Option(min=1, help="updates between validations")] = 25,
    checkpoint_every: Annotated[int, typer.Option(min=1, help="updates between checkpoints")] = 50,
    critic_warmup: Annotated[int, typer.Option(min=0, help="first updates training only the critic")] = 0,
    resume: Annotated[bool, typer.Option(help="continue from OUT if it exists")] = False,
    logdir: Annotated[Path | None, typer.Option(help="TensorBoard logs (default: OUT.tb/)")] = None,
    threads: Annotated[int, typer.Option(min=1, help="torch CPU threads")] = 1,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object on stdout")] = False,
) -> None:
    """Online actor-critic RL of the DL2 policy (single process), from an SL checkpoint or scratch."""
    import torch

    from dl2ray.learn import rl

    cfg = load_config(config)
    check_checkpoint_paths(out, init)
    opts = rl.RLOptions(critic=critic, exploration=exploration, replay=replay, prioritized=prioritized,
                        traces=traces, val_traces=val_traces, val_every=val_every,
                        checkpoint_every=checkpoint_every, critic_warmup=critic_warmup)
    torch.set_num_threads(threads)
    with Progress(
        "[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), console=_err, transient=True, disable=not _err.is_terminal,
    ) as bar:
        task = bar.add_task("RL updates", total=updates)

        def on_update(row, val) -> None:
            jct = f" val JCT {val.avg_jct:.2f}" if val is not None else ""
            bar.update(task, completed=row.update,
                       description=f"RL updates (loss {row.policy_loss:+.3f}, H {row.entropy:.2f}){jct}")

        _, result = rl.train_rl(cfg, init, updates, seed, out, opts, logdir or out.with_suffix(".tb"),
                                resume, on_update)
    best = result.best
    doc = {"out": str(out), "best": str(out.with_suffix(".best.pt")), "seed": seed, "updates": result.updates,
           "init": result.init, "initial_val_avg_jct": result.validation[0].avg_jct,
           "final_val_avg_jct": result.validation[-1].avg_jct,
           "best_val_avg_jct": best.avg_jct if best else None, "best_update": best.update if best else None,
           "drf_val_avg_jct": result.baseline_avg_jct}
    emit(doc, json_out)
