"""``dl2ray train harmony``: the reward model and the actor-critic (composition root of that run)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from dl2ray.errors import UserError

ABLATIONS = ("none", "no-rm", "no-replay", "no-explore")


def train_harmony(
    out: Annotated[Path, typer.Option(help="checkpoint to write (.pt; its .json record goes beside it)")],
    config: Annotated[Path, typer.Option("--config", "-c", help="gang-mode experiment YAML")] = Path(
        "configs/harmony.yaml"
    ),
    episodes: Annotated[int, typer.Option(min=1, help="actor-critic training traces")] = 30,
    rm_traces: Annotated[int, typer.Option(min=1, help="training traces logged for the reward model")] = 30,
    ablation: Annotated[str, typer.Option(help=f"one of {', '.join(ABLATIONS)}")] = "none",
    eval_every: Annotated[int, typer.Option(min=1, help="validate every this many episodes")] = 3,
    seed: Annotated[int, typer.Option(help="network init, exploration and replay seed")] = 0,
    reward_model: Annotated[
        Path | None,
        typer.Option(help="reuse the reward model of this harmony checkpoint instead of training one"),
    ] = None,
    warm_start: Annotated[
        str, typer.Option(help="imitate this first: none, lif-linear, lb-place, rm-planner, pack-place")
    ] = "none",
    imitation_traces: Annotated[int, typer.Option(min=1, help="training traces for the warm start")] = 30,
    val_traces: Annotated[int, typer.Option(min=1, help="validation traces for model selection")] = 6,
    rm_steps: Annotated[int, typer.Option(min=1, help="reward-model Adam steps (minibatches of 512)")] = 8000,
    lr: Annotated[float, typer.Option(min=0.0, help="actor-critic Adam learning rate")] = 1e-3,
    eps_start: Annotated[float, typer.Option(min=0.0, max=1.0, help="initial ε of exploration")] = 0.3,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object on stdout")] = False,
) -> None:
    """Harmony: reward-prediction model on logged placements, then actor-critic placement."""
    from dl2ray.config import load_config
    from dl2ray.harmony.imitate import TEACHERS
    from dl2ray.harmony.train import HarmonySettings, train

    if ablation not in ABLATIONS:
        raise UserError(f"--ablation: {ablation!r}; choose from {list(ABLATIONS)}")
    if warm_start not in ("none", *TEACHERS):
        raise UserError(f"--warm-start: {warm_start!r}; choose from {['none', *TEACHERS]}")
    cfg = load_config(config)
    if cfg.gang is None or cfg.gang.workload != "synthetic" or cfg.speed.model != "measured":
        raise UserError(
            f"--config: {config}: Harmony trains on a gang-mode config with PS jobs "
            "(gang.workload: synthetic, speed.model: measured)"
        )
    if out.suffix != ".pt":
        raise UserError(f"--out: {out}: expected a .pt checkpoint path")
    out.parent.mkdir(parents=True, exist_ok=True)
    st = HarmonySettings(
        episodes=episodes,
        rm_traces=rm_traces,
        rm_steps=rm_steps,
        ablation=ablation,
        eval_every=eval_every,
        seed=seed,
        warm_start=warm_start,
        eps_start=eps_start,
        lr=lr,
        imitation_traces=imitation_traces,
        val_traces=val_traces,
    )

    def show(row: dict) -> None:
        if not json_out:
            typer.echo(json.dumps(row), err=True)

    if reward_model is not None and not reward_model.is_file():
        raise UserError(f"--reward-model: {reward_model}: no such checkpoint")
    record = train(cfg, st, out, on_row=show, rm_from=reward_model)
    out.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    summary = {
        "out": str(out),
        "reward_model": record["reward_model"],
        "episode": record.get("episode"),
        "val_jct": record.get("val_jct"),
    }
    if json_out:
        print(json.dumps(summary))
    else:
        typer.echo(json.dumps(summary))
