"""Human-facing output: rich tables on stderr/stdout and the JCT CDF plot."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from dl2ray.evaluation.comparison import LOWER_BOUND, Comparison


def json_safe(obj):
    """``obj`` with every non-finite float (NaN, ±inf) replaced by None, recursively (dicts, lists)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    return obj


def dumps(doc, indent: int | None = None) -> str:
    """Strict JSON of ``doc``: non-finite numbers become ``null`` (never the invalid ``NaN``)."""
    return json.dumps(json_safe(doc), indent=indent, allow_nan=False)


def emit(doc: dict, json_out: bool) -> None:
    """A result document: one JSON object on stdout, or ``key: value`` lines."""
    if json_out:
        print(dumps(doc))
    else:
        for k, v in doc.items():
            print(f"{k}: {v}")


REFERENCE_MARK = " †"
REFERENCE_NOTE = ("† reference, not deployable: reads the simulator's true speeds (optimus-truth, "
                  "planner-truth), each job's true factors (planner-job-truth), or true lengths and factors "
                  "(lower-bound)")


def _num(value, fmt: str) -> str:
    return "-" if value is None or not math.isfinite(value) else format(value, fmt)


def comparison_table(comp: Comparison) -> Table:
    """Mean ± 95% CI per scheduler. The average JCT is censored (unfinished jobs counted until
    the run stopped) — the same job set for every row; the title says when that mattered."""
    rows: list[dict] = comp.summary()
    censored = any(r["unfinished"] > 0 for r in rows if r["scheduler"] != LOWER_BOUND)
    title = f"{comp.config}: {len(comp.seeds)} trace(s), mean ± 95% CI"
    if censored:
        title += " — some jobs unfinished at sim.max_slots: JCTs censored (counted until the run stopped)"
    notes = [REFERENCE_NOTE] if any(r["reference"] for r in rows) else []
    table = Table(title=title, caption="\n".join(notes) or None)
    jct_col = "avg JCT, censored" if censored else "avg JCT (slots)"
    baselines = [b for b in comp.paired if b in comp.runs]
    for col in ("scheduler", "placement", jct_col, "median", "p95", "makespan", "GPU util",
                "queue delay", "done", *(f"/ {b} (paired)" for b in baselines)):
        table.add_column(col, justify="left" if col in ("scheduler", "placement") else "right")
    for row in rows:
        pairs = [row["paired"].get(b) or {} for b in baselines]
        table.add_row(
            row["scheduler"] + (REFERENCE_MARK if row["reference"] else ""),
            str(row.get("placement", "")),
            f"{_num(row['censored_avg_jct'], '.2f')} ± {_num(row['censored_avg_jct_ci95'], '.2f')}",
            _num(row["median_jct"], ".2f"),
            _num(row["p95_jct"], ".2f"),
            _num(row["makespan"], ".1f"),
            _num(row["gpu_util"], ".2f"),
            _num(row["queueing_delay"], ".2f"),
            f"{row['completed']:.0f}/{row['jobs']:.0f}",
            *(f"{_num(p.get('mean'), '.3f')} ± {_num(p.get('ci95'), '.3f')}" for p in pairs),
        )
    return table


def markdown_cell(text: object) -> str:
    """``text`` as one Markdown table cell: its pipes escaped (a layout policy's placement is
    ``policy(a|b|…)``), so they do not split the row."""
    return str(text).replace("|", "\\|")


def markdown_table(rows: list[dict], baselines: list[str]) -> str:
    """The comparison as a GitHub Markdown table (what the docs' tables show): the placement each row
    decided under, avg JCT (censored) ± 95% CI,
    median, p95, queueing delay, GPU utilisation, jobs done, and the paired ratio to each baseline."""
    head = ["scheduler", "placement", "avg JCT (slots)", "median", "p95", "queue delay", "GPU util", "done",
            *(f"/ {b} (paired)" for b in baselines)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        name = str(row["scheduler"]) + (" †" if row.get("reference") else "")
        pairs = [row.get("paired", {}).get(b) or {} for b in baselines]
        jct = f"{_num(row['censored_avg_jct'], '.2f')} ± {_num(row['censored_avg_jct_ci95'], '.2f')}"
        cells = [markdown_cell(name), markdown_cell(row.get("placement", "")), jct,
                 _num(row["median_jct"], ".2f"), _num(row["p95_jct"], ".2f"),
                 _num(row["queueing_delay"], ".2f"), _num(row["gpu_util"], ".2f"),
                 f"{row['completed']:.0f}/{row['jobs']:.0f}",
                 *(f"{_num(p.get('mean'), '.3f')} ± {_num(p.get('ci95'), '.3f')}" for p in pairs)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def unfinished_warnings(comp: Comparison, max_slots: int) -> list[str]:
    """One line per scheduler whose runs left jobs unfinished at ``max_slots`` (empty: none did)."""
    lines = []
    for name, runs in comp.runs.items():
        left = [int(r.metrics["unfinished"]) for r in runs]
        if any(left):
            total = sum(int(r.metrics["jobs"]) for r in runs)
            hit = sum(1 for n in left if n)
            lines.append(
                f"warning: {name}: {sum(left)} of {total} jobs unfinished at sim.max_slots={max_slots} "
                f"in {hit} of {len(runs)} trace(s); average JCTs are censored "
                "(unfinished jobs counted until the run stopped)"
            )
    return lines


def print_table(comp: Comparison, console: Console | None = None) -> None:
    """Print the table; at least 120 columns wide so a pipe or CI log keeps one row per line."""
    if console is None:
        console = Console()
        if not console.is_terminal:
            console = Console(width=120)
    console.print(comparison_table(comp))


def plot_jct_cdf(comp: Comparison, path: str | Path) -> Path:
    """One CDF of job completion times (hours, pooled over traces) per scheduler."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, runs in comp.runs.items():
        jct = np.sort([v for r in runs for v in r.jct.values()])
        if len(jct) == 0:
            continue
        hours = jct * comp.slot_seconds / 3600.0
        ax.step(hours, np.arange(1, len(hours) + 1) / len(hours), where="post", label=name)
    ax.set_xlabel("job completion time (hours)")
    ax.set_ylabel("CDF")
    ax.set_title(f"JCT CDF — {comp.config}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_training_curve(rows: list[tuple[int, str, float]], path: str | Path, title: str,
                        labels: dict[str, str] | None = None,
                        flat: tuple[str, ...] = ()) -> Path:
    """Validation average JCT (slots) against RL update, one line per run (the DL2 paper's Fig. 10).

    ``rows`` are ``(update, run, avg_jct)``; runs named in ``flat`` (reference
    lines that do not train) are dashed; ``labels`` renames runs in the legend.
    The y axis is logarithmic when the values span more than a factor of 10.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    labels = labels or {}
    fig, ax = plt.subplots(figsize=(6, 4))
    for run in dict.fromkeys(r for _, r, _ in rows):
        pts = sorted((u, j) for u, name, j in rows if name == run)
        ax.plot([u for u, _ in pts], [j for _, j in pts], "--" if run in flat else "-",
                marker=None if run in flat else ".", label=labels.get(run, run))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    values = [j for _, _, j in rows if j > 0]
    if values and max(values) > 10 * min(values):  # e.g. RL from scratch starts 100× above DRF
        ax.set_yscale("log")
    ax.set_xlabel("RL update")
    ax.set_ylabel("validation average JCT (slots)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
