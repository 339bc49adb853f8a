"""Warm members and restartable job hosts on the session's local Ray.

* scale-ups take idle, MXNet-imported members from the warm pool (an idle pool reserves nothing);
* a job host killed mid-run comes back (Ray ``max_restarts``), re-adopts its members, its coordinator
  rebuilds from their rejoins, and the job finishes with the parameters of unscaled training;
* the agent and a host killed together: the same; ``cluster down``'s teardown leaves no actor behind.

Slow (member processes import MXNet); every wait polls live state (see ``support.wait_for``).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from support import wait_for
from test_live import reference_params, small_spec

from dl2ray.config import ConfigError, load_config
from dl2ray.view import Allocation, Tasks

ROOT = Path(__file__).resolve().parents[2]


def test_pool_size_is_validated_naming_the_field(tmp_path: Path) -> None:
    from clusters.ray.config import load_live_config

    raw = yaml.safe_load((ROOT / "configs" / "live-local.yaml").read_text())
    raw["live"]["experiment"] = str(ROOT / "configs" / "testbed.yaml")
    raw["live"]["scheduler"] = "drf"
    for bad in (-1, 33, "two"):
        raw["live"]["pool"] = {"per_node": bad}
        path = tmp_path / "live.yaml"
        path.write_text(yaml.safe_dump(raw))
        with pytest.raises(ConfigError, match=r"pool\.per_node"):
            load_live_config(path)
    raw["live"]["pool"] = {"per_node": 0}
    path.write_text(yaml.safe_dump(raw))
    assert load_live_config(path).live.pool.per_node == 0


def _pool_ready(ray, pool, n: int):
    st = ray.get(pool.stats.remote())
    return st if st["idle_ready"] >= n else None


def _same_params(path: str, spec) -> None:
    got = np.load(path)
    assert int(got["iteration"]) == spec.iterations
    for i, r in enumerate(reference_params(spec)):
        assert np.linalg.norm(got[f"arr_{i}"] - r) <= 1e-5 * np.linalg.norm(r), f"parameter {i} differs"


OUR_ACTORS = ("MemberImpl", "JobHostImpl", "WarmPoolImpl", "LiveAgentImpl")


def _actor_processes(ray) -> list[str]:
    """Process titles (``ray::Class.method``) of this session's Ray worker processes that run one of
    our actor classes: descendants of this session's raylet (other sessions' Ray instances may run on the
    machine too)."""
    raylet = ray._private.worker._global_node.all_processes["raylet"][0].process.pid
    parent, title = {}, {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat, cmd = (d / "stat").read_text(), (d / "cmdline").read_bytes()
        except OSError:
            continue  # ended meanwhile
        parent[int(d.name)] = int(stat.rsplit(")", 1)[1].split()[1])
        title[int(d.name)] = cmd.split(b"\0")[0].decode(errors="replace")

    def under_raylet(pid: int) -> bool:
        for _ in range(6):
            pid = parent.get(pid, 0)
            if pid == raylet:
                return True
            if pid <= 1:
                return False
        return False

    return [t for pid, t in title.items() if t.startswith("ray::") and any(c in t for c in OUR_ACTORS)
            and under_raylet(pid)]


def _restarted(ray, host, restarts: int):
    """The host's status once Ray restarted it ``restarts`` times and its coordinator rebuilt the plan."""
    try:
        st = ray.get(host.status.remote(), timeout=30)
    except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
        return None
    return st if st.restarts >= restarts and st.state == "running" and st.workers > 0 else None


@pytest.mark.ray
@pytest.mark.slow
def test_warm_scale_up_then_host_killed_mid_run_job_finishes_with_unscaled_params(ray_session, tmp_path):
    import ray

    from clusters.ray.agent import teardown
    from clusters.ray.backend import RayBackend
    from clusters.ray.pool import ensure_pool

    cat = load_config(ROOT / "configs" / "testbed.yaml").catalogue
    be = RayBackend(cat, slot_seconds=1.0, epoch=time.time(), apply_wait_s=180.0)
    free_cpu = ray.available_resources().get("CPU")
    pool = ensure_pool(2)
    try:
        # an idle pool reserves nothing: Ray's free CPUs are what they were without it
        wait_for("the pool to fill", lambda: _pool_ready(ray, pool, 2))
        assert ray.available_resources().get("CPU") == free_cpu

        spec = small_spec("warm-restart", output=str(tmp_path / "params.npz"), epochs=40)
        jid = be.submit(spec)["job_id"]
        be.snapshot()
        assert [a.ok for a in be.apply(Allocation({jid: Tasks(1, 1)})).actions] == [True]

        def epochs() -> float:
            return be.statuses()[spec.name]["epochs_done"]

        wait_for("progress with 1 PS + 1 worker", lambda: epochs() > 0.5, progress=epochs)
        wait_for("the pool to refill", lambda: _pool_ready(ray, pool, 1))
        taken = be.statuses()[spec.name]["warm_taken"]
        be.snapshot()
        report = be.apply(Allocation({jid: Tasks(2, 1)}))  # scale-up: one more worker, from the pool
        assert [a.ok for a in report.actions] == [True], report
        st = be.statuses()[spec.name]
        assert st["workers"] == 2 and st["warm_taken"] == taken + 1

        host = be.hosts()[spec.name]
        e0 = epochs()
        members = {m["name"] for m in st["members"]}
        ray.kill(host, no_restart=False)  # Ray restarts it: the coordinator's thread died with it
        st = wait_for("the host to come back and rebuild", lambda: _restarted(ray, host, 1))
        assert {m.name for m in st.members} == members  # the same member actors, re-adopted
        assert st.workers == 2 and st.ps == 1
        wait_for("training to go on", lambda: epochs() > e0 + 0.5, progress=epochs)
        done = wait_for("the job to finish", lambda: (s := be.statuses()[spec.name])["state"] == "finished"
                        and s, progress=epochs)
        assert done["members"] == [] and done["restarts"] == 1
        assert not any(e["change"].startswith("recover") for e in done["events"])  # nobody was lost
        _same_params(spec.output, spec)
        be.remove(spec.name)
    finally:
        teardown()


@pytest.mark.ray
@pytest.mark.slow
def test_agent_and_host_killed_together_then_cluster_down_leaves_nothing(ray_session, tmp_path):
    import ray

    from clusters.cli.live import start_agent
    from clusters.ray.agent import teardown
    from clusters.ray.backend import list_hosts
    from clusters.ray.config import load_live_config
    from clusters.ray.record import record_names
    from clusters.runtime import NAMESPACE

    cfg = load_live_config(ROOT / "configs" / "live-local.yaml").with_agent(
        slot_seconds=2.0, log_dir=str(tmp_path / "live"))
    cfg = cfg.model_copy(update={"live": cfg.live.model_copy(update={"scheduler": "drf"})})
    agent = start_agent(cfg)
    spec = small_spec("killed-together", output=str(tmp_path / "params.npz"), epochs=40,
                      workers={"min": 1, "max": 2}, ps_count={"min": 1, "max": 1})
    try:
        assert ray.get(agent.submit.remote(spec.model_dump(mode="json")))["ok"]

        def job():
            return ray.get(agent.job.remote(spec.name), timeout=60)

        def epochs() -> float:
            try:
                return job()["epochs_done"]
            except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
                return -1.0  # the agent is restarting

        wait_for("the job to run and train", lambda: (j := job())["state"] == "running" and not j["busy"]
                 and j["epochs_done"] > 0.5, progress=epochs)
        host = list_hosts()[spec.name]
        ray.kill(agent, no_restart=False)
        ray.kill(host, no_restart=False)
        wait_for("the host to come back and rebuild", lambda: _restarted(ray, host, 1))
        done = wait_for("the job to finish", lambda: (j := job())["state"] == "finished" and j,
                        progress=epochs)
        assert done["restarts"] == 1
        _same_params(spec.output, spec)
        assert ray.get(agent.status.remote(), timeout=60)["restarted"] == 1
        titles = _actor_processes(ray)  # the count below can fail: it sees the processes while they run
        assert any("MemberImpl" in t for t in titles) and any("WarmPoolImpl" in t for t in titles), titles
    finally:
        teardown(cfg.live.agent_name)

    # nothing left behind: no named actor of the project, no process of ours, no record
    named = [a for a in ray.util.list_named_actors(all_namespaces=True) if a.get("namespace") == NAMESPACE]
    assert named == []
    assert record_names() == []
    wait_for("every actor process of the cluster to end", lambda: not _actor_processes(ray) or None)
