"""The one place that imports MXNet.

MXNet 1.9.1 still refers to ``numpy.bool``, an alias NumPy removed in 1.24;
importing it on numpy>=1.24 raises ``AttributeError``. Restoring the alias
(to ``numpy.bool_``, which is what it always meant) before ``import mxnet``
is the whole fix. Every other module of this package imports MXNet as
``from elastic_mxnet._mx import mx``.
"""

from __future__ import annotations

import numpy

if "bool" not in vars(numpy):  # hasattr() would trigger numpy 1.26's FutureWarning
    numpy.bool = numpy.bool_  # type: ignore[attr-defined]

import mxnet as mx

__all__ = ["mx"]
