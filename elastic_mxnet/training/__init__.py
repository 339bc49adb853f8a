"""The worker role: the elastic Gluon trainer, the demo models, the data sharder (MXNet behind ``_mx``).

* :mod:`~elastic_mxnet.training.trainer` — :class:`ElasticTrainer`, a drop-in for ``gluon.Trainer``;
* :mod:`~elastic_mxnet.training.models` — the demo models and their synthetic data;
* :mod:`~elastic_mxnet.training.sharder` — each worker's share of the samples, re-cut at every plan.
"""
