"""Every config in configs/ loads and simulates a few slots; bad configs name the field."""

from __future__ import annotations

import pytest
import yaml
from support import CONFIGS

from dl2ray.config import ConfigError, load_config
from dl2ray.schedulers.base import make_scheduler
from dl2ray.schedulers.drf import DRF
from dl2ray.workload import load_catalogue
from dl2ray.world import build_simulator

# configs/k8s/ holds Kubernetes manifests, not dl2ray configs: tests/clusters/k8s validates them
ALL_YAML = sorted(p for p in CONFIGS.rglob("*.yaml") if "k8s" not in p.relative_to(CONFIGS).parts[:-1])


def _is_catalogue(path) -> bool:
    return "types" in (yaml.safe_load(path.read_text()) or {})


@pytest.mark.parametrize("path", ALL_YAML, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_every_config_loads_and_runs_a_few_slots(path):
    if _is_catalogue(path):
        assert len(load_catalogue(path)) >= 1
        return
    if "live" in (yaml.safe_load(path.read_text()) or {}):
        # a live cluster config (clusters/ray/config.py): its experiment is simulated here; the
        # live agent runs it on Ray in tests/clusters/test_live_agent.py
        from clusters.ray.config import load_live_config

        cfg = load_live_config(path).experiment()
    elif "kubernetes" in (yaml.safe_load(path.read_text()) or {}):
        # the Kubernetes agent's config (clusters/k8s/config.py); tests/clusters/k8s runs the agent on it
        from clusters.k8s.config import load_k8s_config

        cfg = load_k8s_config(path).experiment()
    elif "members" in (yaml.safe_load(path.read_text()) or {}):
        # a federation file (clusters/federation/config.py): every simulated member's experiment runs here;
        # tests/clusters/test_federation.py runs members on Ray
        from clusters.federation.config import load_federation, member_config

        fed = load_federation(path)
        for i, m in enumerate(fed.members):
            if m.backend.kind == "sim":
                _run_a_few_slots(member_config(fed, i))
        return
    else:
        cfg = load_config(path)
    _run_a_few_slots(cfg)


def _run_a_few_slots(cfg) -> None:
    sim = build_simulator(cfg)
    view = sim.reset(0)
    # gang mode (dl2ray.gang) runs fixed-size jobs: DRF's resizing bundles do not apply there
    sched = make_scheduler("fifo-gang", cfg) if cfg.gang is not None else DRF()
    for _ in range(3):
        if sim.done:
            break
        view = sim.step(sched.decide(view)).view
    assert sim.slot >= 1


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("cluster: {nodes: [{count: 0}]}", "cluster.nodes.0.count"),
        ("cluster: {placement: spread}", "cluster.placement"),
        ("workload: {num_jobs: -1}", "workload.num_jobs"),
        ("workload: {lengths: {low: 2, high: 1}}", "workload.lengths"),
        ("sim: {slot_secondz: 5}", "sim.slot_secondz"),
        ("workload: {types: [nosuchmodel]}", "workload.types"),
        ("jobtypes: missing.yaml", "jobtypes"),
        ("- just\n- a list", "<root>"),
        ("cluster: {nodes: [", "not valid YAML"),
    ],
)
def test_bad_config_names_the_field(tmp_path, text, field):
    path = tmp_path / "bad.yaml"
    if text.startswith(("cluster", "workload", "sim")):
        text = f"jobtypes: {CONFIGS / 'jobtypes.yaml'}\n{text}"
    path.write_text(text)
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        cfg = load_config(path)
        _ = cfg.catalogue


def test_relative_jobtypes_path_resolves_against_the_config(tmp_path):
    (tmp_path / "cat.yaml").write_text((CONFIGS / "jobtypes.yaml").read_text())
    (tmp_path / "c.yaml").write_text("jobtypes: cat.yaml\nspeed: {model: analytic}\n")
    cfg = load_config(tmp_path / "c.yaml")
    assert len(cfg.catalogue) == 8
