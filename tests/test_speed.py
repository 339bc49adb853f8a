"""Speed models: the fit on the real measurements, the shipped surfaces, the analytic model."""

from __future__ import annotations

import json

import numpy as np
import pytest
from support import CONFIGS

from dl2ray import measurements
from dl2ray.measurements import fit_optimus_speed, optimus_speed
from dl2ray.speed import SpeedModel, analytic_iteration_time, layout_of, spread_layout


def test_fit_on_real_measurements(measurements_file):
    ms = measurements.parse_measurements(measurements_file)
    assert len(ms) == 803 - 8  # eight all-zero records are missing, not zero
    surfaces = measurements.fit_surfaces(ms)
    assert set(surfaces) == {
        "resnet-50", "vgg-16", "resnext-110", "inception-bn", "seq2seq",
        "cnn-text-classification", "dssm", "wlm",
    }
    for name, surf in surfaces.items():
        pts = [m for m in ms if m.model == name]
        assert measurements.surface_rel_error(surf, pts) < 0.1, name
        assert (np.diff(surf.speed, axis=0) >= 0).all(), f"{name}: not monotone in PS"
        assert (surf.speed > 0).all()
    opt = measurements.fit_optimus_all(ms)
    for name, fit in opt.items():
        assert min(fit["theta"]) >= 0
        assert fit["mean_rel_error"] > measurements.surface_rel_error(
            surfaces[name], [m for m in ms if m.model == name]
        )


def test_shipped_surfaces_are_what_fit_speed_derives(measurements_file):
    fresh = measurements.fit_surfaces(measurements.parse_measurements(measurements_file))
    shipped = measurements.load_surfaces(CONFIGS / "speed")
    for name, surf in fresh.items():
        np.testing.assert_allclose(shipped[name].speed, surf.speed, atol=1e-3)


def test_malformed_measurement_line_is_named(tmp_path):
    path = tmp_path / "m.txt"
    path.write_text("('resnet-50', 'dist_sync', 32, 1, 1, [15.7], [1.9], [0.5])\n(oops\n")
    with pytest.raises(ValueError, match=r"m\.txt:2: malformed"):
        measurements.parse_measurements(path)


def test_optimus_nnls_recovers_its_own_form():
    theta = np.array([0.001, 0.05, 0.02, 0.003, 0.001])
    ps, w = np.meshgrid(np.arange(1, 6), np.arange(1, 6))
    ps, w = ps.ravel(), w.ravel()
    batch = np.full_like(ps, 32)
    s = optimus_speed(theta, ps, w, batch)
    fitted = fit_optimus_speed(ps, w, batch, s)
    # With a fixed per-worker batch, M/w is constant: θ0 and θ1 are only
    # identified together, the speeds they predict exactly.
    assert (fitted >= 0).all()
    np.testing.assert_allclose(fitted[2:], theta[2:], rtol=1e-6)
    np.testing.assert_allclose(optimus_speed(fitted, ps, w, batch), s, rtol=1e-6)


def test_analytic_model_by_hand(testbed):
    jt = testbed.catalogue.get("resnet-50")
    # 1 worker, 1 PS on different nodes: 2·M bytes cross one link.
    assert analytic_iteration_time(jt, spread_layout(1, 1)) == pytest.approx(
        0.449 + 2 * 102.2 / 91.875
    )
    # Same node: intra-node bandwidth only.
    assert analytic_iteration_time(jt, layout_of((0,), (0,))) == pytest.approx(
        0.449 + 2 * 102.2 / 306.5
    )


def test_placement_factor_favours_colocation(testbed, speed_model: SpeedModel):
    i = testbed.catalogue.index("resnet-50")
    spread = speed_model.batches_per_second(i, spread_layout(2, 2))
    together = speed_model.batches_per_second(i, layout_of((0, 0), (0, 0)))
    assert spread == pytest.approx(testbed.catalogue and speed_model.surfaces["resnet-50"](2, 2))
    assert together > spread


def test_analytic_model_needs_no_surfaces(testbed):
    m = SpeedModel(testbed.catalogue, None, model="analytic")
    assert m.epochs_per_second(0, spread_layout(1, 1)) > 0
    with pytest.raises(ValueError, match="no measured speed surface"):
        SpeedModel(testbed.catalogue, {}, model="measured")


def test_surfaces_file_schema_version_is_checked(tmp_path):
    (tmp_path / "surfaces.json").write_text(json.dumps({"schema_version": 99, "models": {}}))
    with pytest.raises(ValueError, match="schema_version"):
        measurements.load_surfaces(tmp_path)


def test_a_slower_network_slows_communication_heavy_layouts_most_and_leaves_compute_alone(testbed):
    """``speed.bandwidth_scale`` (issue 37's shift): 1 changes nothing; 0.5 slows a job by its
    communication share, so the spread layout (all traffic cross-node) loses more than a co-located one and
    a communication-heavy type more than a compute-heavy one; the compute fraction φ falls."""
    from dl2ray.world import load_surfaces

    surfaces = load_surfaces(testbed.surfaces_dir)
    same = SpeedModel(testbed.catalogue, surfaces)
    assert SpeedModel(testbed.catalogue, surfaces, bandwidth_scale=1.0).network_types == same.network_types
    slow = SpeedModel(testbed.catalogue, surfaces, bandwidth_scale=0.5)
    spread, packed = spread_layout(2, 2), ((2, 2),)
    losses = []
    for t in range(len(testbed.catalogue)):
        loss_spread = slow.batches_per_second(t, spread) / same.batches_per_second(t, spread)
        loss_packed = slow.batches_per_second(t, packed) / same.batches_per_second(t, packed)
        assert 0 < loss_spread < 1 and loss_spread <= loss_packed + 1e-12 and loss_packed <= 1 + 1e-12
        assert slow.compute_fraction(t, spread) < same.compute_fraction(t, spread)
        losses.append((1 - same.compute_fraction(t, spread), loss_spread))
    losses.sort()
    assert losses[-1][1] < losses[0][1]  # the most communication-bound type loses the most


def test_faster_accelerators_speed_compute_bound_layouts_most_and_only_the_types_named(testbed):
    """``speed.compute_scale`` (issue 37's shift, new hardware): 0.5 halves each iteration's compute time,
    so a job on any layout speeds up by that layout's compute share φ, ``1 / (1 − φ/2)`` — most where it
    communicates least — and φ falls (communication weighs more); a mapping changes only the types it
    names."""
    from dl2ray.world import load_surfaces

    surfaces = load_surfaces(testbed.surfaces_dir)
    same = SpeedModel(testbed.catalogue, surfaces)
    fast = SpeedModel(testbed.catalogue, surfaces, compute_scale=0.5)
    spread, packed = spread_layout(2, 2), ((2, 2),)
    for t, jt in enumerate(testbed.catalogue.types):
        assert fast.network_types[t].compute_s == pytest.approx(0.5 * jt.compute_s)
        for layout in (spread, packed):
            gain = fast.batches_per_second(t, layout) / same.batches_per_second(t, layout)
            phi = same.compute_fraction(t, layout)
            assert 1 < gain < 2 and gain == pytest.approx(1 / (1 - 0.5 * phi))  # t / (t − compute / 2)
            assert fast.compute_fraction(t, layout) < phi
    one = testbed.catalogue.names[0]
    only = SpeedModel(testbed.catalogue, surfaces, compute_scale={one: 0.5})
    assert only.batches_per_second(0, spread) == pytest.approx(fast.batches_per_second(0, spread))
    assert all(only.batches_per_second(t, spread) == same.batches_per_second(t, spread)
               for t in range(1, len(testbed.catalogue)))
    with pytest.raises(ValueError, match="unknown job types"):
        SpeedModel(testbed.catalogue, surfaces, compute_scale={"no-such-model": 0.5})


def test_bandwidth_scale_is_checked_where_it_is_given():
    from pydantic import ValidationError

    from dl2ray.config import SpeedConfig

    with pytest.raises(ValidationError, match="bandwidth_scale"):
        SpeedConfig(bandwidth_scale=0)
    with pytest.raises(ValidationError, match="bandwidth_scale"):
        SpeedConfig(bandwidth_scale=0.5, placement_aware=False)
    assert SpeedConfig(bandwidth_scale=0.5).bandwidth_scale == 0.5
    with pytest.raises(ValidationError, match="compute_scale"):
        SpeedConfig(compute_scale={"resnet-50": 0})
    with pytest.raises(ValidationError, match="compute_scale"):
        SpeedConfig(compute_scale=0.5, placement_aware=False)
    assert SpeedConfig(compute_scale={"resnet-50": 0.5}).compute_key == (("resnet-50", 0.5),)
