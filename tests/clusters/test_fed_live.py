"""Live federation members: the federation's policy as a live cluster's scheduler (learn, shadow,
serve-only) on simulated views through a direct link; the file's live-member fields and up's refusals
(exit 2, one line naming the field); and a ``ray`` member on the session's Ray (the live agent with
small elastic MXNet jobs) that pushes gradients, shows in ``status`` and is stopped by ``down``.

The ``k8s`` member against the emulator and the test kubelet is in tests/clusters/k8s/test_k8s_federation.py.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import pytest
import yaml
from support import run_cli, wait_for
from test_federation import _Direct, _fed_file, learner  # noqa: F401  (the learner fixture)

from clusters.federation.config import load_federation
from clusters.federation.links import LinkDown
from clusters.federation.members import member_specs
from dl2ray.config import ConfigError

ROOT = Path(__file__).resolve().parents[2]
CHECKPOINT = ROOT / "models" / "dl2-testbed-paper.pt"  # the policy configs/federation.yaml starts from


def live_config(tmp: Path, **live) -> Path:
    """A live config (configs/live-local.yaml's fields) with short slots and a patient guardrail."""
    doc = {"live": {"experiment": str(ROOT / "configs" / "testbed.yaml"), "slot_seconds": 2.0,
                    "agent_name": "fed-test-agent", "log_dir": str(tmp / "live"),
                    "guardrail": {"fallback": "drf", "time_budget_s": 60.0}, **live}}
    path = tmp / "live.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def _with_member(path: Path, member: dict, index: int = 0) -> Path:
    doc = yaml.safe_load(path.read_text())
    doc["members"][index] = member
    path.write_text(yaml.safe_dump(doc))
    return path


# -- the policy on simulated views, through a direct link to a plain learner -------------------------------


class _Down:
    """A link whose learner is gone: every call raises LinkDown."""

    def __getattr__(self, name):
        def fail(*args):
            raise LinkDown("learner gone")
        return fail


def _policy(learner, mode, link=None, **spec):  # noqa: F811
    """Member a's live policy (of the learner's architecture, as its agent builds it) in ``mode`` over
    ``link`` (default: straight to the plain learner)."""
    from clusters.federation.live import LiveMember
    from clusters.federation.members import MemberSpec

    gp, _, cfg = learner
    fed_spec = MemberSpec("a", 0, mode, [0], [1_000_000], 5, spec.pop("pull_interval_s", 60.0), 0, **spec)
    return LiveMember("t", cfg, fed_spec, link or _Direct(gp)).build(cfg, 0), gp, cfg


def _run(policy, cfg, slots: int, seed: int = 7):
    """``slots`` slots of a simulated cluster scheduled by ``policy`` (a live cluster's stand-in)."""
    from clusters.a3c.sim_backend import SimBackend
    from clusters.agent.guard import violation

    be = SimBackend.from_config(cfg)
    view = be.reset(seed)
    for _ in range(slots):
        alloc = policy.decide(view)
        assert violation(view, alloc) is None
        out = be.step(alloc)
        if out.done:
            break
        view = out.view


def test_learn_mode_pushes_gradients_and_takes_the_replies_weights(learner):  # noqa: F811
    policy, gp, cfg = _policy(learner, "learn", steps_per_update=4)
    _run(policy, cfg, 12)
    st = policy.stats()
    rec = {m["name"]: m for m in gp.status()["members"]}["a"]
    assert st["joins"] == rec["joins"] == 1
    assert st["pushed"] == st["accepted"] == rec["updates"] == gp.opt.updates >= 2
    assert st["version"] == gp.opt.updates  # decides with the weights of its latest push's reply
    assert rec["val_jct"] is None  # a live member validates nothing


@pytest.mark.parametrize("mode", ["shadow", "serve-only"])
def test_shadow_and_serve_only_pull_and_never_push(learner, mode):  # noqa: F811
    policy, gp, cfg = _policy(learner, mode, pull_interval_s=0.0)
    gp.join("b")
    gp.push_member("b", np.full(gp._weights().size, 0.01, np.float32), _row(), 0, gp.boot)
    _run(policy, cfg, 4)
    st = policy.stats()
    rec = {m["name"]: m for m in gp.status()["members"]}["a"]
    assert st["pushed"] == 0 and rec["updates"] == 0 and gp.opt.updates == 1
    assert st["pulls"] == rec["pulls"] >= 2 and st["version"] == 1
    assert np.array_equal(
        policy.numpy.dense_layers()[0][0], _numpy_of(gp).dense_layers()[0][0])  # the learner's weights


def _row():
    from dl2ray.learn.records import UpdateRow

    return UpdateRow(-1, 0.1, 0.2, 1.0, 0.5, 0.3, 32, 4, 0)


def _numpy_of(gp):
    from dl2ray.policy.network import NumpyPolicy

    return NumpyPolicy.from_torch(gp.policy)


def test_an_unreachable_learner_falls_back_first_then_keeps_the_weights_it_has(learner):  # noqa: F811
    from clusters.agent.guard import GuardedScheduler
    from dl2ray.schedulers.base import make_scheduler

    gp, _, cfg = learner
    policy, _, _ = _policy(learner, "learn", link=_Down(), steps_per_update=2)
    guarded = GuardedScheduler(policy, make_scheduler("drf", cfg), 30.0)
    _run(guarded, cfg, 2)
    assert guarded.fallbacks["error"] == 2  # no weights ever: the fallback decided
    policy.sink.link = _Direct(gp)  # the learner answers: the member joins
    _run(guarded, cfg, 1)
    assert policy.stats()["joins"] == 1 and policy.numpy is not None
    policy.sink.link = _Down()  # gone again: pushes are lost, decisions go on with the weights it has
    _run(guarded, cfg, 8)
    st = policy.stats()
    assert guarded.fallbacks["error"] == 2 and st["errors"] > 2 and st["pushed"] == 0
    assert "learner gone" in st["last_error"]
    policy.sink.link = _Direct(gp)
    _run(guarded, cfg, 1)
    assert policy.stats()["joins"] == 2  # rejoined with fresh weights


# -- the file and up's refusals ----------------------------------------------------------------------------


def test_live_members_load_with_the_learners_policy(tmp_path, tiny_yaml):
    from clusters.federation.config import live_member_config

    kube = tmp_path / "kubeconfig"
    path = _fed_file(tmp_path, tiny_yaml)
    _with_member(path, {"name": "live", "backend": {"kind": "ray", "address": "learner",
                                                    "config": str(live_config(tmp_path))},
                        "steps_per_update": 3})
    _with_member(path, {"name": "kube", "backend": {"kind": "k8s", "context": "kmock",
                                                    "config": str(_k8s_config(tmp_path, kube))},
                        "ray_address": "127.0.0.1:6379"}, index=1)
    fed = load_federation(path)
    (live, lcfg), (k8s, kcfg) = live_member_config(fed, 0), live_member_config(fed, 1)
    assert lcfg.policy.window == kcfg.policy.window == 6  # the learner's policy group (tiny)
    assert live.live.agent_name == "fed-test-agent" and k8s.kubernetes.kubeconfig == str(kube)
    assert fed.where(fed.members[0]) is None and fed.where(fed.members[1]) == "127.0.0.1:6379"
    assert member_specs(fed, 0)[0].steps_per_update == 3


def _k8s_config(tmp: Path, kubeconfig: Path | None) -> Path:
    doc = {"kubernetes": {"experiment": str(ROOT / "configs" / "testbed.yaml"),
                          "kubeconfig": None if kubeconfig is None else str(kubeconfig),
                          "log_dir": str(tmp / "k8s")}}
    path = tmp / "k8s.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize(("member", "field"), [
    ({"backend": {"kind": "ray", "address": "nohost"}}, "address"),
    ({"backend": {"kind": "ray", "address": "127.0.0.1:6379"}, "ray_address": "127.0.0.1:1"},
     "members.0.ray_address"),
    ({"backend": {"kind": "k8s", "context": "kmock", "kubeconfig": None}}, "kubernetes.kubeconfig"),
    ({"backend": {"kind": "ray", "address": "learner", "config": "missing.yaml"}}, "members.0.backend"),
])
def test_bad_live_member_fields_exit_2_naming_the_field(tmp_path, tiny_yaml, capsys, member, field):
    backend = member["backend"]
    if backend["kind"] == "ray":
        backend.setdefault("config", str(live_config(tmp_path)))
    else:
        backend["config"] = str(_k8s_config(tmp_path, backend.pop("kubeconfig")))
    path = _with_member(_fed_file(tmp_path, tiny_yaml), {"name": "live", **member})
    code, _, err = run_cli(capsys, "federation", "check", str(path))
    assert code == 2 and field in err and len(err.strip().splitlines()) == 1, err
    with pytest.raises(ConfigError):
        load_federation(path)


def test_up_refuses_an_unknown_address_or_context_before_starting_anything(tmp_path, tiny_yaml, capsys):
    kube = tmp_path / "kubeconfig"
    kube.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
        "clusters": [{"name": "kmock", "cluster": {"server": "http://127.0.0.1:9"}}],
        "users": [{"name": "kmock", "user": {}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "kmock"}}]}))
    path = _fed_file(tmp_path, tiny_yaml)
    _with_member(path, {"name": "kube", "backend": {"kind": "k8s", "context": "prod",
                                                    "config": str(_k8s_config(tmp_path, kube))}})
    for argv in (["check"], ["up", "--wait", "5"]):
        code, _, err = run_cli(capsys, "federation", *argv, str(path))
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert "members.0.backend.context: 'prod'" in err and "kmock" in err, err
    _with_member(path, {"name": "live", "backend": {"kind": "ray", "address": "127.0.0.1:1",
                                                    "config": str(live_config(tmp_path))}}, index=1)
    doc = yaml.safe_load(path.read_text())
    doc["members"][0]["backend"]["context"] = "kmock"
    path.write_text(yaml.safe_dump(doc))
    code, _, err = run_cli(capsys, "federation", "up", str(path), "--wait", "5")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: members.1.backend.address: 127.0.0.1:1 (live): no Ray head answers"), err
    assert not (tmp_path / "out" / "state.json").exists()  # no head was started


# -- a ray member on the session's Ray: the live agent with the federation's policy -------------------------


@pytest.fixture
def live_fed(ray_session, tmp_path, tiny_yaml):
    """A federation whose learner and one ``ray`` member (learn mode) are in the session's Ray."""
    address = ray_session.get_runtime_context().gcs_address
    path = _fed_file(tmp_path, tiny_yaml)
    doc = yaml.safe_load(path.read_text())
    doc["learner"].update(config=str(ROOT / "configs" / "testbed.yaml"), init=str(CHECKPOINT),
                          ray={"address": address}, http={"enabled": False}, checkpoint_every=1)
    backend = {"kind": "ray", "address": "learner", "config": str(live_config(tmp_path))}
    doc["members"] = [{"name": "live", "mode": "learn", "steps_per_update": 4, "backend": backend}]
    path.write_text(yaml.safe_dump(doc))
    yield ray_session, path
    _cleanup(ray_session, load_federation(path))


def _cleanup(ray, fed):
    from clusters.federation.deploy import names
    from clusters.ray.backend import list_hosts
    from clusters.runtime import NAMESPACE

    for name in names(fed).values():
        with contextlib.suppress(ValueError):
            ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)
    for host in list_hosts().values():
        with contextlib.suppress(ray.exceptions.RayError):
            ray.get(host.cancel.remote(), timeout=60)
        ray.kill(host)


@pytest.mark.ray
@pytest.mark.slow
def test_ray_member_pushes_live_gradients_shows_in_status_and_stops(live_fed, capsys):
    from test_live import small_spec

    from clusters.federation.deploy import down, status, up
    from clusters.runtime import NAMESPACE

    ray, path = live_fed
    res = up(path, wait_s=240)
    assert res["members"] == ["live"]
    agent = ray.get_actor("fed-test-agent", namespace=NAMESPACE)  # the cluster's agent, by its live name
    assert ray.get(agent.submit.remote(small_spec("fed-a", epochs=12).model_dump(mode="json")))["ok"]
    st = wait_for("a live gradient at the learner",
                  lambda: (s := status(path))["members"][0]["updates"] >= 1 and s, poll_s=1)
    m = st["members"][0]
    assert m["backend"] == "ray" and m["where"] == "learner's Ray (actor)" and m["joins"] == 1
    assert m["last_contact_s"] is not None and m["staleness"] == 0 and m["dropped"] == 0
    assert m["val_jct"] is None and m["validation"].startswith("none: a live cluster")
    agent_st = ray.get(agent.status.remote())
    assert agent_st["federation"] == {"federation": "t", "member": "live"}
    assert agent_st["learn"]["accepted"] >= 1 and agent_st["learn"]["version"] >= 1
    assert agent_st["errors"] == {} and agent_st["shadow"] is False

    code, out, err = run_cli(capsys, "federation", "status", str(path))
    assert code == 0, err
    row = next(line for line in out.splitlines() if line.startswith("live "))
    assert row.split()[1:3] == ["learn", "ray"] and row.split()[-3:] == ["n/a", "n/a", "n/a"]
    assert "no simulated validation traces" in out

    assert up(path, wait_s=60)["members"] == ["live"]  # idempotent: the same agent
    assert ray.get(ray.get_actor("fed-test-agent", namespace=NAMESPACE).pid.remote()) == \
        ray.get(agent.pid.remote())
    done = down(path)
    assert done["updates"] >= 1 and Path(done["checkpoint"]).is_file()
    for name in ("fed-test-agent", "fed-t-learner"):
        with pytest.raises(ValueError):
            ray.get_actor(name, namespace=NAMESPACE)
    assert ray.is_initialized()  # down leaves this process's own driver connected
