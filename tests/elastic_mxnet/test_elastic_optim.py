"""The PS optimizers reproduce MXNet's own SGD (with and without momentum) and Adam."""

from __future__ import annotations

import numpy as np
import pytest

from elastic_mxnet import optim
from elastic_mxnet._mx import mx
from elastic_mxnet.protocol.messages import OptimizerSpec


@pytest.mark.parametrize(
    "spec",
    [
        OptimizerSpec(name="sgd", learning_rate=0.1),
        OptimizerSpec(name="sgd", learning_rate=0.05, momentum=0.9, wd=1e-3),
        OptimizerSpec(name="adam", learning_rate=0.01, wd=1e-4),
    ],
    ids=["sgd", "sgd-momentum-wd", "adam"],
)
def test_matches_mxnet_optimizer(spec):
    rng = np.random.default_rng(0)
    w0 = rng.normal(size=50).astype(np.float32)
    kwargs = {"learning_rate": spec.learning_rate, "wd": spec.wd}
    if spec.name == "sgd":
        kwargs["momentum"] = spec.momentum
    updater = mx.optimizer.get_updater(mx.optimizer.create(spec.name, **kwargs))
    weight = mx.nd.array(w0)
    chunk = optim.new_chunk(spec, w0)
    for _ in range(5):
        g = rng.normal(size=50).astype(np.float32)
        updater(0, mx.nd.array(g), weight)
        optim.update(spec, chunk, g)
    np.testing.assert_allclose(chunk.values, weight.asnumpy(), rtol=1e-5, atol=1e-7)
    assert chunk.steps == 5


def test_update_is_elementwise_so_chunking_does_not_matter():
    spec = OptimizerSpec(name="adam", learning_rate=0.01)
    rng = np.random.default_rng(1)
    w, g = rng.normal(size=10).astype(np.float32), rng.normal(size=10).astype(np.float32)
    whole, left, right = (
        optim.new_chunk(spec, w),
        optim.new_chunk(spec, w[:4]),
        optim.new_chunk(spec, w[4:]),
    )
    optim.update(spec, whole, g)
    optim.update(spec, left, g[:4])
    optim.update(spec, right, g[4:])
    assert np.array_equal(whole.values, np.concatenate([left.values, right.values]))


def test_gluon_style_options_are_checked():
    assert optim.spec_from_gluon("SGD", {"learning_rate": 0.1, "momentum": 0.5}).momentum == 0.5
    with pytest.raises(ValueError, match="unsupported optimizer"):
        optim.spec_from_gluon("rmsprop", {})
    with pytest.raises(ValueError, match="clip_gradient"):
        optim.spec_from_gluon("sgd", {"clip_gradient": 1.0})
