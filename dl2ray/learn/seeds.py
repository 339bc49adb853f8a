"""The trace-seed sets moved to :mod:`dl2ray.seeds` (the simulator's traces, gang mode and the gymnasium env
read them, below the learners). Kept so that ``from dl2ray.learn import seeds`` goes on working."""

from dl2ray.seeds import SPENT_TEST, TEST, TRAINING, VALIDATION, test, training, validation, which

__all__ = ["SPENT_TEST", "TEST", "TRAINING", "VALIDATION", "test", "training", "validation", "which"]
