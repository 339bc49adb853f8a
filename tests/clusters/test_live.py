"""Live jobs on the session's local Ray: real elastic MXNet members as Ray actors, scaled slot by slot.

Slow (each member is a process that imports MXNet): kept to a few tiny MLP jobs.
Every wait polls live state for an event; its deadline counts only time without progress (hang
protection), so a loaded machine makes a test slower, never failed.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from support import wait_for

from dl2ray.config import load_config
from dl2ray.jobspec import JobSpec, parse_jobspec
from dl2ray.view import Allocation, Tasks

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.ray, pytest.mark.slow]


def small_spec(name: str, **change) -> JobSpec:
    raw = {
        "name": name,
        "job_type": "resnext-110",
        "model": "mlp",
        "epochs": 10,
        "samples": 256,
        "global_batch": 32,
        "optimizer": {"name": "sgd", "learning_rate": 0.05, "momentum": 0.9},
        "worker": {"cpu": 0.2, "gpu": 0, "mem": 0.1},
        "ps": {"cpu": 0.2, "gpu": 0, "mem": 0.1},
        "workers": {"min": 1, "max": 3},
        "ps_count": {"min": 1, "max": 2},
        "seed": 3,
        "sample_delay_s": 0.01,
    }
    return parse_jobspec({**raw, **change})


@pytest.fixture
def backend(ray_session):
    from clusters.agent.backend import LiveBackend
    from clusters.ray.backend import RayBackend

    cat = load_config(ROOT / "configs" / "testbed.yaml").catalogue
    be = RayBackend(cat, slot_seconds=1.0, epoch=time.time(), apply_wait_s=180.0)
    assert isinstance(be, LiveBackend)  # the interface a Kubernetes backend implements too
    names: list[str] = []
    yield be, names
    for name in names:
        be.remove(name)


def _job(view, job_id):
    return next((j for j in view.jobs if j.job_id == job_id), None)


def reference_params(spec: JobSpec) -> list[np.ndarray]:
    """The same training in one process with stock ``gluon.Trainer`` (no PS, no scaling)."""
    from elastic_mxnet._mx import mx
    from elastic_mxnet.training import models
    from elastic_mxnet.training.sharder import DataSharder

    net = models.build(spec.model)
    models.init_params(net, spec.seed)
    x, y = models.synthetic_data(spec.model, spec.samples, spec.seed + 1)
    opt = {"learning_rate": spec.optimizer.learning_rate, "momentum": spec.optimizer.momentum}
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", opt, kvstore=None)
    sharder = DataSharder(spec.samples, spec.global_batch, spec.seed)
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    for t in range(spec.iterations):
        idx = sharder.global_indices(t)
        with mx.autograd.record():
            loss = loss_fn(net(mx.nd.array(x[idx])), mx.nd.array(y[idx]))
        loss.backward()
        trainer.step(len(idx))
    return [p.data().asnumpy() for p in net.collect_params().values()]


def test_scale_up_down_pause_resume_finish_equals_unscaled_training(backend, tmp_path: Path) -> None:
    be, names = backend
    # 30 epochs: on a loaded machine a scale-up (a new worker process importing MXNet) can take 30 s, and
    # the job must still be training when it lands
    spec = small_spec("live-scaled", output=str(tmp_path / "params.npz"), epochs=30)
    names.append(spec.name)
    jid = be.submit(spec)["job_id"]

    view = be.snapshot()
    assert (_job(view, jid).workers, _job(view, jid).ps) == (0, 0)  # pending: arrived, not running

    def run_with(ps: int, workers: int) -> None:
        tasks = {jid: Tasks(workers, ps)} if workers else {}
        be.snapshot()
        report = be.apply(Allocation(tasks))
        assert [a.ok for a in report.actions] == [True], report

    def epochs() -> float:
        return be.statuses()[spec.name]["epochs_done"]

    run_with(1, 1)
    wait_for("progress with 1 PS + 1 worker", lambda: epochs() > 0.5, progress=epochs)
    run_with(2, 3)
    view = be.snapshot()
    j = _job(view, jid)
    assert (j.ps, j.workers) == (2, 3) and len(j.worker_nodes) == 3
    e0 = epochs()
    wait_for("progress with 2 PS + 3 workers", lambda: epochs() > e0 + 0.5, progress=epochs)
    run_with(1, 1)
    assert (_job(be.snapshot(), jid).ps, _job(be.snapshot(), jid).workers) == (1, 1)

    run_with(0, 0)  # pause
    st = be.statuses()[spec.name]
    assert st["state"] == "paused" and st["workers"] == 0 and st["ps"] == 1
    view = be.snapshot()
    assert (_job(view, jid).workers, _job(view, jid).ps) == (0, 0)
    assert (view.free[:, 0] == view.capacity[:, 0] - spec.ps.cpu).all()  # the kept PS holds its share
    # the coordinator learns the PS's last update (the pause's clock) from its next heartbeat
    pause_clock = st["events"][-1]["clock"]
    wait_for("the PS's last update before the pause",
             lambda: be.statuses()[spec.name]["iteration"] >= pause_clock)
    paused_at = epochs()
    time.sleep(2.0)  # a window in which nothing may train (a slow machine only makes nothing more likely)
    assert epochs() == paused_at  # nothing trains while paused
    assert paused_at < spec.epochs

    run_with(1, 2)  # resume
    st = wait_for("the job to finish", lambda: (s := be.statuses()[spec.name])["state"] == "finished" and s,
                  progress=epochs)
    assert st["members"] == []  # every member ended, its resources freed
    assert _job(be.snapshot(), jid) is None
    changes = [e["change"] for e in st["events"]]
    assert changes[0] == "start" and len(changes) == 5, changes
    assert any(e["suspension_ms"] for e in st["events"][1:])

    got = np.load(spec.output)
    ref = reference_params(spec)
    assert int(got["iteration"]) == spec.iterations
    for i, r in enumerate(ref):
        a = got[f"arr_{i}"]
        assert np.linalg.norm(a - r) <= 1e-5 * np.linalg.norm(r), f"parameter {i} differs"


def test_killed_member_is_dropped_and_the_next_view_shows_it(backend) -> None:
    be, names = backend
    spec = small_spec("live-kill", epochs=40)
    names.append(spec.name)
    jid = be.submit(spec)["job_id"]
    be.snapshot()
    assert [a.ok for a in be.apply(Allocation({jid: Tasks(2, 1)})).actions] == [True]
    assert _job(be.snapshot(), jid).workers == 2
    host = be.hosts()[spec.name]
    import ray

    killed = ray.get(host.kill_member.remote("worker"))
    assert killed is not None
    st = wait_for(
        "the coordinator to drop the worker",
        lambda: (
            (s := be.statuses()[spec.name])["workers"] == 1
            and any(e["change"].startswith("recover") for e in s["events"])
            and s
        ),
    )
    assert all(m["name"] != killed for m in st["members"])
    view = be.snapshot()
    assert _job(view, jid).workers == 1 and len(_job(view, jid).worker_nodes) == 1
    e0 = st["epochs_done"]
    wait_for("training to go on with the survivor", lambda: be.statuses()[spec.name]["epochs_done"] > e0)
    assert be.cancel(spec.name)["ok"]
    st = be.statuses()[spec.name]
    assert st["state"] == "cancelled" and st["members"] == []
