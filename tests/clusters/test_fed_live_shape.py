"""Live federation members of a shape-policy federation: the member's agent builds the
:class:`~clusters.federation.live.FederatedLiveShapePolicy` (the live shape learner behind the member's
link); on simulated views through a direct link to a real shape learner, learn mode pushes
pseudo-gradients the learner's checks accept and applies, shadow and serve-only pull and never push, and
an unreachable learner is counted while the member keeps deciding. (``slow``, session Ray) a ``ray``
member in learn mode on the learner's Ray whose live pseudo-gradient the learner applies.

Here ``tiny_yaml`` is the tiny *shape* config, so the imported ``learner`` fixture (tests/clusters/
test_federation.py) is a shape learner and its members decide with the shape policy.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from support import wait_for
from test_fed_live import ROOT, _cleanup, _Down, _policy, _run, live_config
from test_federation import _Direct, _fed_file, learner  # noqa: F401  (the learner fixture)

from clusters.a3c.weights import params_vector
from clusters.federation.config import load_federation
from dl2ray.learn.records import CounterfactualRow

ROW = CounterfactualRow(-1, 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0, 0)


@pytest.fixture
def tiny_yaml(tiny_shape_yaml: Path) -> Path:
    """The federation's learner config in this module: the shape architecture on the tiny cluster."""
    return tiny_shape_yaml


class _Waiting:
    """The shape policy with each slot's push waited for (the agent's slot loop never waits; tests do,
    so that every count below is exact)."""

    def __init__(self, policy) -> None:
        self.policy, self.name = policy, policy.name

    def decide(self, view):
        alloc = self.policy.decide(view)
        self.policy.join()
        return alloc


def _record(gp, name: str = "a") -> dict:
    return {m["name"]: m for m in gp.status()["members"]}[name]


# -- which learner a live member runs ---------------------------------------------------------------------


@pytest.mark.parametrize(("init", "policy_class"), [
    ("dl2-testbed.pt", "FederatedLiveShapePolicy"),
    ("dl2-testbed-paper.pt", "FederatedLivePolicy"),
    (None, "FederatedLiveShapePolicy"),  # no init: the learner's config's architecture (shape here)
])
def test_a_live_member_runs_the_learner_of_the_federations_architecture(tmp_path, tiny_yaml, init,
                                                                        policy_class):
    from clusters.federation.live import live_member

    path = _fed_file(tmp_path, tiny_yaml, init=None if init is None else str(ROOT / "models" / init))
    doc = yaml.safe_load(path.read_text())
    doc["members"][0] = {"name": "live", "backend": {"kind": "ray", "address": "learner",
                                                     "config": str(live_config(tmp_path))}}
    path.write_text(yaml.safe_dump(doc))
    _, member = live_member(load_federation(path), 0, _Down())  # building contacts nobody
    policy = member.build(member.cfg, 0)
    assert type(policy).__name__ == policy_class
    assert policy.version == -1 and policy.stats()["joins"] == 0


# -- the policy on simulated views, through a direct link to a real shape learner --------------------------


def test_learn_mode_pushes_pseudo_gradients_the_learner_accepts_and_applies(learner):  # noqa: F811
    from clusters.federation.live import FederatedLiveShapePolicy

    policy, gp, cfg = _policy(learner, "learn", steps_per_update=3)
    assert isinstance(policy, FederatedLiveShapePolicy) and gp.value is None
    _run(_Waiting(policy), cfg, 15)
    st, rec = policy.stats(), _record(gp)
    assert st["joins"] == rec["joins"] == 1 and st["errors"] == 0
    assert st["pushed"] == st["accepted"] == rec["updates"] == gp.opt.updates >= 2
    assert st["refused"] == rec["refused"] == 0 and gp.stats()["refused"] == {}
    assert st["version"] == gp.opt.updates and st["twin_traces"] == st["pushed"]
    assert np.array_equal(params_vector(policy.net, None), gp._weights())  # decides with the reply's weights
    assert all(isinstance(r, CounterfactualRow) for r in gp.result.history)
    assert st["decided"] == st["slots"] == 15


@pytest.mark.parametrize("mode", ["shadow", "serve-only"])
def test_shadow_and_serve_only_pull_and_never_push(learner, mode):  # noqa: F811
    policy, gp, cfg = _policy(learner, mode, pull_interval_s=0.0, steps_per_update=1)
    gp.join("b")
    assert gp.push_member("b", np.full(gp._weights().size, 1e-3, np.float32), ROW, 0, gp.boot)[
        "accepted"] == "yes"
    _run(_Waiting(policy), cfg, 4)
    st, rec = policy.stats(), _record(gp)
    assert st["pushed"] == rec["updates"] == 0 and gp.opt.updates == 1
    assert st["observed_jobs"] == 0 and not st["computing"]  # nothing observed, no push computed
    assert st["pulls"] == rec["pulls"] >= 2 and st["version"] == 1 and st["decided"] == 4
    assert np.array_equal(params_vector(policy.net, None), gp._weights())  # the learner's weights


def test_an_unreachable_learner_is_counted_and_the_member_keeps_deciding(learner):  # noqa: F811
    from clusters.agent.guard import GuardedScheduler
    from dl2ray.schedulers.base import make_scheduler

    gp, _, cfg = learner
    policy, _, _ = _policy(learner, "learn", link=_Down(), steps_per_update=2)
    guarded = GuardedScheduler(_Waiting(policy), make_scheduler("drf", cfg), 30.0)
    _run(guarded, cfg, 2)
    assert guarded.fallbacks["error"] == 2  # no weights ever: the fallback decided
    policy.sink.link = _Direct(gp)  # the learner answers: the member joins
    _run(guarded, cfg, 1)
    assert policy.stats()["joins"] == 1 and policy.version == 0
    policy.sink.link = _Down()  # gone again: pushes are lost, decisions go on with the weights it has
    _run(guarded, cfg, 8)
    st = policy.stats()
    assert guarded.fallbacks["error"] == 2 and st["decided"] == 9
    assert st["errors"] >= 2 and st["pushed"] == 0 and gp.opt.updates == 0
    assert "learner gone" in st["last_error"]
    policy.sink.link = _Direct(gp)
    _run(guarded, cfg, 1)
    assert policy.stats()["joins"] == 2  # rejoined with fresh weights


def test_a_push_the_learners_checks_refuse_is_counted_as_refused(learner):  # noqa: F811
    from clusters.federation.live import MemberSink
    from clusters.federation.members import MemberSpec

    gp, _, _ = learner
    sink = MemberSink(_Direct(gp), MemberSpec("a", 0, "learn", [0], [1_000_000], 5, 60.0, 0), pull_every=1)
    updates, weights = sink.fetch()
    after, fresh = sink.push(weights[:-1], ROW, updates)  # one value short
    assert after == 0 and np.array_equal(fresh, weights)  # refused: not applied, the weights sent back
    c = sink.counters()
    assert (c["pushed"], c["refused"], c["rewound"], c["accepted"]) == (1, 1, 0, 0)
    assert _record(gp)["refused"] == 1 and gp.stats()["refused"] == {"shape": 1}


# -- a ray member on the session's Ray ---------------------------------------------------------------------


@pytest.fixture
def live_shape_fed(ray_session, tmp_path, tiny_yaml):
    """A shape federation (tiny shape learner, no init) whose learner and one ``ray`` member (learn mode,
    a push every 3 slots) are in the session's Ray."""
    address = ray_session.get_runtime_context().gcs_address
    path = _fed_file(tmp_path, tiny_yaml)
    doc = yaml.safe_load(path.read_text())
    doc["learner"].update(ray={"address": address}, http={"enabled": False}, checkpoint_every=1)
    backend = {"kind": "ray", "address": "learner", "config": str(live_config(tmp_path))}
    doc["members"] = [{"name": "live", "mode": "learn", "steps_per_update": 3, "backend": backend}]
    path.write_text(yaml.safe_dump(doc))
    yield ray_session, path
    _cleanup(ray_session, load_federation(path))


@pytest.mark.ray
@pytest.mark.slow
def test_ray_member_pushes_live_shape_pseudo_gradients(live_shape_fed):
    from test_live import small_spec

    from clusters.federation.deploy import down, status, up
    from clusters.runtime import NAMESPACE

    ray, path = live_shape_fed
    assert up(path, wait_s=240)["members"] == ["live"]
    agent = ray.get_actor("fed-test-agent", namespace=NAMESPACE)
    assert ray.get(agent.submit.remote(small_spec("fed-s", epochs=12).model_dump(mode="json")))["ok"]
    wait_for("a live pseudo-gradient at the learner",
             lambda: status(path)["members"][0]["updates"] >= 1, poll_s=1)
    m = status(path)["members"][0]
    assert m["refused"] == 0 and m["joins"] == 1
    # the reply's weights are taken up by the member's next decision (the push runs in a background thread)
    wait_for("the member deciding with the learner's new weights",
             lambda: ray.get(agent.status.remote())["learn"]["version"] >= 1, poll_s=1)
    learn = ray.get(agent.status.remote())["learn"]
    assert learn["mode"] == "learn" and learn["accepted"] >= 1 and learn["refused"] == 0
    assert learn["twin_traces"] >= 1
    assert down(path)["updates"] >= 1
