"""Optimizers the parameter servers run on their chunks, with MXNet 1.9.1's update rules.

Element-wise, so a chunk's update does not depend on how parameters are split
into chunks or which PS holds them: that is what lets a chunk migrate between
PS with its state and continue bit for bit. All arrays are flat float32.

``grad`` is the mean gradient over the global batch (the PS divides the sum of
the workers' summed gradients by the number of samples), as Gluon's
``Trainer.step(batch_size)`` does with ``rescale_grad = 1 / batch_size``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from elastic_mxnet.protocol.messages import OptimizerSpec


@dataclass
class ChunkState:
    """One chunk on a PS: values, optimizer state arrays (same shape) and update count."""

    values: np.ndarray
    state: dict[str, np.ndarray] = field(default_factory=dict)
    steps: int = 0


def state_names(spec: OptimizerSpec) -> list[str]:
    """Names of the per-element state arrays of ``spec``'s optimizer, in wire order."""
    if spec.name == "adam":
        return ["mean", "var"]
    return ["mom"] if spec.momentum > 0 else []


def new_chunk(spec: OptimizerSpec, values: np.ndarray) -> ChunkState:
    """A chunk holding a float32 copy of ``values`` and zeroed optimizer state."""
    vals = np.array(values, dtype=np.float32, copy=True).ravel()
    return ChunkState(vals, {n: np.zeros_like(vals) for n in state_names(spec)}, 0)


def update(spec: OptimizerSpec, chunk: ChunkState, grad: np.ndarray) -> None:
    """Apply one step to ``chunk`` in place with mean gradient ``grad`` (float32, same shape).

    SGD (``sgd_mom_update``): ``mom = momentum*mom - lr*(grad + wd*w); w += mom``
    (without momentum: ``w -= lr*(grad + wd*w)``).
    Adam (``adam_update`` with MXNet's bias correction folded into the rate):
    ``t += 1; lr_t = lr*sqrt(1-beta2^t)/(1-beta1^t); g = grad + wd*w;
    m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2; w -= lr_t*m/(sqrt(v)+eps)``.
    """
    w = chunk.values
    g = grad.astype(np.float32, copy=True)
    lr = np.float32(spec.learning_rate)
    if spec.wd:
        g += np.float32(spec.wd) * w
    chunk.steps += 1
    if spec.name == "adam":
        t = chunk.steps
        lr_t = np.float32(spec.learning_rate * np.sqrt(1 - spec.beta2**t) / (1 - spec.beta1**t))
        m, v = chunk.state["mean"], chunk.state["var"]
        # (1 - beta) in float32 arithmetic, as MXNet's kernel computes ``1.f - beta1``:
        # float32(1 - 0.9) and 1.f - float32(0.9) differ in the last bit.
        one, b1, b2 = np.float32(1), np.float32(spec.beta1), np.float32(spec.beta2)
        m *= b1
        m += (one - b1) * g
        v *= b2
        v += (one - b2) * g * g
        w -= lr_t * m / (np.sqrt(v) + np.float32(spec.epsilon))
    elif spec.momentum > 0:
        mom = chunk.state["mom"]
        mom *= np.float32(spec.momentum)
        mom -= lr * g
        w += mom
    else:
        w -= lr * g


def spec_from_gluon(name: str, params: dict[str, float] | None) -> OptimizerSpec:
    """An :class:`OptimizerSpec` from Gluon-style ``Trainer(optimizer, optimizer_params)``.

    Raises:
        ValueError: for an optimizer or option the PS do not implement.
    """
    params = dict(params or {})
    allowed = {"learning_rate", "momentum", "wd", "beta1", "beta2", "epsilon"}
    unknown = set(params) - allowed
    if unknown:
        raise ValueError(
            f"unsupported optimizer_params {sorted(unknown)}; supported {sorted(allowed)}"
        )
    if name.lower() not in ("sgd", "adam"):
        raise ValueError(f"unsupported optimizer {name!r}; use 'sgd' or 'adam'")
    return OptimizerSpec.model_validate({"name": name.lower(), **params})
