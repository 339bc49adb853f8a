"""The coordinator role: membership, plans and the scaling protocol, and how members are started.

* :mod:`~elastic_mxnet.coordination.coordinator` — the coordinator's event loop and handlers;
* :mod:`~elastic_mxnet.coordination.records` — what it keeps of members, requests and operations, and the
  pure rules over them (a scale request's refusal, a rebuilt plan, its status);
* :mod:`~elastic_mxnet.coordination.clock` — the scaling clock;
* :mod:`~elastic_mxnet.coordination.spawner` — the ``Spawner`` protocol and local processes.
"""
