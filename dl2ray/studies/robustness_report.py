"""The robustness report: Markdown tables and matplotlib plots of :mod:`dl2ray.studies.robustness`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dl2ray.evaluation.comparison import Comparison
from dl2ray.studies.robustness import REFERENCE, SWEEPS, Point, degradation

TITLES = {
    "epoch_error": "declared-epoch error e (declared = true × U(1−e, 1+e))",
    "job_deviation": "job-to-job speed deviation d (compute and communication time × U(1−d, 1+d))",
    "interference": "co-location interference s (slowdown of a job on a node full of others)",
}


def _fmt(x: Any, digits: int = 2) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def study_table(points: Sequence[Point], study: str, schedulers: Sequence[str]) -> str:
    """Markdown: per scheduler (rows) and value (columns), avg JCT and the paired ratio to the reference."""
    pts = sorted((p for p in points if p.study == study), key=lambda p: p.value)
    head = "| scheduler | " + " | ".join(f"{study} = {p.value:g}" for p in pts) + " | degradation |"
    lines = [head, "|" + "---|" * (len(pts) + 2)]
    for name in [*schedulers, REFERENCE, "lower-bound"]:
        if name not in pts[0].jct:
            continue
        cells = []
        for p in pts:
            r = p.vs_reference.get(name) or {}
            cells.append(f"{_fmt(p.jct[name])} ({_fmt(r.get('mean'), 3)} ± {_fmt(r.get('ci95'), 3)})")
        deg = degradation(pts, study, name) if name not in (REFERENCE, "lower-bound") else float("nan")
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {_fmt(deg, 3)} |")
    return "\n".join(lines)


def plot_study(points: Sequence[Point], study: str, schedulers: Sequence[str], path: Path) -> Path:
    """JCT / reference (paired mean ± 95 % CI) against the study's value, one line per scheduler."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = sorted((p for p in points if p.study == study), key=lambda p: p.value)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name in schedulers:
        ys = [p.vs_reference[name]["mean"] for p in pts]
        es = [p.vs_reference[name]["ci95"] for p in pts]
        style: dict[str, Any] = {"linewidth": 2.5} if name.startswith("dl2") else {"linewidth": 1.2}
        ax.errorbar([p.value for p in pts], ys, yerr=es, marker="o", capsize=3, label=name, **style)
    ax.axhline(1.0, color="grey", linestyle=":", label=f"{REFERENCE} (reference)")
    ax.set_xlabel(TITLES[study])
    ax.set_ylabel(f"avg JCT / {REFERENCE} (paired)")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def unseen_table(comp: Comparison) -> str:
    rows: list[dict[str, Any]] = comp.summary()
    lines = ["| scheduler | avg JCT | / planner-truth (paired) | / drf (paired) |", "|---|---|---|---|"]
    for r in rows:
        pr, pd = r["paired"].get(REFERENCE) or {}, r["paired"].get("drf") or {}
        name = f"{r['scheduler']}{' †' if r['reference'] else ''}"
        jct = f"{_fmt(r['censored_avg_jct'])} ± {_fmt(r['censored_avg_jct_ci95'])}"
        lines.append(f"| {name} | {jct} | {_fmt(pr.get('mean'), 3)} ± {_fmt(pr.get('ci95'), 3)} | "
                     f"{_fmt(pd.get('mean'), 3)} ± {_fmt(pd.get('ci95'), 3)} |")
    return "\n".join(lines)


def write_report(out: Path, img: Path, points: Sequence[Point], schedulers: Sequence[str],
                 unseen: Comparison | None, header: str) -> Path:
    """``out`` (markdown) with one section per study (table + plot in ``img``) and the unseen-types table."""
    parts = [header]
    for study in SWEEPS:
        if not any(p.study == study for p in points):
            continue
        png = plot_study(points, study, schedulers, img / f"robustness-{study.replace('_', '-')}.png")
        rel = Path("img") / png.name if img.parent == out.parent else png
        parts += [f"## {TITLES[study]}", "",
                  "avg JCT (slots) and, in brackets, avg JCT / planner-truth on the same traces (paired mean "
                  "± 95 % CI); degradation = that ratio at the largest value minus at the smallest.", "",
                  study_table(points, study, schedulers), "", f"![{study}]({rel})", ""]
    if unseen is not None:
        parts += ["## Job types never seen in training", "", unseen_table(unseen), ""]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(parts) + "\n", encoding="utf-8")
    return out
