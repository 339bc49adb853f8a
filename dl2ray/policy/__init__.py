"""The DL2 policy: state/action encoding, networks, and the incremental decision loop.

``encoding`` and ``decision`` are pure numpy; ``network`` imports torch.
"""
