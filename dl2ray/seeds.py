"""The three disjoint trace-seed sets: training, validation (model selection), test (reporting).

Every learner draws its traces from :func:`training`, chooses models on
:func:`validation`, and numbers reported in ``docs/`` come only from
:func:`test`. The ranges are far from the small seeds ``dl2ray compare`` uses
by default, so an ad-hoc comparison never reuses a training trace by accident.
"""

from __future__ import annotations

TRAINING = range(1_000_000, 2_000_000)
VALIDATION = range(2_000_000, 2_100_000)
TEST = range(4_000_000, 4_100_000)
"""The test set of the realistic round (issue 21). Every shipped model is tested on it once."""
SPENT_TEST = range(3_000_000, 3_100_000)
"""The test set of the clairvoyant rounds, used across four shipping rounds: spent. Its numbers stay
reproducible with the ``*-clairvoyant`` configs and ``--seed 3000000``; no new result is reported on it."""

TWIN = range(9_000_000, 10_000_000)
"""The seeds of a twin's own draws (:mod:`dl2ray.learn.shape.twin`): per-job speed factors and slot noise of a
replayed observed trace. Never the seed of a real trace, so a twin never re-draws its cluster's hidden
factors."""


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


def twin(n: int, offset: int = 0) -> list[int]:
    """The twin seeds ``offset .. offset+n-1`` (wrapping around the set)."""
    return [TWIN[(offset + i) % len(TWIN)] for i in range(n)]


def which(seed: int) -> str:
    """The set a seed is in: ``"training"``, ``"validation"``, ``"test"``, ``"spent-test"``, ``"twin"``
    or ``"none"``."""
    sets = (("training", TRAINING), ("validation", VALIDATION), ("test", TEST), ("spent-test", SPENT_TEST),
            ("twin", TWIN))
    for name, r in sets:
        if seed in r:
            return name
    return "none"
