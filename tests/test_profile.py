"""The operator's profile: measurements by hand, fits, the file, the CLI, and what reads it."""

from __future__ import annotations

import json

import numpy as np
import pytest
from support import CONFIGS, run_cli, small_config

from dl2ray.knowledge.profile import (
    DEFAULT_POINTS,
    ProfileError,
    config_profile,
    fit_profile,
    load_profile,
    measure,
    save_profile,
)
from dl2ray.measurements import Measurement, optimus_speed
from dl2ray.speed import spread_layout
from dl2ray.world import build_simulator, speed_model


def test_a_noiseless_profile_of_identical_jobs_measures_the_true_surface(testbed):
    speed = speed_model(testbed)
    got = measure(speed, seed=0, deviation=0.0, noise=0.0, points=((1, 1), (2, 4)))
    t = testbed.catalogue.index("vgg-16")
    assert [(m.ps, m.workers) for m in got["vgg-16"]] == [(1, 1), (2, 4)]
    assert got["vgg-16"][1].speed == pytest.approx(speed.batches_per_second(t, spread_layout(4, 2)))


def test_measurements_carry_the_profiling_jobs_deviation_and_noise(testbed):
    speed = speed_model(testbed)
    clean = measure(speed, 0, 0.0, 0.0)
    a, b = measure(speed, 0, 0.2, 0.05), measure(speed, 0, 0.2, 0.05)
    assert a == b  # seeded
    ratios = [m.speed / c.speed for m, c in zip(a["resnet-50"], clean["resnet-50"], strict=True)]
    assert all(0.8 / 1.2 * 0.95 <= r <= 1.2 / 0.8 * 1.05 for r in ratios) and len(set(ratios)) > 1
    assert measure(speed, 1, 0.2, 0.05) != a


def test_the_optimus_fit_recovers_a_surface_of_its_own_form(testbed):
    jt = testbed.catalogue.get("wlm")
    theta = np.array([0.0, 0.3, 0.2, 0.05, 0.01])
    pts = [Measurement("wlm", jt.batch_size, p, w, float(optimus_speed(theta, p, w, jt.batch_size)[0]))
           for p, w in DEFAULT_POINTS]
    prof = fit_profile(testbed.catalogue, {t.name: pts for t in testbed.catalogue.types}, "optimus", {})
    for p, w in ((3, 5), (12, 12), (16, 1)):
        want = float(optimus_speed(theta, p, w, jt.batch_size)[0])
        assert prof.types["wlm"].batches_per_second(p, w) == pytest.approx(want, rel=1e-6)
    assert prof.types["wlm"].speed.shape == (jt.max_ps, jt.max_workers)


def test_profile_file_round_trips_and_costs_are_seconds_per_epoch(tmp_path, testbed):
    measured = measure(speed_model(testbed), 3, 0.1, 0.0)
    prof = fit_profile(testbed.catalogue, measured, "interpolate", {"x": 1})
    path = save_profile(prof, tmp_path / "p.json")
    back = load_profile(path)
    assert back.fit == "interpolate" and back.source == {"x": 1}
    cost = back.seconds_per_epoch(testbed.catalogue)
    t = testbed.catalogue.index("dssm")
    jt = testbed.catalogue.types[t]
    assert cost(t, 2, 2) == pytest.approx(jt.batches_per_epoch / back.types["dssm"].batches_per_second(2, 2),
                                          rel=1e-6)
    assert cost(t, 0, 3) == float("inf")


@pytest.mark.parametrize("doc, field", [
    ({"schema_version": 9}, "schema_version"),
    ({"schema_version": 1, "types": {}}, "types"),
    ({"schema_version": 1, "types": {"wlm": {"points": [], "speed": [[1.0, -2.0]]}}}, "types.wlm.speed"),
    ({"schema_version": 1, "types": {"wlm": {"speed": [[1.0]]}}}, "types.wlm"),
])
def test_a_malformed_profile_is_refused_naming_the_field(tmp_path, doc, field):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ProfileError, match=field.replace(".", r"\.")):
        load_profile(path)


def test_a_config_without_profile_or_with_a_partial_one_is_refused(tmp_path, testbed):
    with pytest.raises(ProfileError, match="profile: the config names no operator profile"):
        config_profile(testbed)
    prof = fit_profile(testbed.catalogue, measure(speed_model(testbed), 0, 0.0, 0.0), "optimus", {})
    del prof.types["wlm"]
    save_profile(prof, tmp_path / "partial.json")
    cfg = small_config(profile=str(tmp_path / "partial.json"))
    with pytest.raises(ProfileError, match="wlm"):
        config_profile(cfg)


def test_the_operator_world_runs_on_the_profile_not_the_truth(realistic):
    truth, operator = build_simulator(realistic), build_simulator(realistic, world="operator")
    t = realistic.catalogue.index("resnet-50")
    prof = config_profile(realistic).types["resnet-50"]
    assert operator.speed.nominal_batches_per_second(t, 3, 5) == pytest.approx(prof.batches_per_second(3, 5))
    assert truth.speed.nominal_batches_per_second(t, 3, 5) != pytest.approx(prof.batches_per_second(3, 5))


def test_cli_profile_writes_the_file_and_refuses_bad_points(tmp_path, capsys):
    out = tmp_path / "prof.json"
    code, stdout, _ = run_cli(capsys, "profile", "--config", str(CONFIGS / "testbed.yaml"), "--out", str(out),
                              "--points", "1x1,2x2,2x4,4x4", "--json")
    assert code == 0 and load_profile(out).types["vgg-16"].points[-1][:2] == (4, 4)
    assert json.loads(stdout)["points"] == 4
    code, _, err = run_cli(capsys, "profile", "--config", str(CONFIGS / "testbed.yaml"), "--out", str(out),
                           "--points", "1x1,2by4")
    assert code == 2 and "--points" in err and "2by4" in err and "Traceback" not in err


def test_the_shipped_profile_is_what_the_command_writes(tmp_path, capsys):
    """configs/profiles/testbed.json is reproducible from the command recorded in it."""
    shipped = load_profile(CONFIGS / "profiles" / "testbed.json")
    out = tmp_path / "again.json"
    code, _, _ = run_cli(capsys, "profile", "--config", str(CONFIGS / "testbed.yaml"), "--out", str(out),
                         "--seed", str(shipped.source["seed"]), "--fit", shipped.fit, "--json")
    assert code == 0
    again = load_profile(out)
    for name, tp in shipped.types.items():
        np.testing.assert_allclose(again.types[name].speed, tp.speed, atol=1e-4)
