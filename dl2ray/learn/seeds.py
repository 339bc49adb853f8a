"""The three disjoint trace-seed sets: training, validation (model selection), test (reporting).

Every learner draws its traces from :func:`training`, chooses models on
:func:`validation`, and numbers reported in ``docs/`` come only from
:func:`test`. The ranges are far from the small seeds ``dl2ray compare`` uses
by default, so an ad-hoc comparison never reuses a training trace by accident.
"""

from __future__ import annotations

TRAINING = range(1_000_000, 2_000_000)
VALIDATION = range(2_000_000, 2_100_000)
TEST = range(3_000_000, 3_100_000)


def _take(seeds: range, n: int, offset: int) -> list[int]:
    if n < 0 or offset < 0 or offset + n > len(seeds):
        raise ValueError(f"need 0 <= offset ({offset}) and offset + n ({offset + n}) <= {len(seeds)}")
    return list(seeds[offset:offset + n])


def training(n: int, offset: int = 0) -> list[int]:
    """The training seeds ``offset .. offset+n-1`` of the training set."""
    return _take(TRAINING, n, offset)


def validation(n: int, offset: int = 0) -> list[int]:
    return _take(VALIDATION, n, offset)


def test(n: int, offset: int = 0) -> list[int]:
    return _take(TEST, n, offset)


def which(seed: int) -> str:
    """``"training"``, ``"validation"``, ``"test"`` or ``"none"``: the set a seed belongs to."""
    for name, r in (("training", TRAINING), ("validation", VALIDATION), ("test", TEST)):
        if seed in r:
            return name
    return "none"
