"""elastic_mxnet: hot scaling of parameter servers and workers for MXNet Gluon jobs.

A job is a coordinator, parameter servers (PS) and workers talking ZeroMQ
(see ``docs/elastic_mxnet.md``). Users swap ``gluon.Trainer`` for
:class:`elastic_mxnet.training.trainer.ElasticTrainer`; schedulers drive a running job
through :class:`elastic_mxnet.job.ElasticJob`.

Importing this package does not import MXNet; only ``trainer``, ``models``,
``baseline`` and the demo training script do (through ``_mx``).
"""

__version__ = "0.1.0"
