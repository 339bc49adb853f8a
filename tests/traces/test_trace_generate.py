"""Synthetic traces: exact counts, caps, determinism, error bounds, the diurnal curve."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dl2ray.config import ArrivalConfig, ConfigError, ExperimentConfig
from dl2ray.traces.generate import (
    DIURNAL_PEAK_HOUR,
    arrival_slots,
    diurnal_profile,
    generate_trace,
    hour_of_week,
    uniform_counts,
)

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def make_config(workload: dict, slot_seconds: float = 1200.0) -> ExperimentConfig:
    return ExperimentConfig.model_validate(
        {"workload": workload, "sim": {"slot_seconds": slot_seconds}, "base_dir": str(CONFIGS)}
    )


arrival_st = st.fixed_dictionaries(
    {
        "pattern": st.sampled_from(["uniform", "poisson", "diurnal"]),
        "rate": st.floats(0.05, 12.0),
        "max_per_slot": st.integers(1, 10),
        "peak": st.floats(1.4, 6.0),
        "weekend_factor": st.floats(0.05, 1.0),
    }
)
length_st = st.fixed_dictionaries(
    {
        "distribution": st.sampled_from(["fixed", "uniform", "lognormal"]),
        "low": st.floats(0.1, 1.0),
        "high": st.floats(1.0, 5.0),
        "sigma": st.floats(0.05, 2.0),
    }
)
workload_st = st.fixed_dictionaries(
    {
        "num_jobs": st.integers(1, 250),
        "arrivals": arrival_st,
        "lengths": length_st,
        "epoch_error": st.floats(0.0, 0.99),
        "types": st.one_of(st.none(), st.just(("vgg-16", "dssm"))),
    }
)


@settings(max_examples=60, deadline=None)
@given(workload=workload_st, seed=st.integers(0, 2**32 - 1), slot=st.sampled_from([600.0, 1200.0]))
def test_generated_trace_properties(check_trace, workload: dict, seed: int, slot: float) -> None:
    cfg = make_config(workload, slot)
    trace = generate_trace(cfg, seed)
    check_trace(trace, cfg.catalogue)
    assert len(trace) == workload["num_jobs"]
    per_slot = np.bincount([j.arrival_slot for j in trace])
    assert per_slot.max() <= workload["arrivals"]["max_per_slot"]
    e = workload["epoch_error"]
    ratios = np.array([j.est_epochs / j.true_epochs for j in trace])
    assert np.all(ratios >= 1 - e - 1e-12) and np.all(ratios <= 1 + e + 1e-12)
    if workload["types"] is not None:
        assert {j.job_type for j in trace} <= set(workload["types"])
    lengths = workload["lengths"]
    factors = np.array([j.true_epochs / cfg.catalogue.get(j.job_type).base_epochs for j in trace])
    if lengths["distribution"] == "fixed":
        np.testing.assert_allclose(factors, 1.0)
    else:
        assert np.all(factors >= lengths["low"] - 1e-9) and np.all(factors <= lengths["high"] + 1e-9)
    assert generate_trace(cfg, seed) == trace


def test_different_seeds_differ() -> None:
    cfg = make_config({"num_jobs": 50, "lengths": {"distribution": "uniform"}})
    assert generate_trace(cfg, 1) != generate_trace(cfg, 2)


def test_streams_are_independent() -> None:
    """Changing the length distribution leaves arrivals and types unchanged."""
    a = generate_trace(make_config({"num_jobs": 40, "lengths": {"distribution": "fixed"}}), 7)
    b = generate_trace(make_config({"num_jobs": 40, "lengths": {"distribution": "uniform"}}), 7)
    assert [(j.arrival_slot, j.job_type) for j in a] == [(j.arrival_slot, j.job_type) for j in b]
    assert [j.true_epochs for j in a] != [j.true_epochs for j in b]


def test_uniform_counts_carry_the_fraction() -> None:
    assert uniform_counts(0.5, 0, 6).tolist() == [0, 1, 0, 1, 0, 1]
    assert uniform_counts(2.5, 0, 4).tolist() == [2, 3, 2, 3]
    assert uniform_counts(0.1, 0, 30).sum() == 3  # 30 × 0.1 without float drift
    assert uniform_counts(1.0, 5, 3).tolist() == [1, 1, 1]


def test_uniform_arrivals_are_exact() -> None:
    rng = np.random.default_rng(0)
    cfg = ArrivalConfig(pattern="uniform", rate=2.0, max_per_slot=5)
    assert arrival_slots(cfg, 7, 1200.0, rng).tolist() == [0, 0, 1, 1, 2, 2, 3]
    capped = ArrivalConfig(pattern="uniform", rate=4.0, max_per_slot=3)
    assert arrival_slots(capped, 6, 1200.0, rng).tolist() == [0, 0, 0, 1, 1, 1]


@pytest.mark.parametrize("peak, weekend", [(2.0, 0.5), (1.5, 1.0), (4.0, 0.3), (20.0, 0.8)])
def test_diurnal_profile_peak_and_mean(peak: float, weekend: float) -> None:
    prof = diurnal_profile(peak, weekend)
    assert prof.shape == (168,)
    assert prof.mean() == pytest.approx(1.0, abs=1e-12)
    assert prof.max() == pytest.approx(peak, rel=1e-9)
    assert int(np.argmax(prof)) == DIURNAL_PEAK_HOUR  # Monday 14:00
    # Saturday's peak is the weekday peak × weekend_factor.
    assert prof[5 * 24 + DIURNAL_PEAK_HOUR] == pytest.approx(peak * weekend)
    assert np.all(prof > 0)


@pytest.mark.parametrize("peak, weekend", [(1.0, 0.5), (40.0, 1.0)])
def test_diurnal_profile_rejects_unreachable_peaks(peak: float, weekend: float) -> None:
    with pytest.raises(ConfigError, match=r"workload\.arrivals\.peak"):
        diurnal_profile(peak, weekend)


@pytest.mark.parametrize("slot_seconds", [3600.0, 1200.0])
def test_diurnal_arrivals_follow_the_curve(slot_seconds: float) -> None:
    """Over ~100 weeks the busiest hour sees peak × the mean rate, and the mean is ``rate``."""
    cfg = ArrivalConfig(pattern="diurnal", rate=2.0, peak=3.0, weekend_factor=0.5, max_per_slot=100)
    slots_per_week = int(168 * 3600 / slot_seconds)
    n_slots = 100 * slots_per_week
    # Draw past the horizon so that the count limit never truncates it.
    slots = arrival_slots(cfg, int(2.0 * n_slots * 1.1), slot_seconds, np.random.default_rng(3))
    assert slots[-1] >= n_slots
    counts = np.bincount(slots)[:n_slots]
    how = hour_of_week(np.arange(n_slots), slot_seconds)
    per_hour = np.bincount(how, weights=counts) / np.bincount(how)
    assert counts.mean() == pytest.approx(2.0, rel=0.03)
    # The busiest hour, averaged over the 500 weekdays, is peak × the mean. (The max
    # over the 168 noisy hour bins is biased upwards, so it is not what is checked.)
    weekday_peaks = [d * 24 + DIURNAL_PEAK_HOUR for d in range(5)]
    assert per_hour[weekday_peaks].mean() / per_hour.mean() == pytest.approx(3.0, rel=0.05)
    # Every hour of the week follows the profile: z-scores of the Poisson means.
    expected = 2.0 * diurnal_profile(3.0, 0.5)
    samples = np.bincount(how)
    z = (per_hour - expected) / np.sqrt(expected / samples)
    assert np.abs(z).max() < 4.5


def test_poisson_mean_rate() -> None:
    cfg = ArrivalConfig(pattern="poisson", rate=1.5, max_per_slot=50)
    slots = arrival_slots(cfg, 30_000, 1200.0, np.random.default_rng(11))
    assert len(slots) == 30_000
    assert len(slots) / (slots[-1] + 1) == pytest.approx(1.5, rel=0.03)
