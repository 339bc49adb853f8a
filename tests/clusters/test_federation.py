"""Federation: the file, from-philly, the learner's member protocol, HTTP auth, members on Ray, faults.

The two-Ray test starts its own heads (``ray start --head --block``, stopped by pid): the learner's
through ``dl2ray federation up`` and a member's second cluster through the test, never ``ray stop``.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from support import run_cli, wait_for

from clusters.a3c.weights import params_vector
from clusters.federation.config import load_federation, member_config
from clusters.federation.http import decode_frame, encode_frame
from clusters.federation.learner import FederatedPolicyImpl, a3c_options
from clusters.federation.philly import gpu_demand_p90
from dl2ray.config import ConfigError
from dl2ray.learn.records import UpdateRow

ROW = UpdateRow(-1, 0.1, 0.2, 1.0, 0.5, 0.3, 32, 4, 0)


def _fed_file(tmp: Path, tiny_yaml: Path, **learner) -> Path:
    doc = {"name": "t", "learner": {"config": str(tiny_yaml), "out": str(tmp / "out"), "checkpoint_every": 5,
                                    "http": {"port": 0}, **learner},
           "members": [
               {"name": "a", "backend": {"kind": "sim", "config": str(tiny_yaml)}, "traces": 2,
                "val_every": 3},
               {"name": "b", "backend": {"kind": "sim", "config": str(tiny_yaml),
                                         "overrides": {"cluster": {"nodes": [{"count": 5}]}}},
                "traces": 2, "val_every": 3, "weight": 0.5, "staleness": 1}]}
    path = tmp / "fed.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


# -- the file ---------------------------------------------------------------------------------------------


def test_member_config_merges_overrides_and_takes_learner_policy(tmp_path, tiny_yaml):
    fed = load_federation(_fed_file(tmp_path, tiny_yaml))
    a, b = member_config(fed, 0), member_config(fed, 1)
    assert (a.cluster.num_nodes, b.cluster.num_nodes) == (3, 5)
    assert b.cluster.nodes[0].gpu == 2  # merged group by group: the rest of the node group stays
    assert a.policy == b.policy and a.policy.window == 6
    assert b.name == "b"


@pytest.mark.parametrize(("patch", "field"), [
    (lambda d: d["members"][1].update(weight=0), "members.1.weight"),
    (lambda d: d["members"][0].update(mode="teach"), "members.0.mode"),
    (lambda d: d["members"][0].update(colour="red"), "members.0.colour"),
    (lambda d: d["members"][1].update(name="a"), "members"),
    (lambda d: d["members"][0]["backend"].update(kind="mesos"), "members.0.backend"),
    (lambda d: d["learner"].update(checkpoint_every=0), "learner.checkpoint_every"),
    (lambda d: d["members"][0]["backend"].update(overrides={"cluster": {"nodes": [{"count": 0}]}}),
     "members.0.backend"),
    (lambda d: d["members"][0].update(ray_address="127.0.0.1:1")
     or d["learner"]["http"].update(enabled=False), "learner.http.enabled"),
    (lambda d: d["members"][0].update(joins_after=-1), "members.0.joins_after"),
    (lambda d: d["members"][0].update(joins_after=2, mode="shadow"), "joins_after"),
])
def test_bad_fields_exit_2_naming_the_field(tmp_path, tiny_yaml, capsys, patch, field):
    path = _fed_file(tmp_path, tiny_yaml)
    doc = yaml.safe_load(path.read_text())
    patch(doc)
    path.write_text(yaml.safe_dump(doc))
    code, _, err = run_cli(capsys, "federation", "check", str(path))
    assert code == 2
    assert field in err, err
    with pytest.raises(ConfigError):
        load_federation(path)


def test_shipped_federation_file_loads():
    fed = load_federation(Path(__file__).resolve().parents[2] / "configs" / "federation.yaml")
    assert len([m for m in fed.members if m.name.startswith("philly-")]) >= 4
    assert {"testbed", "large"} <= {m.name for m in fed.members}


# -- from-philly ------------------------------------------------------------------------------------------


def test_gpu_demand_p90_by_hand():
    # 0-10 s: 1 GPU; 10-20 s: 1 + 4 = 5 GPUs; 20-100 s: 4 GPUs -> time-weighted levels 1 (10 s), 5 (10 s),
    # 4 (80 s): the 90th percentile of time is in the 5-GPU stretch (sorted: 1:10%, 4:90%, 5:100%).
    assert gpu_demand_p90([(0.0, 20.0, 1), (10.0, 90.0, 4)]) == 4.0
    assert gpu_demand_p90([(0.0, 100.0, 2), (0.0, 50.0, 6)]) == 8.0


def test_from_philly_writes_the_largest_vcs(tmp_path, capsys):
    rows = ["timestamp,duration,num_gpus,gpu_time,cluster"]
    rng = np.random.default_rng(3)
    for vc, n, g in (("big", 40, 8), ("mid", 20, 2), ("small", 5, 1)):
        for i in range(n):
            rows.append(f"2017-10-0{1 + i % 5} 0{i % 10}:00:00,{int(rng.integers(600, 7200))},{g},0,{vc}")
    rows.append("2017-10-01 00:00:00,0,4,0,big")  # duration 0: dropped as read_philly drops it
    csv = tmp_path / "philly.csv"
    csv.write_text("\n".join(rows) + "\n")
    out = tmp_path / "fed" / "philly.yaml"
    code, _, err = run_cli(capsys, "federation", "from-philly", str(csv), "--vcs", "2", "--out", str(out),
                              "--gpu-scale", "1", "--runs", str(tmp_path / "runs"))
    assert code == 0, err
    fed = load_federation(out)
    assert [m.name for m in fed.members] == ["philly-big", "philly-mid"]
    big, mid = member_config(fed, 0), member_config(fed, 1)
    assert big.cluster.num_nodes > mid.cluster.num_nodes
    assert big.workload.requested_bundles == 8 and mid.workload.requested_bundles == 2
    assert big.workload.arrivals.rate > mid.workload.arrivals.rate
    code, _, err = run_cli(capsys, "federation", "from-philly", str(csv), "--vcs", "4", "--out", str(out))
    assert code == 2 and "--vcs" in err


@pytest.mark.parametrize(("args", "field"), [
    (["--name", "Bad Name"], "--name"),
    (["--min-nodes", "8", "--max-nodes", "4"], "--max-nodes"),
    (["--out", "/proc/no-such-dir/fed.yaml"], "--out"),
])
def test_from_philly_bad_options_exit_2_and_write_nothing(tmp_path, capsys, args, field):
    csv = tmp_path / "philly.csv"
    csv.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-01 00:00:00,600,1,0,vc\n")
    out = tmp_path / "fed.yaml"
    code, _, err = run_cli(capsys, "federation", "from-philly", str(csv), "--vcs", "1", "--out", str(out),
                           *args)
    assert code == 2, err
    assert err.startswith(f"error: {field}") and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def test_experiment_refuses_unknown_or_no_learning_members(tmp_path, tiny_yaml, capsys):
    path = _fed_file(tmp_path, tiny_yaml)
    code, _, err = run_cli(capsys, "federation", "experiment", str(path), "--member", "zz")
    assert code == 2 and err.startswith("error: --member: 'zz'"), err
    doc = yaml.safe_load(path.read_text())
    doc["members"][0]["mode"] = "shadow"
    path.write_text(yaml.safe_dump(doc))
    code, _, err = run_cli(capsys, "federation", "experiment", str(path), "--member", "a")
    assert code == 2 and err.startswith("error: --member: none"), err
    doc["members"][0]["mode"] = "learn"
    doc["members"][1]["joins_after"] = 3
    path.write_text(yaml.safe_dump(doc))
    code, _, err = run_cli(capsys, "federation", "experiment", str(path), "--updates", "3")
    assert code == 2 and "'b' joins after 3 updates" in err, err
    code, _, err = run_cli(capsys, "federation", "experiment", str(path), "--member", "b", "--updates", "5")
    assert code == 2 and "nobody would push first" in err, err


def test_bench_refuses_a_member_count_below_one(capsys):
    code, _, err = run_cli(capsys, "bench", "federation", "--members", "2", "--members", "0")
    assert code == 2 and err.startswith("error: --members: 0"), err


# -- status: the table and the JSON document (the learner's view stubbed: no Ray) -------------------------


def test_status_table_and_json(tmp_path, tiny_yaml, capsys, monkeypatch):
    import clusters.federation.deploy

    member = {"name": "a", "mode": "learn", "backend": "sim", "updates": 7, "dropped": 1, "rewound": 0,
              "joins": 2, "last_contact_s": 0.4, "staleness": 1, "staleness_bound": 8, "bytes_last": 0,
              "val_jct": 12.0, "drf_jct": 10.0, "jct_over_drf": 1.2, "where": "learner's Ray (actor)"}
    never = {**member, "name": "b", "updates": 0, "dropped": 0, "joins": 0, "last_contact_s": None,
             "bytes_last": 1659755, "val_jct": None, "drf_jct": None, "jct_over_drf": None}
    live = {**never, "name": "c", "backend": "ray", "mode": "shadow", "joins": 1, "last_contact_s": 1.5,
            "bytes_last": 0}
    doc = {"federation": "t", "address": "127.0.0.1:1", "url": None, "checkpoint": "x/global.pt",
           "updates": 7, "boot": 1, "resumed": False, "uptime_s": 3.0, "members": [member, never, live]}
    monkeypatch.setattr(clusters.federation.deploy, "status", lambda path: doc)
    path = _fed_file(tmp_path, tiny_yaml)
    code, out, err = run_cli(capsys, "federation", "status", str(path), "--json")
    assert code == 0, err
    assert json.loads(out) == doc
    code, out, err = run_cli(capsys, "federation", "status", str(path))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("federation t: 7 updates, learner boot 1")
    assert lines[2].split() == ["a", "learn", "sim", "7", "1", "0", "2", "0.4", "1", "-", "12.00", "10.00",
                                "1.200"]
    assert lines[3].split() == ["b", "learn", "sim", "0", "0", "0", "0", "-", "1", "1659755", "-", "-", "-"]
    # a live member has no simulated validation traces: said so, not left blank
    assert lines[4].split() == ["c", "shadow", "ray", "0", "0", "0", "1", "1.5", "1", "-",
                                "n/a", "n/a", "n/a"]
    assert lines[5].startswith("n/a: live members (ray, k8s) have no simulated validation traces")


# -- the learner's protocol (plain class) -----------------------------------------------------------------


@pytest.fixture
def learner(tmp_path, tiny_yaml):
    fed = load_federation(_fed_file(tmp_path, tiny_yaml))
    members = [{"name": m.name, "mode": m.mode, "weight": m.weight, "staleness": m.staleness}
               for m in fed.members]
    cfg = member_config(fed, 0)
    return FederatedPolicyImpl(cfg, None, 0, str(tmp_path / "gp.pt"), a3c_options(fed), members), members, cfg


def _grad(gp, value=0.01):
    return np.full(params_vector(gp.policy, gp.value).size, value, dtype=np.float32)


def test_stale_and_rewound_gradients_are_dropped_and_counted(learner):
    gp, _, _ = learner
    gp.join("b")
    w0 = params_vector(gp.policy, gp.value)
    assert gp.push_member("b", _grad(gp), ROW, 0, gp.boot)["accepted"] == "yes"
    assert gp.push_member("b", _grad(gp), ROW, 0, gp.boot)["accepted"] == "yes"  # lag 1 = bound
    r = gp.push_member("b", _grad(gp), ROW, 0, gp.boot, pull=False)  # lag 2 > staleness 1
    assert r["accepted"] == "stale" and r["weights"] is not None  # dropped: fresh weights sent back
    r = gp.push_member("b", _grad(gp), ROW, 99, gp.boot, pull=False)
    assert r["accepted"] == "rewound" and r["updates"] == 2
    rec = {m["name"]: m for m in gp.status()["members"]}["b"]
    assert (rec["updates"], rec["dropped"], rec["rewound"], rec["max_lag"]) == (2, 1, 1, 2)
    assert not np.array_equal(w0, params_vector(gp.policy, gp.value))
    with pytest.raises(ValueError, match="unknown member"):
        gp.join("zz")


def test_weight_scales_the_gradient(learner, monkeypatch):
    gp, _, _ = learner
    seen = []
    monkeypatch.setattr(gp, "push", lambda g, row, agent_id: seen.append((agent_id, g.copy())))
    gp.push_member("a", _grad(gp, 0.2), ROW, 0, gp.boot)
    gp.push_member("b", _grad(gp, 0.2), ROW, 0, gp.boot)
    assert [s[0] for s in seen] == [0, 1]
    assert np.allclose(seen[0][1], 0.2) and np.allclose(seen[1][1], 0.1)  # b's weight is 0.5


def test_restart_resumes_registry_and_counts_a_boot(learner, tmp_path):
    gp, members, cfg = learner
    gp.join("a")
    for _ in range(5):  # checkpoint_every 5: the fifth update writes the checkpoint
        gp.push_member("a", _grad(gp), ROW, gp.opt.updates, gp.boot)
    gp.report("a", 5, 12.0, 10.0)
    gp.save(str(tmp_path / "gp.pt"))
    again = FederatedPolicyImpl(cfg, None, 0, str(tmp_path / "gp.pt"), gp.opts, members)
    assert again.boot == gp.boot + 1 and again.opt.updates == 5 and again.resumed
    rec = {m["name"]: m for m in again.status()["members"]}["a"]
    assert (rec["updates"], rec["joins"], rec["val_jct"], rec["drf_jct"]) == (5, 1, 12.0, 10.0)
    assert np.array_equal(params_vector(gp.policy, gp.value), params_vector(again.policy, again.value))


# -- HTTP: frames and the token ---------------------------------------------------------------------------


def test_frame_round_trip_and_malformed():
    h, a = decode_frame(encode_frame({"x": 1}, np.arange(3, dtype=np.float32)))
    assert h == {"x": 1} and a.tolist() == [0.0, 1.0, 2.0]
    assert decode_frame(encode_frame({"x": 1}, None))[1] is None
    for bad in (b"", b"\xff\xff\xff\x7f{}", encode_frame({}, None) + b"abc"):
        with pytest.raises(ValueError):
            decode_frame(bad)


def test_http_without_the_token_gets_401_and_changes_nothing(learner):
    import requests

    from clusters.federation.http import FedGatewayImpl

    gp, _, _ = learner
    gw = FedGatewayImpl(gp, "s3cret-token-0123456789", "127.0.0.1", 0)  # uvicorn in a thread, no Ray
    try:
        _check_http(gp, _Client(requests.Session(), gw.url()))
    finally:
        gw.stop()


def test_a_members_own_token_speaks_for_that_member_only(learner):
    """A member's token (an HMAC of its name under the shared one) pushes, pulls and joins as itself; naming
    another member is 403 and reaches no learner; without its name header, or as another member, 401."""
    import requests

    from clusters.federation.http import MEMBER_HEADER, FedGatewayImpl, HttpLink, member_token

    gp, _, _ = learner
    shared = "s3cret-token-0123456789"
    gw = FedGatewayImpl(gp, shared, "127.0.0.1", 0)
    try:
        client = _Client(requests.Session(), gw.url())
        mine = {"Authorization": f"Bearer {member_token(shared, 'a')}", MEMBER_HEADER: "a"}
        as_b = encode_frame({"member": "b", "version": 0, "boot": gp.boot, "pull": True, "row": ROW.__dict__},
                            _grad(gp))
        assert client.post("/v1/fed/push", content=as_b, headers=mine).status_code == 403
        assert client.post("/v1/fed/join", json={"member": "b"}, headers=mine).status_code == 403
        report = {"member": "b", "update": 1, "val_jct": 1.0, "drf_jct": 2.0}
        assert client.post("/v1/fed/report", json=report, headers=mine).status_code == 403
        assert gp.opt.updates == 0 and all(m["joins"] == 0 for m in gp.status()["members"])
        for headers in ({"Authorization": mine["Authorization"]},  # no name: cannot be checked
                        {"Authorization": mine["Authorization"], MEMBER_HEADER: "b"}):  # a's token as b
            assert client.post("/v1/fed/join", json={"member": "b"}, headers=headers).status_code == 401
        link = HttpLink(gw.url(), member_token(shared, "a"), member="a")
        assert link.join("a")["updates"] == 0
        reply = link.push("a", _grad(gp), ROW, 0, gp.boot, True)
        assert reply["accepted"] == "yes" and gp.opt.updates == 1
        assert link.version()["updates"] == 1  # routes that name no member take a member's token
        with pytest.raises(RuntimeError, match="403"):
            link.push("b", _grad(gp), ROW, 1, gp.boot, True)
        assert gp.opt.updates == 1
    finally:
        gw.stop()


def test_a_members_http_link_reads_the_learners_status_for_its_dashboard(learner):
    from clusters.federation.http import FedGatewayImpl, HttpLink

    gp, _, _ = learner
    gw = FedGatewayImpl(gp, "s3cret-token-0123456789", "127.0.0.1", 0)
    try:
        st = HttpLink(gw.url(), "s3cret-token-0123456789").status()
    finally:
        gw.stop()
    assert st["updates"] == gp.opt.updates and st["boot"] == gp.boot
    assert [m["name"] for m in st["members"]] == [m["name"] for m in gp.status()["members"]]
    assert all({"staleness", "staleness_bound", "last_contact_s"} <= set(m) for m in st["members"])


class _Client:
    def __init__(self, session, url):
        self.s, self.url = session, url

    def post(self, path, content=None, json=None, headers=None):
        return self.s.post(self.url + path, data=content, json=json, headers=headers or {}, timeout=30)

    def get(self, path, headers=None):
        return self.s.get(self.url + path, headers=headers or {}, timeout=30)


def _check_http(gp, client):
    body = encode_frame({"member": "a", "version": 0, "boot": gp.boot, "pull": True,
                         "row": ROW.__dict__}, _grad(gp))
    w0 = params_vector(gp.policy, gp.value)
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret-token-0123456789"}):
        for path in ("/v1/fed/push", "/v1/fed/join", "/v1/fed/report"):
            assert client.post(path, content=body, headers=headers).status_code == 401
        assert client.get("/v1/fed/status", headers=headers).status_code == 401
    assert gp.opt.updates == 0 and np.array_equal(w0, params_vector(gp.policy, gp.value))
    assert all(m["last_contact_s"] is None and m["joins"] == 0 for m in gp.status()["members"])
    ok = {"Authorization": "Bearer s3cret-token-0123456789"}
    r = client.post("/v1/fed/push", content=body, headers=ok)
    assert r.status_code == 200
    header, weights = decode_frame(r.content)
    assert header["accepted"] == "yes" and header["updates"] == 1 and weights.size == w0.size
    assert client.get("/v1/fed/version", headers=ok).json() == {"updates": 1, "boot": gp.boot}
    assert client.post("/v1/fed/join", json={"member": "zz"}, headers=ok).status_code == 404
    assert client.post("/v1/fed/push", content=b"\x01", headers=ok).status_code == 400


# -- members on Ray: same-Ray actors, a member lost and back, a learner restart ---------------------------


def _status(ray, learner):
    st = ray.get(learner.status.remote())
    return st, {m["name"]: m for m in st["members"]}


@pytest.mark.ray
@pytest.mark.slow
def test_members_survive_member_loss_and_learner_restart(ray_session, tmp_path, tiny_yaml):
    from clusters.federation.deploy import ensure_learner, names, start_local_member
    from clusters.federation.links import ActorLink
    from clusters.runtime import NAMESPACE

    ray = ray_session
    fed = load_federation(_fed_file(tmp_path, tiny_yaml, http={"enabled": False}))
    learner, _, _ = ensure_learner(fed)
    n = names(fed)
    try:
        link = ActorLink(n["learner"])
        agents = {m.name: start_local_member(fed, i, link) for i, m in enumerate(fed.members)}
        wait_for("both members push", lambda: all(
            m["updates"] >= 2 for m in _status(ray, learner)[1].values()))
        # a member disappears: the other goes on
        ray.kill(agents["b"], no_restart=True)
        wait_for("b's name is free", lambda: _free(ray, n["member:b"], NAMESPACE))  # b's process is gone
        before = _status(ray, learner)[1]
        # a push b sent before it died was queued at the learner before a's next ones: done by then
        wait_for("a goes on alone",
                 lambda: _status(ray, learner)[1]["a"]["updates"] >= before["a"]["updates"] + 3)
        assert _status(ray, learner)[1]["b"]["updates"] <= before["b"]["updates"] + 1
        before = _status(ray, learner)[1]
        wait_for("a goes on alone",
                 lambda: _status(ray, learner)[1]["a"]["updates"] >= before["a"]["updates"] + 3)
        assert _status(ray, learner)[1]["b"]["updates"] == before["b"]["updates"]
        # ... and rejoins (a new incarnation), with the learner's current weights
        agents["b"] = start_local_member(fed, 1, ActorLink(n["learner"]))
        wait_for("b rejoins", lambda: _status(ray, learner)[1]["b"]["joins"] == 2)
        wait_for("b pushes again", lambda: _status(ray, learner)[1]["b"]["updates"] > before["b"]["updates"])
        # the learner dies: Ray restarts it from its last checkpoint; members reconnect by themselves
        st0 = _status(ray, learner)[0]
        ray.kill(learner, no_restart=False)
        wait_for("learner back", lambda: _status(ray, learner)[0]["boot"] == st0["boot"] + 1)
        wait_for("members reconnect", lambda: all(
            ray.get(a.status.remote())["reconnects"] >= 1 for a in agents.values()))
        st1 = _status(ray, learner)[0]
        wait_for("updates go on", lambda: _status(ray, learner)[0]["updates"] > st1["updates"] + 2)
        assert all(ray.get(a.status.remote())["running"] for a in agents.values())
        v = _status(ray, learner)[1]
        assert v["a"]["val_jct"] is not None and v["a"]["drf_jct"] > 0  # validated on its own traces
    finally:
        for key in [*(f"member:{m.name}" for m in fed.members), "learner"]:
            with contextlib.suppress(ValueError):
                ray.kill(ray.get_actor(n[key], namespace=NAMESPACE), no_restart=True)


def _free(ray, name, namespace):
    try:
        ray.get_actor(name, namespace=namespace)
    except ValueError:
        return True
    return False


# -- two separate Ray instances: up (learner's head), a member in a second head over HTTP, status, down ---


def _dl2ray(*args, timeout=300):
    exe = Path(sys.executable).with_name("dl2ray")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_up_status_down_with_a_member_in_another_ray(tmp_path, tiny_yaml):
    import requests

    from clusters.ray.head import start_head, stop_head

    second = start_head(1, 0, tmp_path / "second-head.log")
    try:
        path = _fed_file(tmp_path, tiny_yaml, ray={"num_cpus": 1})
        doc = yaml.safe_load(path.read_text())
        doc["members"][1]["ray_address"] = second["address"]
        # a live Ray cluster's agent as a member (the second head as its cluster): it joins over HTTP too
        live = {"live": {"experiment": str(Path(__file__).resolve().parents[2] / "configs" / "testbed.yaml"),
                         "slot_seconds": 2.0, "agent_name": "fed-http-agent",
                         "log_dir": str(tmp_path / "live"), "guardrail": {"time_budget_s": 60.0}}}
        (tmp_path / "live.yaml").write_text(yaml.safe_dump(live))
        doc["members"].append({"name": "live", "mode": "serve-only", "pull_interval_s": 1.0, "backend": {
            "kind": "ray", "address": second["address"], "config": str(tmp_path / "live.yaml")}})
        path.write_text(yaml.safe_dump(doc))
        up = _dl2ray("federation", "up", str(path), "--json")
        assert up.returncode == 0, up.stderr[-2000:]
        try:
            url = json.loads(up.stdout)["url"]
            token = (tmp_path / "federation.token").read_text().strip()
            assert len(token) >= 32

            def http_updates():  # the learner's view through its endpoint (quicker than a CLI process)
                doc = requests.get(url + "/v1/fed/status", headers={"Authorization": f"Bearer {token}"},
                                   timeout=30).json()
                b = {m["name"]: m for m in doc["members"]}["b"]
                return b["updates"] >= 2 and b["bytes_last"] > 0
            wait_for("the HTTP member pushes", http_updates, poll_s=1)
            assert requests.get(url + "/v1/fed/status", timeout=30).status_code == 401
            st = _dl2ray("federation", "status", str(path), "--json")
            assert st.returncode == 0, st.stderr[-2000:]
            doc = json.loads(st.stdout)
            m = {x["name"]: x for x in doc["members"]}
            assert m["b"]["where"] == second["address"] and m["a"]["bytes_last"] == 0  # a: actor calls
            assert m["live"]["where"] == second["address"] and m["live"]["backend"] == "ray"
            assert m["live"]["joins"] >= 1 and m["live"]["pulls"] >= 1 and m["live"]["updates"] == 0
            # a gradient and weights of the tiny nets travel per update: at least both vectors' floats
            size = 4 * 2 * _param_count(load_federation(path))
            assert size <= m["b"]["bytes_last"] < size + 4096
        finally:
            down = _dl2ray("federation", "down", str(path))
        assert down.returncode == 0 and "warning" not in down.stderr, down.stderr[-2000:]
        assert (tmp_path / "out" / "global.pt").exists() and (tmp_path / "out" / "global.json").exists()
        assert list((tmp_path / "out" / "tb").iterdir())
        again = _dl2ray("federation", "status", str(path))
        assert again.returncode == 2 and "not running" in again.stderr
    finally:
        stop_head(second["pid"])


def _param_count(fed) -> int:
    from dl2ray.policy.encoding import Encoding
    from dl2ray.policy.network import build_networks

    cfg = member_config(fed, 0)
    p, v = build_networks(Encoding.from_config(cfg), cfg.policy.hidden, 0)
    return params_vector(p, v).size


# -- a member's turn without Ray (a direct link to a plain learner) ---------------------------------------


class _Direct:
    """The Link protocol over a plain learner object (what ActorLink does through Ray)."""

    def __init__(self, gp):
        self.gp = gp

    def join(self, name):
        return self.gp.join(name)

    def push(self, name, flat_grad, row, version, boot, pull):
        return self.gp.push_member(name, flat_grad, row, version, boot, pull)

    def pull(self, name, since, boot):
        return self.gp.pull_member(name, since, boot)

    def report(self, name, update, val_jct, drf_jct):
        self.gp.report(name, update, val_jct, drf_jct)


@pytest.mark.parametrize("mode", ["learn", "shadow", "serve-only"])
def test_member_turns_by_mode(learner, tmp_path, tiny_yaml, mode):
    import dataclasses

    from clusters.federation.members import MemberAgentImpl, member_specs

    gp, _, cfg = learner
    fed = load_federation(_fed_file(tmp_path, tiny_yaml))
    spec = dataclasses.replace(member_specs(fed, 0)[0], mode=mode, val_every=2, pull_interval_s=0.01)
    agent = MemberAgentImpl(cfg, spec, _Direct(gp), start=False)
    agent.step()
    agent.step()
    st = agent.status()
    rec = {m["name"]: m for m in gp.status()["members"]}["a"]
    assert st["joins"] == rec["joins"] == 1
    if mode == "learn":
        assert st["pushed"] == st["accepted"] == rec["updates"] == gp.opt.updates == 2
        assert st["version"] == 2  # the reply's weights were taken
    else:
        assert st["pushed"] == 0 and gp.opt.updates == 0 and rec["pulls"] == st["pulls"] == 2
    assert st["validations"] == 1 and rec["drf_jct"] > 0 and rec["val_jct"] > 0  # its own validation traces
    [(pushed, slots, seconds, jct)] = agent.validations()  # what Fig. 18's federation row reads
    assert jct == rec["val_jct"] and seconds > 0
    assert (pushed, slots) == ((2, st["slots"]) if mode == "learn" else (0, 0))
    assert rec["val_update"] == st["version"]


def test_a_late_member_pulls_until_the_federation_has_its_updates_then_pushes(learner, tmp_path, tiny_yaml):
    """``joins_after`` 2: the member takes the global weights at once, pulls while the learner has fewer
    than 2 updates (pushed here by member b), then pushes from the next turn on."""
    import dataclasses

    from clusters.federation.members import MemberAgentImpl, member_specs

    gp, _, cfg = learner
    fed = load_federation(_fed_file(tmp_path, tiny_yaml))
    spec = dataclasses.replace(member_specs(fed, 0)[0], joins_after=2, val_every=100, pull_interval_s=0.01)
    agent = MemberAgentImpl(cfg, spec, _Direct(gp), start=False)
    agent.step()
    agent.step()
    st = agent.status()
    assert st["joins"] == 1 and st["pushed"] == 0 and st["pulls"] == 2 and gp.opt.updates == 0
    gp.join("b")
    for _ in range(2):
        gp.push_member("b", _grad(gp, 1e-4), ROW, gp.opt.updates, gp.boot)
    agent.step()  # the pull that sees update 2
    agent.step()  # its first push
    st = agent.status()
    assert st["pulls"] == 3 and st["pushed"] == st["accepted"] == 1 and gp.opt.updates == 3


def test_every_backend_kind_of_the_schema_has_one_registered_member_kind() -> None:
    """A new backend registers once (clusters/federation/kinds.py); deploy and experiment ask the registry."""
    from typing import get_args

    from clusters.federation.config import Member
    from clusters.federation.kinds import KINDS

    specs = get_args(Member.model_fields["backend"].annotation)
    kinds = {get_args(spec.model_fields["kind"].annotation)[0] for spec in specs}
    assert kinds == set(KINDS) == {"sim", "ray", "k8s"}
    assert [k for k, v in KINDS.items() if v.simulated] == ["sim"]


def test_fig_18_s_federation_members_share_the_baseline_when_the_options_say_so() -> None:
    """``RLOptions.share_baseline`` reaches every member of :func:`clusters.federation.quality.federated_rl`
    (the learner's A3C options carry it too: tests/clusters/test_a3c_shape.py checks the master)."""
    from clusters.federation.quality import _specs
    from dl2ray.learn.records import RLOptions

    shared = _specs(2, RLOptions(algo="pg", traces=2, share_baseline=True), 0)
    assert [s.share_baseline for s in shared] == [True, True]
    assert [s.share_baseline for s in _specs(2, RLOptions(algo="pg", traces=2), 0)] == [False, False]


@pytest.mark.parametrize("weight", [0.0, -0.5, float("nan")])
def test_fig_18_s_federation_refuses_a_member_weight_not_above_0(tiny_shape, tmp_path, weight) -> None:
    from clusters.federation.quality import federated_rl
    from dl2ray.errors import UserError
    from dl2ray.learn.records import RLOptions

    with pytest.raises(UserError, match="member weight"):
        federated_rl(tiny_shape, tmp_path / "init.pt", 2, 1, 0, RLOptions(algo="pg"), tmp_path / "fed",
                     weight)
