"""``dl2ray federation``: ``from-philly``, ``check``, ``up``, ``status``, ``down``.

Importing this module imports neither Ray nor torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from dl2ray.errors import UserError
from dl2ray.evaluation.report import emit

federation_app = typer.Typer(
    no_args_is_help=True, help="Multi-cluster federated learning: one global policy, many member clusters.")
FileArg = Annotated[Path, typer.Argument(help="federation file (configs/federation.yaml)")]


def register_federation(plugins) -> None:
    root = getattr(plugins, "root", None)
    if root is not None:
        root.add_typer(federation_app, name="federation")
    plugins.groups["bench"].command("federation")(bench_federation)
    plugins.federated_rl = federated_rl


def federated_rl(cfg, init: Path, members: int, pushes: int, seed: int, options, out: Path) -> list:
    """Fig. 18's federation runner (:func:`clusters.federation.quality.federated_rl`) on a local Ray
    instance it starts (and stops) when none is running."""
    from clusters.federation.quality import federated_rl as run
    from clusters.runtime import ray_session

    with ray_session(2):
        return run(cfg, init, members, pushes, seed, options, out)


@federation_app.command("check")
def check(file: FileArg) -> None:
    """Validate the federation file, every member's experiment and every k8s member's kubeconfig context;
    print a one-line summary per member."""
    from clusters.federation.config import load_federation, member_config
    from clusters.federation.kinds import check_context

    fed = load_federation(file)
    for i, m in enumerate(fed.members):
        if m.backend.kind == "sim":
            cfg = member_config(fed, i)
            size = f"{cfg.cluster.num_nodes} nodes, {cfg.workload.num_jobs} jobs/trace, " \
                   f"rate {cfg.workload.arrivals.rate:g}/slot"
        elif m.backend.kind == "ray":
            size = f"live Ray cluster at {m.backend.address}"
        else:
            check_context(fed, i)
            size = f"Kubernetes context {m.backend.context}"
        where = fed.where(m) or "learner's Ray"
        print(f"{m.name}: {m.mode}, weight {m.weight:g}, staleness {m.staleness}, {size}, via {where}")


@federation_app.command("from-philly")
def from_philly_command(
    csv: Annotated[Path, typer.Argument(help="Philly CSV (timestamp,duration,num_gpus,gpu_time,cluster)")],
    out: Annotated[Path, typer.Option("--out", "-o", help="federation file to write")],
    vcs: Annotated[int, typer.Option("--vcs", help="the N virtual clusters with the most jobs")] = 4,
    base: Annotated[Path, typer.Option(help="experiment config each VC member overrides")] = Path(
        "configs/testbed.yaml"),
    name: Annotated[str, typer.Option(help="federation name")] = "philly",
    gpu_scale: Annotated[float, typer.Option(min=1.0, help="Philly GPUs per simulated GPU")] = 4.0,
    min_nodes: Annotated[int, typer.Option(min=1)] = 2,
    max_nodes: Annotated[int, typer.Option(min=1)] = 40,
    add: Annotated[list[Path] | None, typer.Option(
        "--add", help="more members: an experiment config each (e.g. configs/testbed.yaml)")] = None,
    runs: Annotated[Path, typer.Option(help="folder of the learner's output (runs/NAME)")] = Path(
        "runs/federation"),
) -> None:
    """Write a federation file of the trace's largest virtual clusters (size and job mix from the trace)."""
    from clusters.federation.config import load_federation
    from clusters.federation.philly import from_philly

    doc = from_philly(csv, vcs, out, base, None, name, gpu_scale, min_nodes, max_nodes,
                      list(add or []), runs)
    load_federation(out)  # what was written must load
    print(f"wrote {out}: {len(doc['members'])} members ({', '.join(m['name'] for m in doc['members'])})")


@federation_app.command("up")
def up_command(file: FileArg,
               wait: Annotated[float, typer.Option(min=1.0, help="seconds to wait for every member")] = 180.0,
               json_out: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Start the learner, its HTTP endpoint and every member; return once all have contacted the learner."""
    from clusters.federation.deploy import up

    res = up(file, wait)
    if json_out:
        print(json.dumps(res))
    else:
        print(f"federation up: learner at {res['address']} (update {res['updates']}, boot {res['boot']}), "
              f"endpoint {res['url']}, members {', '.join(res['members'])}")


def _fmt(v, spec: str = "", none: str = "-") -> str:
    return none if v is None else format(v, spec)


@federation_app.command("status")
def status_command(file: FileArg, json_out: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Per member: updates pushed, dropped as stale, last contact, staleness, validation JCT vs DRF."""
    from clusters.federation.deploy import status

    st = status(file)
    if json_out:
        print(json.dumps(st))
        return
    print(f"federation {st['federation']}: {st['updates']} updates, learner boot {st['boot']}, "
          f"up {st['uptime_s']:.0f} s, checkpoint {st['checkpoint']}")
    print(f"{'member':<18}{'mode':<11}{'backend':<8}{'updates':>8}{'stale':>6}{'rewound':>8}{'joins':>6}"
          f"{'contact s':>10}{'lag':>5}{'bytes/upd':>10}{'val JCT':>9}{'DRF':>8}{'ratio':>7}")
    live = False
    for m in st["members"]:
        backend = m.get("backend", "sim")
        na = "n/a" if backend != "sim" else "-"  # a live cluster has no simulated validation traces
        live = live or backend != "sim"
        print(f"{m['name']:<18}{m['mode']:<11}{backend:<8}{m['updates']:>8}{m['dropped']:>6}{m['rewound']:>8}"
              f"{m['joins']:>6}{_fmt(m['last_contact_s'], '.1f'):>10}{m['staleness']:>5}"
              f"{m['bytes_last'] or '-':>10}{_fmt(m['val_jct'], '.2f', na):>9}"
              f"{_fmt(m['drf_jct'], '.2f', na):>8}{_fmt(m['jct_over_drf'], '.3f', na):>7}")
    if live:
        print("n/a: live members (ray, k8s) have no simulated validation traces; their decision logs: "
              "`dl2ray cluster report --log-dir`")


@federation_app.command("down")
def down_command(file: FileArg) -> None:
    """Stop every member, write the learner's final checkpoint, stop it (and the Ray head up started)."""
    from clusters.federation.deploy import down

    res = down(file)
    print(f"federation {res['federation']} down: final checkpoint at update {res['updates']} in "
          f"{res['checkpoint']}")


def bench_federation(
    members: Annotated[list[int] | None, typer.Option(
        "--members", metavar="N", help="member counts to measure (default 2 4 8)")] = None,
    more: Annotated[list[int] | None, typer.Argument(hidden=True, metavar="N")] = None,
    seconds: Annotated[float, typer.Option(min=0.5, help="measured seconds per member count")] = 20.0,
    config: Annotated[Path, typer.Option("--config", "-c")] = Path("configs/testbed.yaml"),
    learner_only: Annotated[bool, typer.Option(
        "--learner-only", help="only the learner's ceiling (ready gradients back to back)")] = False,
    json_out: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Learner updates/s with N simulated members, bytes per update over HTTP, rejoin after a restart,
    and the learner's own ceiling."""
    from clusters.federation.bench import run_bench

    counts = [*(members or []), *(more or [])] or [2, 4, 8]
    bad = [n for n in counts if n < 1]
    if bad:
        raise UserError(f"--members: {bad[0]}: a member count must be at least 1")
    emit(run_bench(config, counts, seconds, learner_only=learner_only), json_out)


@federation_app.command("experiment")
def experiment_command(
    file: FileArg,
    updates: Annotated[int, typer.Option(min=1, help="global updates of every training run")] = 60,
    test_traces: Annotated[int, typer.Option(min=1, help="test traces per member (seeds 4,000,000..)")] = 5,
    member: Annotated[list[str] | None, typer.Option("--member", help="only these members")] = None,
    seeds: Annotated[list[int] | None, typer.Option(
        "--seed", help="learning seeds (repeat the option; default: the learner's seed)")] = None,
    json_out: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Federated vs each member alone (same updates) vs the init and the deployable heuristics on every
    member's test traces (held-out ``shadow`` members: federated, init and heuristics), paired."""
    import sys

    from clusters.federation.experiment import run_experiment

    doc = run_experiment(file, updates, test_traces, member,
                         progress=lambda msg: print(msg, file=sys.stderr, flush=True), learning_seeds=seeds)
    if json_out:
        print(json.dumps(doc))
        return
    print(f"{'member':<16}{'nodes':>6}{'best heur.':>16}{'init':>9}{'alone':>9}{'federated':>10}"
          f"{'fed/alone':>16}{'fed/best':>16}")
    for r in doc["members"]:
        best = f"{r['best_heuristic']} {r[r['best_heuristic'] + '_mean']:.2f}"
        alone = r.get("federated_vs_alone")
        print(f"{r['member']:<16}{r['nodes']:>6}{best:>16}{_fmt(r.get('init_mean'), '.2f'):>9}"
              f"{_fmt(r.get('alone_mean'), '.2f'):>9}{r['federated_mean']:>10.2f}"
              f"{_ratio(alone):>16}{_ratio(r['federated_vs_best_heuristic']):>16}")


def _ratio(r: dict | None) -> str:
    return "-" if r is None else f"{r['mean']:.3f}±{r['ci95']:.3f}"
