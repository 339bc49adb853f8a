"""The DL2 paper's robustness experiments, on every deployable scheduler and the shipped DL2 policy.

Four studies, each a sweep of one part of the information model with the others at the config's
values (``dl2ray experiment robustness`` runs them and writes the report):

- ``epoch_error`` (the paper's Fig. 14): declared epochs = true × U(1 - e, 1 + e), e from 0 to 0.5;
- ``job_deviation`` (Fig. 13): every job's compute and communication time × U(1 - d, 1 + d), d from 0
  to 0.5;
- ``interference``: a job whose busiest node is full of other jobs' tasks runs s slower, s from 0 to
  0.3;
- unseen job types (the paper's generality study, §6.4): a policy trained without two of the eight
  types against the shipped one, on traces of all eight.

At every point the cluster is *profiled again* (``dl2ray profile`` with the same seed and settings): the
operator measures the cluster it has, so a larger job deviation also makes the profile worse. The DL2
policy is the shipped one, trained once at the config's settings: the sweep tests it where it was not
trained. Each point is one :func:`dl2ray.evaluation.comparison.compare` on the same test traces, with the
truth-informed reference ``planner-truth`` (the planner on the simulator's true type surfaces instead of
the profile; like every scheduler it sees declared epochs, and per-job deviation and interference only
through what it observes) and the lower bound. At each point a scheduler's *ratio* is its JCT over
``planner-truth``'s on the same traces (paired); its *degradation* in a study is that ratio at the
largest value minus at the smallest: how much more it loses than the truth-informed planner does.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from dl2ray.config import ExperimentConfig
from dl2ray.evaluation.comparison import LOWER_BOUND, Comparison, compare
from dl2ray.world import speed_model

REFERENCE = "planner-truth"
SWEEPS: dict[str, tuple[float, ...]] = {
    "epoch_error": (0.0, 0.1, 0.2, 0.3, 0.4, 0.5),
    "job_deviation": (0.0, 0.1, 0.2, 0.3, 0.4, 0.5),
    "interference": (0.0, 0.1, 0.2, 0.3),
}
"""Each study's values, as in the issue: epoch error 0 → 50 %, deviation 0 → 50 %, interference 0 → 30 %."""


def with_setting(cfg: ExperimentConfig, study: str, value: float) -> ExperimentConfig:
    """``cfg`` with one information-model field set (``epoch_error`` lives in ``workload``, the others in
    ``speed``)."""
    if study == "epoch_error":
        return cfg.model_copy(update={"workload": cfg.workload.model_copy(update={"epoch_error": value})})
    if study in ("job_deviation", "interference"):
        return cfg.model_copy(update={"speed": cfg.speed.model_copy(update={study: value})})
    raise ValueError(f"unknown study {study!r}; known: {sorted(SWEEPS)}")


def reprofiled(cfg: ExperimentConfig, out: Path, seed: int) -> ExperimentConfig:
    """``cfg`` with its operator profile measured again on its own world (same points, seed and fit as
    the shipped profile records), written to the file ``out``."""
    from dl2ray.knowledge.profile import DEFAULT_POINTS, config_profile, fit_profile, measure, save_profile

    shipped = config_profile(cfg)
    points = tuple(tuple(p) for p in shipped.source.get("points", DEFAULT_POINTS))
    runs = int(shipped.source.get("runs", 1))
    measured = measure(speed_model(cfg), seed, cfg.speed.job_deviation, cfg.speed.variation, points, runs)
    fit: Literal["optimus", "interpolate"] = "interpolate" if shipped.fit == "interpolate" else "optimus"
    prof = fit_profile(cfg.catalogue, measured, fit, {**shipped.source, "reprofiled_for": cfg.name})
    return cfg.model_copy(update={"profile": str(save_profile(prof, out))})


@dataclass
class Point:
    """One sweep point: the study, its value, and every scheduler's paired ratios and JCTs there."""

    study: str
    value: float
    jct: dict[str, float]
    jct_ci95: dict[str, float]
    vs_reference: dict[str, dict] = field(default_factory=dict)


def run_point(cfg: ExperimentConfig, schedulers: Sequence[str], seeds: Sequence[int], study: str,
              value: float, profile_seed: int, processes: int | None = None) -> tuple[Point, Comparison]:
    """One comparison at one setting (module docstring)."""
    with tempfile.TemporaryDirectory(prefix="dl2ray-robust-") as tmp:
        point_cfg = reprofiled(with_setting(cfg, study, value), Path(tmp) / "profile.json", profile_seed)
        names = list(dict.fromkeys([*schedulers, REFERENCE]))
        comp = compare(point_cfg, names, seeds, processes=processes, references=True, paired=(REFERENCE,))
    rows: dict[str, Any] = {str(r["scheduler"]): r for r in comp.summary()}
    return Point(study, value, {n: float(r["censored_avg_jct"]) for n, r in rows.items()},
                 {n: float(r["censored_avg_jct_ci95"]) for n, r in rows.items()},
                 {n: r["paired"].get(REFERENCE, {}) for n, r in rows.items()}), comp


def sweep(cfg: ExperimentConfig, schedulers: Sequence[str], seeds: Sequence[int], studies: Sequence[str],
          profile_seed: int, processes: int | None = None,
          on_point: Callable[[Point], None] | None = None) -> list[Point]:
    """Every point of every study in ``studies`` (keys of :data:`SWEEPS`)."""
    out = []
    for study in studies:
        for value in SWEEPS[study]:
            point, _ = run_point(cfg, schedulers, seeds, study, value, profile_seed, processes)
            out.append(point)
            if on_point:
                on_point(point)
    return out


def degradation(points: Sequence[Point], study: str, name: str) -> float:
    """Paired ratio to the reference at the study's largest value minus at its smallest."""
    pts = sorted((p for p in points if p.study == study), key=lambda p: p.value)
    return float(pts[-1].vs_reference[name]["mean"] - pts[0].vs_reference[name]["mean"])


def unseen_types(cfg: ExperimentConfig, schedulers: Sequence[str], seeds: Sequence[int],
                 processes: int | None = None) -> Comparison:
    """The generality study's comparison: every scheduler (the policy trained on all types and the one
    trained without two) on traces of all eight types, at the config's settings."""
    names = list(dict.fromkeys([*schedulers, REFERENCE]))
    return compare(cfg, names, seeds, processes=processes, references=True, paired=(REFERENCE, "drf"))


__all__ = ["LOWER_BOUND", "REFERENCE", "SWEEPS", "Point", "degradation", "reprofiled", "run_point", "sweep",
           "unseen_types", "with_setting"]
