"""Learners of the DL2 policy: supervised warm-start (``sl``) now; actor-critic and A3C next.

``seeds`` and ``teacher`` are pure numpy; ``sl`` imports torch.
"""
