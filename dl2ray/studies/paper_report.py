"""``docs/paper.md``-style report of :mod:`dl2ray.studies.paper`: the paper's number beside ours, plots."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from dl2ray.studies.paper import (
    PAPER,
    RL_ONLY,
    PaperResult,
    ablation_table,
    curve_summary,
    federation_quality,
    teachers_table,
    time_to_quality,
    unseen_table,
)


def _f(x: Any, digits: int = 2) -> str:
    return "–" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{digits}f}"


def _pm(spread: dict, digits: int = 3) -> str:
    return f"{_f(spread['mean'], digits)} ± {_f(spread['std'], digits)} (n={spread['n']})"


def plot_curves(r: PaperResult, out: Path) -> tuple[Path, Path]:
    """Fig. 10 against updates (``fig10.png``) and against wall-clock seconds (``fig10-wall.png``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dl2ray.evaluation.report import plot_training_curve

    first = r.settings.teachers[0]
    learned = (RL_ONLY, f"{first}@{r.settings.seeds[0]}")
    labels = {RL_ONLY: "RL only (from scratch)", learned[1]: f"SL ({first.upper()}) + online RL",
              f"sl-{first}": "SL only", first: f"{first.upper()} (teacher)", "optimus": "Optimus",
              "planner": "planner"}
    flat = tuple(n for n in labels if n not in learned)
    title = f"{r.config}: validation JCT during online RL"
    by_update = plot_training_curve(r.curve, out / "fig10.png", title, labels, flat=flat)
    fig, ax = plt.subplots(figsize=(6, 4))
    for name in learned:
        pts = sorted((sec, j) for sec, n, j in r.wall if n == name)
        ax.plot([s / 60 for s, _ in pts], [j for _, j in pts], marker=".", label=labels[name])
    for name in flat:
        level = next((j for _, n, j in r.curve if n == name), None)
        if level is not None:
            ax.axhline(level, ls="--", lw=1, color="grey" if name != first else "black", label=labels[name])
    _save(fig, ax, "wall-clock (minutes, this machine)", "validation average JCT (slots)",
          f"{r.config}: validation JCT against time", out / "fig10-wall.png")
    return by_update, out / "fig10-wall.png"


def _save(fig, ax, xlabel: str, ylabel: str, title: str, path: Path) -> Path:
    """Label, grid and legend ``ax``; write ``fig`` to ``path`` (PNG, 120 dpi) and close it."""
    import matplotlib.pyplot as plt

    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_unseen(r: PaperResult, path: Path) -> Path:
    """Fig. 15: validation JCT against updates with new types arriving (red dots), the ideal line and the
    planner's level."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first, s0 = r.settings.teachers[0], r.settings.seeds[0]
    fig, ax = plt.subplots(figsize=(6, 4))
    pts = sorted((u, j) for u, _, j in r.unseen)
    ax.plot([u for u, _ in pts], [j for _, j in pts], marker=".", label=f"types arrive over time (from "
            f"{r.unseen_counts[0]})")
    ideal = sorted((u, j) for u, name, j in r.curve if name == f"{first}@{s0}")
    ax.plot([u for u, _ in ideal], [j for _, j in ideal], marker=".",
            label="ideal (every type from the start)")
    for k in range(1, len(r.unseen_counts)):
        at = [j for u, j in pts if u == k * r.unseen_updates]
        if at:
            ax.plot([k * r.unseen_updates], at, "o", color="red",
                    label="new types arrive" if k == 1 else None)
    planner = next((j for _, n, j in r.curve if n == "planner"), None)
    if planner is not None:
        ax.axhline(planner, ls="--", lw=1, color="grey", label="planner (every type profiled)")
    return _save(fig, ax, "online RL updates", "validation average JCT (slots, every type)",
                 f"Fig. 15: unseen job types ({r.config})", path)


def fig15(r: PaperResult) -> list[str]:
    """Fig. 15's section: the unseen-types line against the ideal one at each arrival and at the end."""
    lines = ["## Fig. 15: job types the policy never saw", ""]
    if not r.unseen:
        return [*lines, "Not run (`unseen` is empty).", ""]
    counts = r.unseen_counts
    lines += [f"The {r.settings.teachers[0].upper()} student trained on the first {counts[0]} types of the "
              f"catalogue, then online RL in {len(counts)} phases of {r.unseen_updates} updates whose traces "
              f"draw from the first {', '.join(map(str, counts))} types; every point is validated on every "
              "type. The ideal line is the same teacher's SL + RL with every type from the start (Fig. 10's "
              "SL + RL run). The paper: DL2 gradually reaches the ideal line's performance.", "",
              "![unseen job types](fig15.png)", "",
              "| update | what | validation JCT | ideal | / ideal | / planner |", "|---|---|---|---|---|---|"]
    for row in unseen_table(r):
        lines.append(f"| {row['update']} | {row['what']} | {_f(row['unseen'])} | {_f(row['ideal'])} | "
                     f"{_f(row['unseen_vs_ideal'], 3)} | {_f(row['unseen_vs_planner'], 3)} |")
    return [*lines, ""]


def plot_teachers(rows: list[dict], path: Path) -> Path:
    """Fig. 16: per teacher, teacher / SL student / online RL (mean, seeds as dots) test JCT."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    width = 0.27
    for i, row in enumerate(rows):
        bars = [("teacher", row["teacher_jct"]), ("SL student", row["student_jct"]),
                ("SL + online RL", row["rl"]["mean"])]
        for k, (label, value) in enumerate(bars):
            ax.bar(i + (k - 1) * width, value, width, color=f"C{k}", label=label if i == 0 else None)
        ax.plot([i + width] * row["rl"]["n"], row["rl"]["values"], "k.", ms=4)
    ax.set_xticks(range(len(rows)), [row["teacher"].upper() for row in rows])
    ax.set_ylabel("test average JCT (slots)")
    ax.set_title("Fig. 16: other teachers (dots: training seeds)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def markdown(r: PaperResult, command: str) -> str:
    """The report (module docstring): settings, Fig. 10, 16, Table 2, Fig. 15, 18, what is not run yet."""
    s, first = r.settings, r.settings.teachers[0]
    lines = [
        "# The DL2 paper's learning experiments, online in the realistic world",
        "",
        f"Written by `{command}` on config `{r.config}`: {s.updates} updates per run, training seeds "
        f"{list(s.seeds)}, algorithm `{s.algo}` learning on its own cluster (`policy.experience: cluster`), "
        f"{s.workers} runs at a time. Validation traces (model selection, curves) {r.val_seeds}; test "
        f"traces {r.test_seeds[0]}…{r.test_seeds[-1]} ({len(r.test_seeds)}), used for nothing else. "
        f"Wall time {r.wall_s / 60:.1f} min ("
        + ", ".join(f"{k} {v / 60:.1f}" for k, v in r.stages_s.items()) + ")."
        + "".join(f" The {t.upper()} student's runs (its seeds and its control) learn with `{path}`'s policy "
                  "settings (the same cluster)." for t, path in s.teacher_configs)
        + "".join(f" The {t.upper()} student's runs (its seeds and its control) take {n} updates."
                  for t, n in s.teacher_updates),
        "",
        "## Fig. 10: SL only, RL only, SL + RL",
        "",
        "![validation JCT against updates](fig10.png) ![against wall-clock](fig10-wall.png)",
        "",
        "| line | first | best (update) | final | first below the teacher |",
        "|---|---|---|---|---|",
    ]
    for name, row in curve_summary(r).items():
        below = row["below_teacher_at"]
        lines.append(f"| {name} | {_f(row['first'])} | {_f(row['best'])} ({row['best_update']}) | "
                     f"{_f(row['final'])} | {below if below is not None else '–'} |")
    lines += ["", "The paper: RL alone takes hundreds of updates to reach DRF; SL reaches DRF's level "
              "within tens of updates, and online RL after it improves a lot (its Fig. 9: 44.1 % below "
              "DRF, 17.5 % below Optimus).", "",
              "## Fig. 16: other teachers", "", "![teachers](fig16.png)", "",
              "Test average JCT (slots); ratios are per training seed, mean ± standard deviation over "
              "seeds.", "",
              "| teacher | teacher | SL student | SL + online RL | / teacher | / student | / Optimus "
              "| / planner | zero-advantage control | beats it (every seed) |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for row in teachers_table(r):
        lines.append(f"| {row['teacher']} | {_f(row['teacher_jct'])} | {_f(row['student_jct'])} | "
                     f"{_pm(row['rl'], 2)} | {_pm(row['rl_vs_teacher'])} | {_pm(row['rl_vs_student'])} | "
                     f"{_pm(row['rl_vs_optimus'])} | {_pm(row['rl_vs_planner'])} | "
                     f"{_f(row['control_jct'])} | {'yes' if row['beats_control'] else 'no'} |")
    lines += ["", f"Optimus {_f(r.jct('optimus'))}, planner {_f(r.jct('planner'))} on the same traces. "
              f"The paper: DL2 from SRTF's student ends {PAPER['srtf_speedup'] * 100:.1f} % faster than "
              f"SRTF; from DRF's, {(1 - PAPER['vs_drf']) * 100:.1f} % below DRF.", "",
              f"## Table 2: the online learner's parts (from the {first.upper()} student, seed "
              f"{s.seeds[0]})", "",
              "| without | test JCT | slowdown (%) | the paper's (%) |", "|---|---|---|---|"]
    for row in ablation_table(r):
        note = f" ({row['note']})" if row.get("note") else ""
        lines.append(f"| {row['variant']}{note} | {_f(row['test_jct'])} | {_f(row['slowdown_pct'], 1)} | "
                     f"{_f(row['paper_pct'], 1)} |")
    lines += ["", "`zero-advantage` is the control: the same run with the policy-gradient signal "
              "shuffled away.", ""]
    lines += fig15(r)
    lines += fig18(r)
    return "\n".join(lines)


def fig18(r: PaperResult) -> list[str]:
    """Fig. 18's section: time to each validation level for 1 and N A3C agents, and the slots of its own
    experience a member needs alone and in a federation."""
    lines = ["## Fig. 18: time to quality, A3C agents and a federation's members", "",
             "The paper: with N clusters the policy converges almost N times faster. Every run starts from "
             f"the {r.settings.teachers[0].upper()} student and runs alone on this machine.", ""]
    rows = time_to_quality(r)
    if not any(row["agents"] > 1 for row in rows):
        lines += ["A3C: not run (no multi-agent trainer: the `clusters` plugin's A3C on Ray, or `--agents` "
                  "named none).", ""]
    else:
        baseline = ("the master keeps the value baseline the agents fit (`--share-baseline`, the default)"
                    if r.settings.share_baseline else
                    "each agent keeps its own value baseline (`--own-baseline`)")
        lines += ["A3C: wall-clock and updates per agent (experience per cluster) at the first validation "
                  f"at or below each level; `/ 1 agent` is per seed; {baseline}.", "",
                  "| level (validation JCT) | agents | seeds there | minutes | updates per agent "
                  "| / 1 agent |",
                  "|---|---|---|---|---|---|"]
        for row in rows:
            minutes, per_agent, ratio = (
                _pm(row[k], d) if row[k] is not None else "–"
                for k, d in (("minutes", 1), ("updates_per_agent", 1), ("vs_one", 3)))
            lines.append(f"| {row['threshold']} ({_f(row['level'])}) | {row['agents']} | "
                         f"{row['reached']}/{row['seeds']} | {minutes} | {per_agent} | {ratio} |")
        lines.append("")
    fed = federation_quality(r)
    if not any(row["members"] > 1 for row in fed):
        return [*lines, "Federation: not run (no federation runner: the `clusters` plugin, or "
                "`--federation 0`).", ""]
    lines += ["Federation: the slots of its own cluster's experience a member had at its first validation "
              "at or below each level (mean over the members that got there), and the minutes; "
              "`/ alone` is per seed, against a member learning alone.", "",
              "| level (validation JCT) | members | seeds there | slots per member | minutes | / alone |",
              "|---|---|---|---|---|---|"]
    for row in fed:
        slots, minutes, ratio = (_pm(row[k], d) if row[k] is not None else "–"
                                 for k, d in (("slots_per_member", 0), ("minutes", 1), ("vs_alone", 3)))
        lines.append(f"| {row['threshold']} ({_f(row['level'])}) | {row['members']} | "
                     f"{row['reached']}/{row['seeds']} | {slots} | {minutes} | {ratio} |")
    return [*lines, ""]


def write_report(r: PaperResult, out: Path, command: str) -> Path:
    """``OUT/paper.md`` with its plots beside it."""
    plot_curves(r, out)
    plot_teachers(teachers_table(r), out / "fig16.png")
    if r.unseen:
        plot_unseen(r, out / "fig15.png")
    path = out / "paper.md"
    path.write_text(markdown(r, command), encoding="utf-8")
    return path
