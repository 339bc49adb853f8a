"""Job-aware exploration (the DL2 paper's): correct a job whose partial allocation is poor (pure numpy).

During a slot's decision every job of the window has a partial allocation of
``w`` workers and ``p`` PS (what the loop has given it so far this slot). Three
states are *poor* — the job cannot train well, or at all, with them — and
each has one *correcting action*:

====================================  ===================  =================
poor state                            condition            correction
====================================  ===================  =================
workers without PS                    ``w > 0, p = 0``     +1 PS
PS without workers                    ``p > 0, w = 0``     +1 worker
worker/PS ratio beyond the threshold  ``w > θ·p``          +1 PS
                                      ``p > θ·w``          +1 worker
====================================  ===================  =================

``θ`` is ``policy.exploration_ratio`` (default 4). It flags only clearly
lopsided deployments (more than four workers per PS, or four PS per worker)
and leaves moderate ratios, which the speed surfaces favour differently per
model, for the policy to learn.

At each inference, after the policy has chosen an action: if some job of the
window is in a poor state *and* its correcting action is allowed by the mask,
then with probability ``ε`` (``policy.exploration_eps``) the action is replaced
by the correcting action of one such job, chosen uniformly among them. Draws
come from an explicit generator, and only when a poor job exists (one uniform
draw for ε, one integer draw for the job), so the generator's stream depends
only on what the loop saw.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dl2ray.policy.encoding import PS, WORKER, Encoding


def correction(workers: int, ps: int, ratio: float) -> int | None:
    """The correcting action kind (WORKER or PS) for a job with ``workers``/``ps`` this slot, or None."""
    if workers > 0 and ps == 0:
        return PS
    if ps > 0 and workers == 0:
        return WORKER
    if workers > ratio * ps:
        return PS
    if ps > ratio * workers:
        return WORKER
    return None


def corrections(counts: list[tuple[int, int]], mask: np.ndarray, enc: Encoding, ratio: float) -> list[int]:
    """Allowed correcting actions, one per poor job of the window (row order).

    ``counts[i]`` is ``(workers, ps)`` of window row ``i``; ``mask`` shape ``(3J+1,)``.
    """
    out = []
    for row, (w, p) in enumerate(counts):
        kind = correction(w, p, ratio)
        if kind is not None:
            a = enc.action(kind, row)
            if mask[a]:
                out.append(a)
    return out


@dataclass(frozen=True)
class JobAwareExploration:
    """``ε`` and the ratio threshold ``θ`` of the rules in the module docstring."""

    eps: float
    ratio: float = 4.0

    @classmethod
    def from_config(cls, cfg) -> JobAwareExploration:
        return cls(cfg.policy.exploration_eps, cfg.policy.exploration_ratio)

    def apply(self, action: int, counts: list[tuple[int, int]], mask: np.ndarray, enc: Encoding,
              rng: np.random.Generator) -> int:
        """``action``, or with probability ε the correcting action of a poor job (if any is allowed)."""
        options = corrections(counts, mask, enc, self.ratio)
        if not options or rng.random() >= self.eps:
            return action
        return options[int(rng.integers(len(options)))] if len(options) > 1 else options[0]
