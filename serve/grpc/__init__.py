"""The endpoint's gRPC side (the generated protocol is :mod:`serve.proto`): the ``Decider/Decide`` call
over a ``DecisionCore`` (:mod:`.call`: the HTTP route's checks, errors as status codes) and the gRPC
messages ↔ the pydantic messages both ingresses validate with (:mod:`.messages`)."""
