"""The wire every role of a job speaks: messages, ZeroMQ plumbing, a member's control link, the chunk map.

* :mod:`~elastic_mxnet.protocol.messages` — the validated msgpack headers and array frames;
* :mod:`~elastic_mxnet.protocol.wire` — sending and receiving them on ROUTER and DEALER sockets;
* :mod:`~elastic_mxnet.protocol.link` — a member's registration, heartbeats and rejoin;
* :mod:`~elastic_mxnet.protocol.assignment` — parameter chunks and their owners (what a plan maps).
"""
