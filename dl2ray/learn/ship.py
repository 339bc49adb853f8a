"""Shipping a trained policy: a slim checkpoint, its run record and a model card.

``dl2ray train ship --config C --run OUT.pt --name dl2-testbed`` takes an RL
run's best checkpoint (``OUT.best.pt``, chosen on validation traces), and
writes into ``--models`` (``models/`` by default):

- ``NAME.pt``: policy and value networks only (no optimiser state), with the
  provenance in its ``extra`` (config name, run, best update);
- ``NAME.json``: the run records — the RL run's ``OUT.json`` (config, seed,
  options, validation history, wall time) and, if the run started from one,
  the SL checkpoint's record (teacher, traces, epochs, agreement);
- ``NAME.md``: the model card — config, teacher, updates, agents, wall time,
  and the test-set comparison: average JCT (slots, mean ± 95% CI over test
  traces) of the policy and of every heuristic, its ratio to DRF, and how many
  jobs each finished.

Test traces come from :func:`dl2ray.learn.seeds.test`: never used in training
or model selection.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from dl2ray.config import ExperimentConfig
from dl2ray.errors import UserError
from dl2ray.learn import seeds as seedsets
from dl2ray.learn.records import SHAPE_ALGOS
from dl2ray.policy.network import load_checkpoint, read_checkpoint_doc, save_checkpoint

HEURISTICS = ("fifo", "srtf", "drf", "drf-static", "tetris", "optimus", "planner")
PAIRED = ("drf", "optimus", "planner")
"""Baselines every row of a card is compared with trace by trace (paired ratios)."""
KNOWS = {
    "fifo": "declared epochs, requested sizes",
    "srtf": "declared epochs, observed speeds, requested sizes",
    "drf": "task demands only",
    "drf-static": "task demands, requested sizes",
    "tetris": "declared epochs, observed speeds, requested sizes",
    "optimus": "declared epochs, each job's observed speeds and losses (its fits)",
    "planner": "declared epochs, the operator's profile (`dl2ray profile`: each type measured at a few "
               "points, with error)",
    "planner-truth": "**the simulator's true type surfaces** (reference, not deployable)",
    "optimus-truth": "**the simulator's true type surfaces** (reference, not deployable)",
    "oracle": "**the simulator's true type surfaces** (reference, not deployable)",
    "lower-bound": "**true lengths, each job's true compute and communication factors, the best layout** "
                   "(reference, not deployable)",
}
"""What each row of a card's table knows (the model's own row is described by its training)."""


@dataclass(frozen=True)
class Shipped:
    checkpoint: Path
    record: Path
    card: Path
    results: list[dict]


def read_record(path: Path) -> dict:
    """The JSON run record beside a checkpoint (``X.pt`` → ``X.json``); UserError if missing/bad."""
    rec = path.with_suffix(".json")
    try:
        return json.loads(rec.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise UserError(f"--run: {rec}: no run record beside the checkpoint") from exc
    except json.JSONDecodeError as exc:
        raise UserError(f"--run: {rec}: line {exc.lineno}: not JSON ({exc.msg})") from exc


def _run_paths(run: Path) -> tuple[Path, dict | None, dict | None]:
    """The best checkpoint of ``run``, its RL record, and the SL record of its init (if any).

    ``run`` may also be an SL checkpoint (its record says ``"kind": "sl"``): shipped as it
    is, with no RL record.
    """
    if run.is_file() and run.with_suffix(".json").is_file():
        rec = read_record(run)
        if rec.get("kind") == "sl":
            return run, None, rec
    best = run.with_suffix(".best.pt")
    if not best.is_file():
        raise UserError(f"--run: {best}: no best checkpoint (was {run} written by `dl2ray train rl`?)")
    rl = read_record(run)
    sl = None
    if rl.get("init"):
        init = Path(rl["init"])
        sl = read_record(init) if init.with_suffix(".json").is_file() else None
    return best, rl, sl


def ship(cfg: ExperimentConfig, config_path: str, run: Path, name: str, models: Path,
         test_traces: int, processes: int | None = None, trace_path: Path | None = None,
         placer: str | None = None) -> Shipped:
    """Write ``NAME.pt``, ``NAME.json`` and ``NAME.md`` (see the module docstring).

    ``trace_path``: test on this fixed Parquet trace (the test seeds then drive only the
    simulator's noise) instead of generated test traces. ``placer``: the placement policy the
    shipped checkpoint decides under as its own (``meta.placer``, chosen on validation); None keeps
    the run's (load balancing when it has none).
    """
    from dl2ray.policy.network import set_checkpoint_placer
    from dl2ray.policy.shape_net import checkpoint_placer

    best, rl, sl = _run_paths(run)
    models.mkdir(parents=True, exist_ok=True)
    pt, record, card = models / f"{name}.pt", models / f"{name}.json", models / f"{name}.md"
    _slim_copy(cfg, best, pt, run)
    set_checkpoint_placer(pt, placer or checkpoint_placer(best))
    test = seedsets.test(test_traces)
    rows = measure_test_rows(cfg, name, pt, test, trace_path, processes)
    record.write_text(json.dumps({"name": name, "config_file": config_path, "rl": rl, "sl": sl,
                                  "test_seeds": test, "test_trace": str(trace_path) if trace_path else None,
                                  "test_results": rows}, indent=1) + "\n", encoding="utf-8")
    card.write_text(model_card(name, config_path, str(run), rl, sl, rows, test, trace_path, placer),
                    encoding="utf-8")
    return Shipped(pt, record, card, rows)


def measure_test_rows(cfg: ExperimentConfig, name: str, pt: Path, test: list[int], trace_path: Path | None,
              processes: int | None) -> list[dict]:
    """A card's test comparison: every heuristic, the references and ``dl2:pt`` (renamed ``dl2 (name)``),
    each under its own placement unless ``cfg.cluster.placement`` forces one; paired ratios to
    :data:`PAIRED`."""
    from dl2ray.evaluation.comparison import compare
    from dl2ray.traces.parquet import read_trace

    spec = f"dl2:{pt}"
    trace = read_trace(trace_path, cfg.catalogue) if trace_path is not None else None
    refs = ["planner-truth", "optimus-truth"] if cfg.profile is not None else ["optimus-truth"]
    comp = compare(cfg, [*HEURISTICS, *refs, spec], test, trace=trace, processes=processes,
                   references=True, paired=PAIRED)
    rows = comp.summary()
    for row in rows:
        if row["scheduler"] == spec:
            row["scheduler"] = f"dl2 ({name})"
    return rows


TEST_HEADING = "## Test traces"


def retest(cfg: ExperimentConfig, name: str, models: Path, processes: int | None = None) -> Shipped:
    """Re-measure a shipped model's test table as the simulator and baselines are now (same test seeds or
    trace, same weights): ``NAME.json``'s ``test_results`` (the old ones kept as ``previous_test_results``)
    and the card's "Test traces" section are rewritten; the card's other sections stay as they are."""
    pt, record, card = models / f"{name}.pt", models / f"{name}.json", models / f"{name}.md"
    if not pt.is_file():
        raise UserError(f"--name: {pt}: no such shipped checkpoint")
    doc = read_record(pt)
    test = [int(x) for x in doc.get("test_seeds", [])]
    if not test:
        raise UserError(f"{record}: no test_seeds: ship it with `dl2ray train ship` first")
    trace_path = Path(doc["test_trace"]) if doc.get("test_trace") else None
    rows = measure_test_rows(cfg, name, pt, test, trace_path, processes)
    doc["previous_test_results"], doc["test_results"] = doc.get("test_results"), rows
    record.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    text = card.read_text(encoding="utf-8") if card.is_file() else f"# {name}\n"
    card.write_text(replace_test_section(text, card_test_section(rows, test, trace_path)), encoding="utf-8")
    return Shipped(pt, record, card, rows)


def card_test_section(rows: list[dict], test: list[int], trace_path: Path | None) -> list[str]:
    """The card's "Test traces" section: heading and table."""
    where = (f"the fixed trace `{trace_path}`, {len(test)} noise seed(s) {test[0]}..{test[-1]}"
             if trace_path else f"{len(test)}: seeds {test[0]}..{test[-1]}")
    return [f"{TEST_HEADING} ({where}, never used for training or selection)", "", *_test_table(rows)]


def replace_test_section(card: str, section: list[str]) -> str:
    """``card`` with its "Test traces" section (heading to the next ``## ``) replaced by ``section``; added
    at the end when it has none."""
    lines = card.rstrip("\n").split("\n")
    start = next((i for i, x in enumerate(lines) if x.startswith(TEST_HEADING)), None)
    if start is None:
        return "\n".join([*lines, "", *section]) + "\n"
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    tail = ["", *lines[end:]] if end < len(lines) else []
    return "\n".join([*lines[:start], *section, *tail]) + "\n"


def _slim_copy(cfg: ExperimentConfig, best: Path, pt: Path, run: Path) -> None:
    """``best``'s networks (no optimiser state) at ``pt``, with the provenance in its ``extra``."""
    from dl2ray.policy.shape_net import checkpoint_arch, load_shape_policy, save_shape_checkpoint

    ex = read_checkpoint_doc(best).get("extra", {})
    provenance = {"kind": "shipped", "config": cfg.name, "run": str(run),
                  "update": ex.get("updates"), "seed": ex.get("seed")}
    if checkpoint_arch(best) == "shape":
        save_shape_checkpoint(pt, load_shape_policy(best, cfg), cfg.catalogue.names, extra=provenance)
        return
    ckpt = load_checkpoint(best, catalogue=cfg.catalogue.names)
    save_checkpoint(pt, ckpt.policy, ckpt.value, cfg.catalogue.names, extra=provenance)


def _decay(policy: dict) -> str:
    n = policy.get("entropy_decay_updates") or 0
    return f" falling linearly to 0 over {n} updates" if n else " (constant)"


def _fmt_hours(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds < 3600 else f"{seconds / 3600:.2f} h"


def model_card(name: str, config_path: str, run: str, rl: dict | None, sl: dict | None, rows: list[dict],
               test: list[int], trace_path: Path | None = None, placer: str | None = None) -> str:
    """The card's Markdown (see the module docstring)."""
    src = rl if rl is not None else sl or {}
    best = (rl or {}).get("best") or {}
    opts = (rl or {}).get("options", {})
    policy = src.get("config", {}).get("policy", {})
    shape = _algo(rl or {}) in SHAPE_ALGOS or (sl or {}).get("run", {}).get("arch") == "shape"
    s = policy.get("shape", {})
    arch = (f"shape architecture: one (workers, PS) row per job from a menu of workers "
            f"{s.get('menu_workers')} × PS {s.get('menu_ps')} (and wait), one scorer shared by all jobs "
            f"(embedding {s.get('embed')}, head {s.get('head')})" if shape else
            f"J = {policy.get('window')} jobs per window, hidden layers {policy.get('hidden')}")
    lines = [
        f"# {name}",
        "",
        f"DL2 policy for `{config_path}` (config `{src.get('config', {}).get('name', '?')}`), {arch}.",
        "",
        "## Training",
        "",
        "| | |",
        "|---|---|",
    ]
    if sl is not None:
        smoothing = sl["config"]["policy"].get("sl_label_smoothing", 0)
        lines += [
            f"| supervised warm-start | teacher `{sl.get('teacher')}`, {sl['run']['traces']} training "
            f"traces, {_sl_schedule(sl['run'])}, label smoothing {smoothing} |",
            f"| SL agreement with the teacher (validation) | {sl.get('val_accuracy', float('nan')):.3f} |",
            f"| SL avg JCT / teacher (validation) | {sl.get('jct', {}).get('ratio', float('nan')):.3f} |",
            f"| SL wall time | {_fmt_hours(sl.get('wall_seconds', 0.0))} |",
        ]
    else:
        lines.append("| supervised warm-start | none (RL from scratch) |")
    if rl is None:
        lines += ["| RL | none: the supervised checkpoint is shipped as it is |"]
    else:
        lines += _rl_rows(rl, opts, policy, best)
    knows = _knowledge(policy, opts if rl is not None else None)
    lines += ["", "## What it knows", "", knows, "", *card_test_section(rows, test, trace_path)]
    commands = reproduce(name, config_path, run, rl, sl, len(test), trace_path, placer)
    lines += ["", "## Reproduce", "", "```sh", *commands, "```", ""]
    return "\n".join(lines)


def _knowledge(policy: dict, rl_opts: dict | None = None) -> str:
    """What the policy decides from and where it was trained (the card's "What it knows"); ``rl_opts``: the
    RL run's options, when one was shipped."""
    features = policy.get("shape", {}).get("profile_features", False)
    sees = ("It decides from the view (declared epochs, each job's observed speeds, the previous deployment) "
            + ("and the operator's profile (profile features: no job-type identity)." if features else
               "and a one-hot of the job type."))
    if rl_opts is not None and learned_online(policy, rl_opts):
        warm = (" (its supervised warm start ran the teacher in the operator's world)."
                if policy.get("train_world", "truth") == "operator" else ".")
        return (sees + " Its RL learned online from its own cluster through the live agent's interface "
                "(act, observe, reward): the simulator stood in for the live cluster and the learner read "
                "nothing but what the cluster showed" + warm
                + " Checkpoints were chosen on validation traces of the true simulator.")
    if policy.get("train_world", "truth") == "operator":
        return (sees + " It was trained in the operator's world — the operator's profile in place of the "
                "simulator's true speeds — so no weight has seen the truth; checkpoints were chosen on "
                "validation traces of the true simulator.")
    return sees + " It was trained in the simulator's true world (its weights have seen the true speeds)."


def learned_online(policy: dict, rl_opts: dict) -> bool:
    """Whether an RL run (its ``options`` and its config's ``policy``) learned from its own cluster: an
    on-policy algorithm with ``policy.experience: cluster`` (runs from before that option: in a twin)."""
    from dl2ray.learn.records import ALGORITHMS

    algo = ALGORITHMS.get(str(rl_opts.get("algo", "paper")))
    on_policy = algo is not None and not algo.counterfactual and not algo.rollout_labels
    return on_policy and policy.get("experience", "twin") == "cluster"


def _test_table(rows: list[dict]) -> list[str]:
    """The card's test table: every row, what it knows, its JCT and its paired ratios."""
    from dl2ray.evaluation.report import markdown_cell

    lines = ["avg JCT is the censored average (unfinished jobs counted until the run stopped), mean ± 95% CI "
             "over the traces; `/ X` is the paired ratio: on each trace this row's avg JCT over X's, mean ± "
             "95% CI.", "",
             "| scheduler | knows | placement | avg JCT (slots) | / DRF | / Optimus | / planner | p95 JCT "
             "| jobs done |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        name = str(r["scheduler"])
        ref = " *(reference, not deployable)*" if r.get("reference") else ""
        knows = KNOWS.get(name.split(":")[0], "see above" if name.startswith("dl2") else "")
        pairs = [r.get("paired", {}).get(b) or {} for b in PAIRED]
        ratios = " | ".join(f"{p.get('mean', float('nan')):.3f} ± {p.get('ci95', float('nan')):.3f}"
                            for p in pairs)
        jct = f"{r['censored_avg_jct']:.2f} ± {r['censored_avg_jct_ci95']:.2f}"
        where = markdown_cell(r.get("placement", ""))
        lines.append(f"| {markdown_cell(name)}{ref} | {knows} | {where} | {jct} | {ratios} | "
                     f"{r['p95_jct']:.2f} | {r['completed']:.1f}/{r['jobs']:.0f} |")
    return lines


def _algo(rl: dict) -> str:
    """The run's algorithm: single-process runs record it; an A3C run (``train rl --agents N``) trains the
    architecture of its config (shape: ``counterfactual``)."""
    opts = rl.get("options", {})
    if "algo" in opts:
        return str(opts["algo"])
    arch = rl.get("config", {}).get("policy", {}).get("arch", "paper")
    return "counterfactual" if arch == "shape" else "paper"


def _distributed(opts: dict) -> str:
    """How the run was spread (A3C: agents on Ray actors and the twin they learn in; else one process)."""
    if "agents" not in opts:
        return "one process"
    return (f"A3C: {opts['agents']} agent(s) as Ray actors pushing to one GlobalPolicy, "
            f"{opts.get('twin', 'config')} twin")


SHAPE_ALGO_WORDS = {
    "counterfactual": "per-job counterfactual rollouts, KL-limited improvement",
    "pg": "on-policy per-job policy gradient with a learned baseline",
    "mix": "counterfactual rollouts and on-policy advantages in one KL-limited update",
}


def _rl_rows(rl: dict, opts: dict, policy: dict, best: dict) -> list[str]:
    if _algo(rl) in SHAPE_ALGOS:
        s = policy.get("shape", {})
        first = (f"| RL | algorithm `{_algo(rl)}` ({SHAPE_ALGO_WORDS[_algo(rl)]}), {_distributed(opts)}, "
                 f"{rl.get('updates')} updates, seed {rl.get('seed')}, {s.get('slots_per_update')} slots × "
                 f"{s.get('jobs_per_slot')} jobs per update, {s.get('samples')} policy + {s.get('uniform')} "
                 f"uniform rows per job, horizon {s.get('horizon')}, KL {s.get('kl')}, lr {s.get('lr')} |")
    else:
        first = (f"| RL | algorithm `{opts.get('algo', 'paper')}`, {rl.get('updates')} updates, "
                 f"{opts.get('agents', rl.get('agents', 1))} agent(s), "
                 f"seed {rl.get('seed')}, γ {policy.get('gamma')}, "
                 f"entropy weight {policy.get('entropy_weight')}"
                 f"{_decay(policy)}, lr {policy.get('rl_lr')}, critic {opts.get('critic')}, "
                 f"exploration {opts.get('exploration')}, replay {opts.get('replay')} |")
    return [
        first,
        f"| RL wall time | {_fmt_hours(rl.get('wall_seconds', 0.0))} |",
        f"| shipped checkpoint | update {best.get('update')} (best validation avg JCT "
        f"{best.get('avg_jct', float('nan')):.2f} slots; DRF {rl.get('baseline_avg_jct', float('nan')):.2f} "
        f"on the same {len(rl.get('val_seeds', []))} validation traces) |",
    ]


def _sl_schedule(run: dict) -> str:
    """What an SL run trained: its first fit (or the checkpoint it went on from) and its DAgger rounds."""
    epochs, dagger, init = run["epochs"], run.get("dagger", 0), run.get("init")
    first = (f"from `{init}`" if dagger else f"{epochs} epochs from `{init}`") if init else f"{epochs} epochs"
    rounds = f", then {dagger} DAgger round(s) of {max(1, epochs // 2)} epochs" if dagger else ""
    lr = f" (lr {run['lr']:g})" if run.get("lr") else ""
    return first + rounds + lr


def reproduce(name: str, config_path: str, run: str, rl: dict | None, sl: dict | None,
              test_traces: int, trace_path: Path | None = None, placer: str | None = None) -> list[str]:
    """The commands that rebuild this model from its run records (same seeds → same networks);
    ``placer``: the ``--placer`` it was shipped with, if one was named."""
    cmds = []
    if sl is not None:
        r = sl["run"]
        files = "".join(f" --train-trace {f}" for f in r.get("train_files", ())) + "".join(
            f" --val-trace {f}" for f in r.get("val_files", ()))
        out = rl.get("init") if rl is not None else run
        arch = " --arch shape" if r.get("arch") == "shape" else ""
        arch += f" --dagger {r['dagger']}" if r.get("dagger") else ""
        arch += f" --init {r['init']}" if r.get("init") else ""
        arch += f" --lr {r['lr']:g}" if r.get("lr") else ""
        cmds.append(f"dl2ray train sl --config {config_path}{arch} --teacher {r['teacher']} "
                    f"--out {out} --traces {r['traces']} --val-traces {r['val_traces']} "
                    f"--epochs {r['epochs']} --seed {r['seed']}{files}")
    if rl is not None:
        o = rl.get("options", {})
        init = f" --init {rl['init']}" if rl.get("init") else ""
        algo = f" --algo {_algo(rl)}" if _algo(rl) != "paper" else ""
        if "agents" in o:  # an A3C run
            twin = o.get("twin", "config")
            algo += f" --agents {o['agents']}" + (f" --twin {twin}" if twin != "config" else "")
        cmds.append(f"dl2ray train rl --config {config_path}{init}{algo} --updates {rl.get('updates')} "
                    f"--traces {o.get('traces')} --val-traces {o.get('val_traces')} "
                    f"--val-every {o.get('val_every')} --seed {rl.get('seed')} --out {run}")
    trace = f" --trace {trace_path}" if trace_path else ""
    trace += f" --placer {placer}" if placer else ""
    cmds.append(f"dl2ray train ship --config {config_path} --run {run} --name {name} "
                f"--test-traces {test_traces}{trace}")
    return cmds


def shipped_rows(models: Path) -> list[dict]:
    """One row per shipped policy of ``models`` whose record holds paired test ratios (``NAME.json`` with
    a ``dl2 (NAME)`` row in ``test_results``), by name: config, test traces, the policy's avg JCT (slots,
    mean ± 95 % CI) and its paired ratios to each of :data:`PAIRED` (mean, ci95). Records without paired
    ratios (the clairvoyant and paper-architecture rounds) are left out."""
    out = []
    for record in sorted(models.glob("*.json")):
        doc = json.loads(record.read_text(encoding="utf-8"))
        mine = [r for r in doc.get("test_results") or [] if str(r.get("scheduler", "")).startswith("dl2 (")]
        if not mine or not mine[0].get("paired"):
            continue
        row = mine[0]
        traces = len(doc.get("test_seeds") or [])
        where = f"{traces} × {doc['test_trace']}" if doc.get("test_trace") else f"{traces} generated"
        out.append({"name": doc.get("name", record.stem), "config": doc.get("config_file"), "test": where,
                    "placement": row.get("placement"), "avg_jct": row["avg_jct"],
                    "avg_jct_ci95": row.get("avg_jct_ci95"),
                    "paired": {b: row["paired"][b] for b in PAIRED if b in row["paired"]}})
    return out


def shipped_markdown(rows: list[dict]) -> str:
    """:func:`shipped_rows` as the Markdown table of docs/results.md ("The shipped policies")."""
    head = ["policy", "config", "test traces", "avg JCT (slots)", *(f"/ {b}" for b in PAIRED)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        ratios = [f"{r['paired'][b]['mean']:.3f} ± {r['paired'][b]['ci95']:.3f}" if b in r["paired"] else "–"
                  for b in PAIRED]
        lines.append(f"| `{r['name']}` | `{r['config']}` | {r['test']} | {r['avg_jct']:.2f} ± "
                     f"{r['avg_jct_ci95']:.2f} | " + " | ".join(ratios) + " |")
    return "\n".join(lines) + "\n"
