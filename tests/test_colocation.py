"""The placement model (analytic and calibrated) by hand, and the co-location benchmark's pure parts.

Numbers are computed by hand in the comments; the one end-to-end test runs the benchmark's ``--quick``
mode in network namespaces (root only) and checks its structure and that it leaves nothing behind.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dl2ray.errors import MissingInputError
from dl2ray.measurements import load_surfaces
from dl2ray.speed import (
    ANALYTIC_PLACEMENT,
    DEFAULT_PLACEMENT_PATH,
    PlacementModel,
    SpeedModel,
    analytic_comm_time,
    analytic_iteration_time,
    fit_placement,
    layout_of,
    load_placement,
    placement_model,
    save_placement,
    spread_layout,
)

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "tests" / "bench" / "bench_colocation.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_colocation", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_colocation"] = module
    spec.loader.exec_module(module)
    return module


bench = _bench()

FULL_DUPLEX = PlacementModel("calibrated", duplex=0.0, serial=0.0)
# M = 100 MB, bw_inter = 100 MB/s, bw_intra = 400 MB/s throughout.
CONSTS = (100.0, 100.0, 400.0)


# -- the placement model by hand -----------------------------------------------------------------


def test_a_worker_and_a_ps_on_each_of_two_nodes():
    """2 PS, 2 workers, a PS + a worker per node: per phase 50 MB leave and 50 MB enter each node."""
    pairs = ((1, 1), (1, 1))
    # analytic: 2·(M/p)·[1·1 + 1·1] = 200 MB at 100 MB/s = 2 s (loopback 2·50/400 = 0.25 s)
    assert ANALYTIC_PLACEMENT.comm_time(pairs, *CONSTS) == pytest.approx(2.0)
    # full duplex: each phase max(50, 50)/100 = 0.5 s on the link, 50/400 beside it; two phases: 1 s
    assert FULL_DUPLEX.comm_time(pairs, *CONSTS) == pytest.approx(1.0)
    # duplex 0.5: (50 + 25)/100 = 0.75 s per phase
    assert PlacementModel("calibrated", 0.5, 0.0).comm_time(pairs, *CONSTS) == pytest.approx(1.5)
    # serial 1: the loopback's 0.125 s per phase adds to the link's 0.5 s
    assert PlacementModel("calibrated", 0.0, 1.0).comm_time(pairs, *CONSTS) == pytest.approx(1.25)


def test_layouts_without_mixed_nodes_cost_the_same_in_both_models():
    """Spread (only one direction per phase on every node) and one node (no link at all)."""
    spread = spread_layout(2, 2)
    # a worker node sends 2 shards of 50 MB per phase: 100/100 = 1 s, twice
    assert ANALYTIC_PLACEMENT.comm_time(spread, *CONSTS) == pytest.approx(2.0)
    assert FULL_DUPLEX.comm_time(spread, *CONSTS) == pytest.approx(2.0)
    one = ((2, 2),)
    # 4 pairs × 50 MB per phase over the loopback: 200/400 = 0.5 s, twice
    assert ANALYTIC_PLACEMENT.comm_time(one, *CONSTS) == pytest.approx(1.0)
    assert FULL_DUPLEX.comm_time(one, *CONSTS) == pytest.approx(1.0)


def test_placement_factor_by_hand(testbed):
    """resnet-50 (M = 102.2, bw 91.875 / 306.5, compute 0.449) at 2 PS × 2 workers, a pair per node."""
    jt = testbed.catalogue.get("resnet-50")
    pairs = ((1, 1), (1, 1))
    t_spread = 0.449 + 2 * 102.2 / 91.875
    assert ANALYTIC_PLACEMENT.factor(jt, pairs) == pytest.approx(1.0)  # 2·(51.1 + 51.1)/91.875: the same
    assert FULL_DUPLEX.factor(jt, pairs) == pytest.approx(t_spread / (0.449 + 2 * 51.1 / 91.875))


def test_calibrated_form_with_half_duplex_and_no_serial_part_is_the_analytic_model():
    half = PlacementModel("calibrated", duplex=1.0, serial=0.0)
    rng = np.random.default_rng(3)
    for _ in range(200):
        nodes = int(rng.integers(1, 5))
        w_nodes = tuple(int(x) for x in rng.integers(0, nodes, int(rng.integers(1, 6))))
        p_nodes = tuple(int(x) for x in rng.integers(0, nodes, int(rng.integers(1, 4))))
        layout = layout_of(w_nodes, p_nodes)
        consts = (float(rng.uniform(1, 500)), float(rng.uniform(5, 300)), float(rng.uniform(5, 1000)))
        assert half.comm_time(layout, *consts) == pytest.approx(analytic_comm_time(layout, *consts))


def test_full_duplex_never_costs_more_than_half_duplex():
    for w, p in itertools.product(range(1, 5), range(1, 4)):
        for wn in itertools.product(range(3), repeat=w):
            for pn in itertools.product(range(3), repeat=p):
                lay = layout_of(wn, pn)
                full, half = FULL_DUPLEX.comm_time(lay, *CONSTS), ANALYTIC_PLACEMENT.comm_time(lay, *CONSTS)
                assert full <= half + 1e-12


@pytest.mark.parametrize("model", [ANALYTIC_PLACEMENT, PlacementModel("calibrated", 0.2, 0.3)])
def test_node_cost_is_the_per_node_term_of_the_layout_cost(model):
    """What references.best_layout_time's search relies on: comm = max over nodes of node_comm_time."""
    layout = ((2, 1), (1, 0), (0, 1))
    per_node = [model.node_comm_time(wn, pn, 3, 2, *CONSTS) for wn, pn in layout]
    assert model.comm_time(layout, *CONSTS) == max(per_node)


def test_analytic_placement_keeps_the_old_speeds_exactly(testbed):
    surfaces = load_surfaces(testbed.surfaces_dir)
    m = SpeedModel(testbed.catalogue, surfaces, placement=ANALYTIC_PLACEMENT)
    for t, jt in enumerate(testbed.catalogue.types):
        for layout in (((1, 1), (1, 1)), ((2, 1),), ((1, 0), (1, 1), (0, 1))):
            w, p = sum(n[0] for n in layout), sum(n[1] for n in layout)
            old = surfaces[jt.name](p, w) * analytic_iteration_time(jt, spread_layout(w, p)) \
                / analytic_iteration_time(jt, layout)
            assert m.batches_per_second(t, layout) == old  # bit for bit
            assert m.compute_fraction(t, layout) == jt.compute_s / analytic_iteration_time(jt, layout)
    alone = SpeedModel(testbed.catalogue, None, model="analytic", placement=ANALYTIC_PLACEMENT)
    jt = testbed.catalogue.types[0]
    assert alone.batches_per_second(0, ((1, 1), (1, 1))) == 2 / analytic_iteration_time(jt, ((1, 1), (1, 1)))


def test_the_default_speed_model_reads_the_shipped_calibration(testbed, realistic):
    m = SpeedModel(testbed.catalogue, load_surfaces(testbed.surfaces_dir))
    assert m.placement == load_placement(DEFAULT_PLACEMENT_PATH)
    assert m.placement.kind == "calibrated"
    assert realistic.speed.placement_model == "calibrated"
    assert realistic.speed.placement_calibration is None  # the shipped file, wherever the config lies
    assert testbed.speed.placement_model == "analytic"  # the clairvoyant world keeps its recorded factor
    assert placement_model("calibrated") == load_placement(DEFAULT_PLACEMENT_PATH)
    assert placement_model("analytic") is ANALYTIC_PLACEMENT
    i = testbed.catalogue.index("resnet-50")
    pairs = ((1, 1), (1, 1))
    # co-locating a PS with a worker now pays off (the measurement); the analytic model saw no gain
    assert m.batches_per_second(i, pairs) > m.batches_per_second(i, spread_layout(2, 2))


def test_calibration_round_trip_and_missing_file(tmp_path):
    model = PlacementModel("calibrated", 0.125, 0.25)
    path = save_placement(model, tmp_path / "p.json", source="cmd", fit={"rows": 0})
    assert load_placement(path) == model
    assert json.loads(path.read_text())["source"] == "cmd"
    with pytest.raises(MissingInputError, match="bench_colocation"):
        load_placement(tmp_path / "none.json")
    with pytest.raises(ValueError, match="lie in"):
        PlacementModel("calibrated", 1.5, 0.0)


def _rows(model: PlacementModel) -> list[dict]:
    """Benchmark-like rows whose measured factors are exactly ``model``'s."""
    rows = []
    for ps, w in ((1, 2), (2, 2), (2, 4)):
        for plan in bench.plan_layouts(ps, w):
            for compute_s, inter, intra in ((0.1, 90.0, 300.0), (0.3, 60.0, 160.0), (0.2, 90.0, 65.0)):
                f = bench.placement_factor(model, plan.layout, compute_s, 20.0, inter, intra)
                rows.append({"layout_name": plan.name, "layout": [list(n) for n in plan.layout],
                             "compute_s": compute_s, "model_mb": 20.0, "bw_inter_mbps": inter,
                             "bw_intra_mbps": intra, "measured_factor": f})
    return rows


def test_fit_recovers_the_parameters_that_made_the_factors():
    truth = PlacementModel("calibrated", 0.2, 0.4)
    fitted, report = fit_placement(_rows(truth))
    assert fitted.duplex == pytest.approx(0.2, abs=1e-4)
    assert fitted.serial == pytest.approx(0.4, abs=1e-4)
    assert report["calibrated"]["rms_log_ratio"] == pytest.approx(0.0, abs=1e-4)
    assert report["analytic"]["rms_log_ratio"] > 0.01


def test_shipped_calibration_is_the_fit_of_the_shipped_measurements():
    """configs/speed/placement.json is what its recorded command computes from the recorded benchmark run."""
    doc = json.loads(DEFAULT_PLACEMENT_PATH.read_text())
    src = doc["source"].split()
    assert src[:2] == ["tests/bench/bench_colocation.py", "--fit"]
    rows = json.loads((ROOT / src[2]).read_text())["results"]
    fitted, report = fit_placement(rows)
    assert (round(fitted.duplex, 4), round(fitted.serial, 4)) == (doc["duplex"], doc["serial"])
    assert report == doc["fit"]
    # the structural claim behind it: both directions of a node's link are not one shared rate
    assert fitted.duplex < 0.5


# -- the benchmark's planning (no root needed) ---------------------------------------------------


def test_layouts_per_shape():
    shapes = ((1, 1), (1, 2), (2, 2), (2, 4))
    names = {s: [(p.name, p.layout) for p in bench.plan_layouts(*s)] for s in shapes}
    assert names[(1, 1)] == [("spread", ((0, 1), (1, 0))), ("one-node", ((1, 1),))]
    assert names[(1, 2)] == [("spread", ((0, 1), (1, 0), (1, 0))), ("one-node", ((2, 1),)),
                             ("ps+worker", ((1, 0), (1, 1))), ("split", ((0, 1), (2, 0)))]
    assert names[(2, 2)] == [("spread", ((0, 1), (0, 1), (1, 0), (1, 0))), ("one-node", ((2, 2),)),
                             ("ps+worker", ((1, 1), (1, 1))), ("split", ((0, 2), (2, 0)))]
    assert [n for n, _ in names[(2, 4)]] == ["spread", "one-node", "ps+worker", "even", "split"]
    assert dict(names[(2, 4)])["even"] == ((2, 1), (2, 1))
    assert dict(names[(2, 4)])["ps+worker"] == ((1, 0), (1, 0), (1, 1), (1, 1))
    for shape, plans in names.items():
        assert len({lay for _, lay in plans}) == len(plans)  # distinct
        for _, lay in plans:
            assert (sum(n[1] for n in lay), sum(n[0] for n in lay)) == shape
    with pytest.raises(ValueError):
        bench.plan_layouts(0, 1)


def test_plan_nodes_and_compute_plan():
    spread = bench.plan_layouts(2, 4)[0]
    assert spread.ps_nodes == (0, 1) and spread.worker_nodes == (2, 3, 4, 5) and spread.nodes == 6
    assert bench.compute_plan(2, 4).layout == ((4, 2),)


def test_topology_commands():
    topo = bench.Topology("dlco42", 2, 91.875)
    cmds = [" ".join(c) for c in bench.setup_commands(topo)]
    assert cmds[:4] == ["ip netns add dlco42-sw", "ip netns add dlco42-ctl", "ip netns add dlco42-n0",
                        "ip netns add dlco42-n1"]
    # every node link limited in both directions to 91.875 MB/s = 735 mbit; the control link is not
    rate = "rate 735.000mbit"
    assert [c for c in cmds if "tbf" in c] == [
        f"tc -n dlco42-n0 qdisc replace dev eth0 root tbf {rate} burst 64kb latency 20ms",
        f"tc -n dlco42-sw qdisc replace dev n0 root tbf {rate} burst 64kb latency 20ms",
        f"tc -n dlco42-n1 qdisc replace dev eth0 root tbf {rate} burst 64kb latency 20ms",
        f"tc -n dlco42-sw qdisc replace dev n1 root tbf {rate} burst 64kb latency 20ms",
    ]
    assert "ip -n dlco42-n1 addr add 10.213.0.2/24 dev eth0" in cmds
    assert "ip -n dlco42-ctl addr add 10.213.0.254/24 dev eth0" in cmds
    assert all(not c.startswith("ip link add") or " netns " in c for c in cmds)  # nothing in the host's ns
    lo = [" ".join(c) for c in bench.loopback_commands(topo, 306.5)]
    assert lo[1] == "tc -n dlco42-n1 qdisc replace dev lo root tbf rate 2452.000mbit burst 128kb latency 20ms"
    unlimit = [" ".join(c) for c in bench.loopback_commands(topo, None)]
    assert unlimit == ["tc -n dlco42-n0 qdisc del dev lo root", "tc -n dlco42-n1 qdisc del dev lo root"]


def test_only_namespaces_of_dead_runs_are_stale():
    names = ["dlco12-n0", "dlco12-sw", "dlco99-n0", "other-ns", "dlcoX-n0"]
    assert bench.stale_namespaces(names, alive=lambda pid: pid == 99) == ["dlco12-n0", "dlco12-sw"]


def test_window_rates_by_hand():
    # versions seen at 0 s: 10, 1 s: 12, 2 s: 14, 4 s: 16 -> two windows of 3 versions each:
    # 10 -> 13 (first seen at or past 13: 14 at 2 s) and 13 -> 16: (14 at 2 s) -> (16 at 4 s)
    seen = [(0.0, 10), (1.0, 12), (2.0, 14), (4.0, 16)]
    assert bench.window_rates(seen, 2) == pytest.approx([4 / 2, 2 / 2])


def test_compute_seconds_by_hand():
    # 2 PS × 2 workers on one node, M = 100: 2·50·2·2 = 400 MB over the loopback per iteration
    assert bench.intra_bytes_mb(((2, 2),), 100.0) == pytest.approx(400.0)
    # at 500 MB/s the loopback takes 0.8 s of a 1.0 s iteration: 0.2 s of compute
    assert bench.compute_seconds(1.0, ((2, 2),), 100.0, 500.0) == pytest.approx(0.2)
    assert bench.compute_seconds(0.7, ((2, 2),), 100.0, 500.0) == pytest.approx(0.035)  # kept at 5 %


def test_evaluate_sets_factors_and_ratios():
    row = {"layout_name": "ps+worker", "layout": [[1, 1], [1, 1]], "compute_s": 1.0, "model_mb": 100.0,
           "bw_inter_mbps": 100.0, "bw_intra_mbps": 400.0, "measured_factor": 1.2}
    out = bench.evaluate([row], FULL_DUPLEX)[0]
    # analytic: (1 + 2) / (1 + 2) = 1; full duplex: (1 + 2) / (1 + 1) = 1.5
    assert out["analytic_factor"] == 1.0 and out["ratio"] == 1.2
    assert out["calibrated_factor"] == 1.5 and out["calibrated_ratio"] == 0.8


# -- end to end ----------------------------------------------------------------------------------


def _namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


@pytest.mark.slow
def test_quick_benchmark_runs_and_leaves_no_namespace():
    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces, tc)")
    if shutil.which("ip") is None or shutil.which("tc") is None:
        pytest.skip("needs the ip and tc commands")
    probe = subprocess.run(["ip", "netns", "add", "dlcotest-probe"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"ip netns does not work here: {probe.stderr.decode().strip()}")
    subprocess.run(["ip", "netns", "del", "dlcotest-probe"], capture_output=True)
    proc = subprocess.run([sys.executable, str(BENCH), "--quick", "--json"], capture_output=True, text=True,
                          timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)  # exactly one JSON object
    assert doc["namespaces_left"] == []
    assert not [n for n in _namespaces() if n.startswith("dlco") and n.split("-")[0][4:].isdigit()
                and not Path(f"/proc/{n.split('-')[0][4:]}").exists()]
    rows = doc["results"]
    assert [r["layout_name"] for r in rows] == ["spread", "one-node", "ps+worker", "split"]
    assert all(r["ps"] == 1 and r["workers"] == 2 for r in rows)
    assert rows[0]["measured_factor"] == 1.0 and rows[0]["analytic_factor"] == 1.0
    for r in rows:
        assert r["iterations_per_s"] > 0 and r["compute_s"] > 0
        assert r["ratio"] == pytest.approx(r["measured_factor"] / r["analytic_factor"], rel=1e-3)
        assert all(len(run["loadavg"]) == 2 for run in r["runs"])
    probes = {"link", "loopback", "loopback_compute_run", "loopback_unlimited"}
    assert set(doc["rates"][0]["probe_mbps"]) == probes
    assert "loadavg" in doc["machine"]
