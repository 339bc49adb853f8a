"""Small Gluon models and synthetic data for the tests, the demo and the benchmark.

Parameters are initialised from an explicit NumPy generator, by order, so two
processes (or two runs) given the same seed start from identical values.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from elastic_mxnet._mx import mx

gluon = mx.gluon
nn = mx.gluon.nn

Net = Any
"""A Gluon block (MXNet ships no type information)."""

IMAGE_SHAPE = (1, 12, 12)
"""Channels, height, width of the CNN's synthetic images."""


def mlp(in_units: int, hidden: list[int], classes: int) -> Net:
    """Dense-ReLU stack with known input sizes (no deferred initialisation)."""
    net = nn.HybridSequential(prefix="mlp_")
    with net.name_scope():
        units = in_units
        for h in hidden:
            net.add(nn.Dense(h, activation="relu", in_units=units))
            units = h
        net.add(nn.Dense(classes, in_units=units))
    return net


def mlp_hidden_for(params: int, in_units: int, classes: int) -> int:
    """Width ``h`` of a two-hidden-layer MLP with about ``params`` parameters.

    Count: ``in*h + h + h*h + h + h*classes + classes``; solved for ``h``.
    """
    b = in_units + classes + 2
    return max(1, round((-b + math.sqrt(b * b + 4 * (params - classes))) / 2))


def small_cnn(classes: int) -> Net:
    """Conv(8,3x3)-ReLU-MaxPool(2)-Conv(16,3x3)-ReLU-Dense on 1x12x12 images (~4 k params)."""
    net = nn.HybridSequential(prefix="cnn_")
    with net.name_scope():
        net.add(nn.Conv2D(8, 3, in_channels=1, activation="relu"))
        net.add(nn.MaxPool2D(2))
        net.add(nn.Conv2D(16, 3, in_channels=8, activation="relu"))
        net.add(nn.Flatten())
        net.add(nn.Dense(classes, in_units=16 * 3 * 3))
    return net


def build(model: str, params: int = 0, in_units: int = 32, classes: int = 10) -> Net:
    """``mlp`` (32-64-10), ``cnn`` or ``mlp-params`` (two hidden layers sized for ``params``)."""
    if model == "mlp":
        return mlp(in_units, [64], classes)
    if model == "cnn":
        return small_cnn(classes)
    if model == "mlp-params":
        h = mlp_hidden_for(params, in_units, classes)
        return mlp(in_units, [h, h], classes)
    raise ValueError(f"unknown model {model!r}: use mlp, cnn or mlp-params")


def init_params(net: Net, seed: int) -> None:
    """Glorot-uniform weights and zero biases, drawn in parameter order from ``seed``."""
    net.initialize(mx.init.Zero())
    rng = np.random.default_rng(seed)
    for p in net.collect_params().values():
        shape = p.shape
        if len(shape) == 1:
            value = np.zeros(shape, np.float32)
        else:
            fan_out, fan_in = shape[0], int(np.prod(shape[1:]))
            receptive = int(np.prod(shape[2:])) if len(shape) > 2 else 1
            bound = math.sqrt(6.0 / (fan_in + fan_out * receptive))
            value = rng.uniform(-bound, bound, size=shape).astype(np.float32)
        p.set_data(mx.nd.array(value))


def num_params(net: Net) -> int:
    """Number of scalar parameters."""
    return sum(int(np.prod(p.shape)) for p in net.collect_params().values())


def synthetic_data(
    model: str, num_samples: int, seed: int, in_units: int = 32, classes: int = 10
) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and integer labels from a random linear teacher.

    Shapes: ``(num_samples, in_units)`` float32 for MLPs, ``(num_samples, 1, 12, 12)``
    for the CNN; labels ``(num_samples,)`` float32 in ``[0, classes)``.
    """
    rng = np.random.default_rng(seed)
    shape = (num_samples, *IMAGE_SHAPE) if model == "cnn" else (num_samples, in_units)
    x = rng.normal(size=shape).astype(np.float32)
    teacher = rng.normal(size=(int(np.prod(shape[1:])), classes))
    y = np.argmax(x.reshape(num_samples, -1) @ teacher, axis=1).astype(np.float32)
    return x, y
