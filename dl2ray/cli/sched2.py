"""``dl2ray train sched2``: train SCHED²'s Q-network by DQN (composition root of that run)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from dl2ray.errors import UserError


def train_sched2(
    out: Annotated[Path, typer.Option(help="checkpoint to write (.pt; its .json log goes beside it)")],
    config: Annotated[Path, typer.Option("--config", "-c", help="gang-mode experiment YAML")] = Path(
        "configs/sched2.yaml"
    ),
    episodes: Annotated[
        int, typer.Option(min=0, help="training traces (one episode each); 0 only with --warm-start")
    ] = 40,
    window: Annotated[int, typer.Option(min=1, help="J: waiting jobs the agent chooses from")] = 10,
    lr: Annotated[float, typer.Option(min=0.0, help="Adam learning rate")] = 5e-4,
    gamma: Annotated[float, typer.Option(min=0.0, max=1.0, help="discount per decision")] = 0.99,
    jobs: Annotated[
        int | None,
        typer.Option(
            min=1, help="jobs per training trace (default: workload.num_jobs; validation: the config's)"
        ),
    ] = None,
    val_traces: Annotated[int, typer.Option(min=1, help="validation traces for model selection")] = 2,
    eval_every: Annotated[int, typer.Option(min=1, help="validate every this many episodes")] = 5,
    seed: Annotated[int, typer.Option(help="network init, exploration and replay seed")] = 0,
    eps_start: Annotated[
        float | None,
        typer.Option(min=0.0, max=1.0, help="initial ε (default 1.0; 0.1 with --warm-start)"),
    ] = None,
    warm_start: Annotated[
        str | None,
        typer.Option(help="imitate this baseline first (saf, sif, lrf, spf, fifo-gang); default: none"),
    ] = None,
    sl_epochs: Annotated[int, typer.Option(min=1, help="imitation epochs (with --warm-start)")] = 30,
    sl_traces: Annotated[int, typer.Option(min=1, help="training traces the teacher is recorded on")] = 4,
    td_weight: Annotated[
        float, typer.Option(min=0.0, help="λ_TD: weight of the TD loss during imitation (0: margin only)")
    ] = 1.0,
    arch: Annotated[
        str, typer.Option(help="Q-network: dense (the paper's) or jobwise (one scorer shared by the jobs)")
    ] = "dense",
    reward: Annotated[
        str, typer.Option(help="effectiveness (the paper's) or jct (minus job-hours accrued per decision)")
    ] = "effectiveness",
    dagger: Annotated[
        int,
        typer.Option(min=0, help="DAgger rounds after the warm start (teacher labels the net's own states)"),
    ] = 0,
    dagger_traces: Annotated[int, typer.Option(min=1, help="training traces per DAgger round")] = 4,
    rollout_iters: Annotated[
        int, typer.Option(min=0, help="rounds of rollout policy improvement after the warm start")
    ] = 0,
    rollout_traces: Annotated[int, typer.Option(min=1, help="training traces labelled per round")] = 2,
    rollout_points: Annotated[int, typer.Option(min=1, help="decision slots labelled per trace")] = 40,
    rollout_candidates: Annotated[int, typer.Option(min=2, help="best actions by Q tried per slot")] = 3,
    rollout_horizon: Annotated[int, typer.Option(min=1, help="slots each rollout runs")] = 720,
    rollout_min_gain: Annotated[
        float, typer.Option(min=0.0, help="job-slots a rollout must save to change a label")
    ] = 300.0,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object on stdout")] = False,
) -> None:
    """SCHED²: DQN (ε-greedy, prioritised replay, target network) over job selection in gang mode,
    optionally warm-started by imitating a baseline (``--warm-start saf``) and improved by
    rollouts (``--rollout-iters``) before the DQN episodes."""
    from dl2ray.config import load_config
    from dl2ray.sched2.imitation import TEACHERS, ImitationSettings
    from dl2ray.sched2.train import DQNSettings, train

    if warm_start is not None and warm_start not in TEACHERS:
        raise UserError(f"--warm-start: unknown teacher {warm_start!r} (one of {', '.join(TEACHERS)})")
    from dl2ray.sched2.state import ARCHS

    if arch not in ARCHS:
        raise UserError(f"--arch: unknown architecture {arch!r} (one of {', '.join(ARCHS)})")
    if reward not in ("effectiveness", "jct"):
        raise UserError(f"--reward: unknown reward {reward!r} (effectiveness or jct)")
    if (rollout_iters or dagger) and warm_start is None:
        flag = "--rollout-iters" if rollout_iters else "--dagger"
        raise UserError(f"{flag} improves a warm start: give --warm-start too")
    if episodes == 0 and warm_start is None:
        raise UserError("--episodes 0 trains nothing without --warm-start")
    cfg = load_config(config)
    if cfg.gang is None or cfg.gang.workload != "philly":
        raise UserError(
            f"--config: {config}: SCHED² trains on a gang-mode Philly config (gang.workload: philly)"
        )
    if out.suffix != ".pt":
        raise UserError(f"--out: {out}: expected a .pt checkpoint path")
    out.parent.mkdir(parents=True, exist_ok=True)
    st = DQNSettings(
        episodes=episodes,
        window=window,
        arch=arch,
        reward=reward,
        lr=lr,
        gamma=gamma,
        val_traces=val_traces,
        eval_every=eval_every,
        seed=seed,
        train_jobs=jobs,
        eps_start=eps_start if eps_start is not None else (1.0 if warm_start is None else 0.1),
    )
    warm = (
        None
        if warm_start is None
        else ImitationSettings(
            teacher=warm_start,
            epochs=sl_epochs,
            traces=sl_traces,
            td_weight=td_weight,
            gamma=gamma,
            dagger=dagger,
            dagger_traces=dagger_traces,
        )
    )

    def show(row: dict) -> None:
        if not json_out:
            typer.echo(json.dumps(row), err=True)

    from dl2ray.sched2.rollout import RolloutSettings

    rollout = RolloutSettings(
        iterations=rollout_iters,
        traces=rollout_traces,
        points=rollout_points,
        candidates=rollout_candidates,
        horizon=rollout_horizon,
        min_gain=rollout_min_gain,
    )
    log = train(cfg, st, out, on_episode=show, warm=warm, rollout=rollout)
    doc = {
        "out": str(out),
        "config": cfg.name,
        "best": log.best,
        "imitation": log.imitation,
        "episodes": log.rows,
    }
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    if json_out:
        print(json.dumps({"out": str(out), "best": log.best}))
    else:
        typer.echo(
            f"wrote {out} (best validation avg JCT {log.best.get('val_jct')} slots at episode "
            f"{log.best.get('episode')})"
        )
