"""``dl2ray experiment robustness``: the DL2 paper's robustness experiments in one command (report in docs/).

The composition root of :mod:`dl2ray.studies.robustness` and :mod:`dl2ray.studies.robustness_report`.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from dl2ray.errors import UserError

DEPLOYABLE = "fifo,srtf,drf,drf-static,tetris,optimus,planner"
_err = Console(stderr=True)


def robustness(
    config: Annotated[Path, typer.Option("--config", "-c", help="experiment YAML")] = Path(
        "configs/testbed.yaml"),
    policy: Annotated[Path, typer.Option(help="the shipped DL2 policy")] = Path("models/dl2-testbed.pt"),
    unseen_policy: Annotated[Path | None, typer.Option(
        help="a policy trained without two job types (the generality study; none: skipped)")] = None,
    schedulers: Annotated[str, typer.Option(help="the deployable heuristics compared")] = DEPLOYABLE,
    studies: Annotated[str, typer.Option(help="comma-separated studies (default: all three)")] = (
        "epoch_error,job_deviation,interference"),
    traces: Annotated[int, typer.Option(min=1, help="test traces per point")] = 5,
    seed: Annotated[int | None, typer.Option(help="first trace seed (default: the first test seed)")] = None,
    profile_seed: Annotated[int, typer.Option(help="seed of the profile measured at every point")] = 0,
    out: Annotated[Path, typer.Option(help="the report (markdown)")] = Path("docs/robustness.md"),
    img: Annotated[Path, typer.Option(help="folder of the plots")] = Path("docs/img"),
    processes: Annotated[int | None, typer.Option(help="worker processes (default: cores)")] = None,
) -> None:
    """Sweep epoch-estimate error, job speed deviation and interference over every deployable scheduler and
    the DL2 policy (profiling the cluster again at each point), and test on unseen job types; writes the
    report, its plots and OUT.json."""
    from dl2ray.config import load_config
    from dl2ray.seeds import TEST
    from dl2ray.studies import robustness as rb
    from dl2ray.studies.robustness_report import write_report

    cfg = load_config(config)
    names = [s.strip() for s in schedulers.split(",") if s.strip()]
    chosen = [s.strip() for s in studies.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in rb.SWEEPS]
    if unknown:
        raise UserError(f"--studies: unknown {unknown}; known: {sorted(rb.SWEEPS)}")
    for option, path in (("--policy", policy), ("--unseen-policy", unseen_policy)):
        if path is not None and not path.is_file():
            raise UserError(f"{option}: {path}: no such checkpoint")
    dl2 = f"dl2:{policy}"
    first = TEST[0] if seed is None else seed
    seeds = list(range(first, first + traces))
    all_names = [*names, dl2]
    points = rb.sweep(cfg, all_names, seeds, chosen, profile_seed, processes,
                      on_point=lambda p: _err.print(f"{p.study} = {p.value:g}: "
                                                    + ", ".join(f"{n} {v:.2f}" for n, v in p.jct.items())))
    unseen = None
    if unseen_policy is not None:
        unseen = rb.unseen_types(cfg, [*all_names, f"dl2:{unseen_policy}"], seeds, processes)
    header = (f"# Robustness of the deployable schedulers and DL2 ({cfg.name})\n\n"
              f"Written by `dl2ray experiment robustness --config {config} --policy {policy}"
              + (f" --unseen-policy {unseen_policy}" if unseen_policy else "")
              + f" --traces {traces} --seed {first}`: test traces {seeds[0]}–{seeds[-1]} at every point, the "
              f"cluster profiled again at each (profile seed {profile_seed}); every other setting as in "
              f"`{config}`. The DL2 policy is the shipped one, trained once at the config's settings. "
              "See dl2ray/studies/robustness.py for what each study varies.\n")
    write_report(out, img, points, all_names, unseen, header)
    doc = {"config": cfg.name, "seeds": seeds, "policy": str(policy), "points": [asdict(p) for p in points],
           "unseen": None if unseen is None else unseen.summary()}
    from dl2ray.evaluation.report import dumps

    out.with_suffix(".json").write_text(dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out}, {out.with_suffix('.json')} and the plots in {img}")
