"""End to end: real jobs (launcher, coordinator, PS and MXNet workers as processes).

Scaling events at set iterations (workers are held at a gate before each one
until the scale call returned, so the events happen exactly there) must not
change the result: the parameters equal those of plain ``gluon.Trainer``
training on the same global batches, up to float summation order.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from elastic_mxnet.job import ElasticJob, ScaleRefused

pytestmark = pytest.mark.slow

ITERATIONS = 50
EVENTS = [(10, {"ps": 2}), (20, {"workers": 3}), (30, {"ps": 1}), (40, {"workers": 2})]
CHANGES = ["add_ps", "add_worker", "remove_ps", "remove_worker"]


@pytest.mark.parametrize(
    "model, optimizer, lr",
    [("mlp", "sgd", 0.05), ("cnn", "adam", 0.01)],
    ids=["mlp-sgd-momentum", "cnn-adam"],
)
def test_scaling_events_do_not_change_the_result(
    launch_job, reference, tmp_path, model, optimizer, lr
):
    out = tmp_path / "final.npz"
    gates = ",".join(str(k) for k, _ in EVENTS)
    worker_args = [
        "--model",
        model,
        "--optimizer",
        optimizer,
        "--lr",
        str(lr),
        "--iterations",
        str(ITERATIONS),
        "--gate-dir",
        str(tmp_path),
        "--gates",
        gates,
        "--out",
        str(out),
    ]
    job = launch_job(["--ps", "1", "--workers", "2", "--chunk-elems", "500"], worker_args)
    job.wait_for(lambda st: st.state == "running", "the first plan")
    for iteration, target in EVENTS:
        reply = job.job.scale(at_iteration=iteration, **target)
        assert reply.clock == iteration
        job.open_gate(iteration)
    assert job.wait_exit() == 0

    final = np.load(out)
    assert int(final["iteration"]) == ITERATIONS
    expected = reference(model, ITERATIONS, optimizer, lr)
    rel = [
        float(np.linalg.norm(final[f"arr_{i}"] - want) / np.linalg.norm(want))
        for i, want in enumerate(expected)
    ]
    assert max(rel) <= 1e-5, f"relative differences per parameter: {rel}"


def test_scale_requests_are_validated(launch_job, tmp_path):
    job = launch_job(
        ["--ps", "1", "--workers", "1", "--max-ps", "2"],
        ["--iterations", "0", "--iter-sleep", "0.01"],
    )
    job.wait_for(lambda st: st.state == "running" and st.version >= 2, "training")

    with pytest.raises(ScaleRefused, match="outside the limits"):
        job.job.scale(ps=3)
    with pytest.raises(ScaleRefused, match="outside the limits"):
        job.job.scale(workers=0)
    with pytest.raises(ScaleRefused, match="already started"):
        job.job.scale(ps=2, at_iteration=0)
    assert job.job.scale(ps=1).reason == "no change"

    # one operation at a time: a second request while the first waits for its new PS
    with ThreadPoolExecutor(1) as pool, ElasticJob(job.address, timeout_s=120) as other:
        first = pool.submit(other.scale, ps=2)
        job.wait_for(lambda st: st.operation == "add_ps", "the first request")
        with pytest.raises(ScaleRefused, match="busy"):
            job.job.scale(workers=2)
        assert first.result(timeout=120).ok
    assert [m.role for m in job.status().members].count("ps") == 2
    job.job.stop()
    assert job.wait_exit() == 0
