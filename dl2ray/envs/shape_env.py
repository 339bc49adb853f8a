"""The shape policy's slot decision as a gymnasium environment: one step = one slot.

The shape policy (:mod:`dl2ray.policy.shape`) picks one ``(workers, PS)`` menu
row per job and :func:`~dl2ray.policy.shape_decode.decide_shapes` places them. Here the
learner picks the rows; the environment places them with the same decision code.

**Jobs shown.** The first ``J = max_jobs`` jobs of the slot's view (arrival
order; default ``policy.window``). Later jobs wait this slot (they get nothing),
counted in ``info["waiting_jobs"]``. The policy's view is that of the shown
jobs alone (:func:`shown_view`), so with at most ``J`` jobs present it is the
view ``dl2:PATH`` decides on.

**Observation** (a ``Dict``; ``F = enc.job_dim``, ``G = enc.global_dim``,
``K = enc.num_shapes``, all float32):

- ``"jobs"`` ``(J, F)``: :func:`~dl2ray.policy.shape.job_features` rows of the
  shown jobs, zeros below them;
- ``"global"`` ``(G,)``: the global row of the shown jobs;
- ``"job_mask"`` ``(J,)``: 1 for a shown job, 0 for padding;
- ``"action_mask"`` ``(J, K)`` (:func:`menu_mask`): 1 where the menu row is
  within the job's caps (:func:`~dl2ray.policy.shape_decode.cap_mask`) and its demand
  fits the cluster's free total; wait (row 0) always 1; padding rows wait only.

**Action**: ``MultiDiscrete([K] * J)``, each job's menu row (padding rows' are
ignored). :func:`apply_actions` turns it into logits for
:func:`~dl2ray.policy.shape_decode.decide_shapes`: every job that chose a shape is
placed before every job that chose wait (arrival order within each), and a job
gets its row whenever the mask at its turn allows it (work conservation
included); otherwise it gets wait if allowed, else the first allowed menu row.
A row outside the job's caps is treated as wait. Every job that did not get
the row it was given is counted in ``info["masked_actions"]``, as
:class:`~dl2ray.envs.dl2_env.DL2Env` counts masked actions.

**Reward**: :data:`dl2ray.envs.dl2_env.REWARDS` (:func:`dl2ray.envs.dl2_env.step_slot`), paid
every step; slots without jobs are stepped by themselves (empty allocation)
and their reward joins the step before them. Termination, truncation
(``sim.max_slots`` or the cut-off ``max_slots``), ``info`` (``trace_seed``,
``slot``, and on the last step ``metrics``) and seeding are
:class:`~dl2ray.envs.dl2_env.DL2Env`'s; ``masked_actions`` and ``waiting_jobs`` count
over the episode.

**World**: the simulator is the training world (``policy.train_world``, as
:class:`~dl2ray.envs.dl2_env.DL2Env` and our trainers), and the features are computed
from the operator's config (:func:`dl2ray.knowledge.hidden.operator_config`): the
observation reads no hidden truth. Imports gymnasium, never Ray.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from dl2ray.allocation import Allocation
from dl2ray.config import ExperimentConfig
from dl2ray.envs.dl2_env import episode_settings, start_trace, step_slot
from dl2ray.evaluation.metrics import summarize_run
from dl2ray.knowledge.hidden import operator_config
from dl2ray.policy.shape import WAIT, ShapeEncoding, job_features
from dl2ray.policy.shape_decode import ShapeDecision, cap_mask, decide_shapes
from dl2ray.view import ClusterView

#: the logit of a row the job did not choose: low enough that exp() of it relative to the chosen row's 0 is
#: exactly 0 in float64, so decide_shapes's run odds are exactly equal within each group (see apply_actions)
_OTHER = -1e4
_FITS_EPS = 1e-9  # decide_shapes's tolerance on the free total


def shown_view(view: ClusterView, max_jobs: int) -> ClusterView:
    """``view`` with only its first ``max_jobs`` jobs (arrival order)."""
    return view if len(view.jobs) <= max_jobs else dataclasses.replace(view, jobs=view.jobs[:max_jobs])


def menu_mask(view: ClusterView, enc: ShapeEncoding) -> np.ndarray:
    """``(n, K)`` bool: within the job's caps and fitting the free total of ``view`` alone; wait always.

    A superset of every mask :func:`~dl2ray.policy.shape_decode.decide_shapes` gives the job at its turn.
    """
    n = len(view.jobs)
    mask = cap_mask(view, enc)
    if n:
        total = view.free.sum(axis=0)
        wd = np.stack([j.worker_demand for j in view.jobs]).astype(np.float64)  # (n, 3)
        pd = np.stack([j.ps_demand for j in view.jobs]).astype(np.float64)
        s = enc.shapes
        need = s[None, :, 0, None] * wd[:, None, :] + s[None, :, 1, None] * pd[:, None, :]  # (n, K, 3)
        mask &= (need <= total + _FITS_EPS).all(axis=2)
    mask[:, WAIT] = True
    return mask


def action_logits(actions: np.ndarray, caps: np.ndarray) -> np.ndarray:
    """``(n, K)`` float32 logits that make decide_shapes take ``actions`` (n,) where it can
    (:func:`apply_actions`).

    A job that chose a shape: 0 on it, ``_OTHER`` elsewhere (wait included), so its run odds are
    ``-_OTHER``. A job that chose wait: 0 on wait, ``_OTHER`` on its first cap-allowed shape and
    ``2·_OTHER`` on the others, so its run odds are ``_OTHER`` whatever its caps. ``actions`` must be
    within ``caps``.
    """
    n, k = caps.shape
    logits = np.full((n, k), _OTHER, dtype=np.float32)
    waits = actions == WAIT
    shaped = np.flatnonzero(~waits)
    logits[shaped, actions[shaped]] = 0.0
    for j in np.flatnonzero(waits):
        logits[j, 1:] = 2 * _OTHER
        allowed = np.flatnonzero(caps[j, 1:])
        if allowed.size:
            logits[j, 1 + allowed[0]] = _OTHER
        logits[j, WAIT] = 0.0
    return logits


def apply_actions(view: ClusterView, enc: ShapeEncoding, actions: np.ndarray) -> tuple[ShapeDecision, int]:
    """The decision for one menu row per job of ``view`` (``actions`` (n,) int) and how many jobs did not get
    theirs (module docstring). A row outside the job's caps or the menu counts as wait."""
    caps = cap_mask(view, enc)
    n = len(view.jobs)
    acts = np.asarray(actions, dtype=np.int64).reshape(n)
    ok = (acts >= 0) & (acts < enc.num_shapes)
    ok[ok] &= caps[np.flatnonzero(ok), acts[ok]]
    chosen = np.where(ok, acts, WAIT)
    decision = decide_shapes(view, enc, action_logits(chosen, caps))
    return decision, int((decision.actions != acts).sum())


class ShapeEnv(gym.Env):
    """See the module docstring.

    Built like :class:`~dl2ray.envs.dl2_env.DL2Env` (keywords, or one ``env_config`` mapping holding ``cfg``,
    ``trace_seeds``, ``reward``, ``max_slots``), plus ``max_jobs`` (``J``; default ``policy.window``).
    """

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012  (gymnasium's class attribute)

    def __init__(self, env_config: Mapping[str, Any] | None = None, *, cfg: ExperimentConfig | None = None,
                 trace_seeds: Sequence[int] | None = None, reward: str | None = None,
                 max_slots: int | None = None, max_jobs: int | None = None) -> None:
        s = episode_settings(env_config, cfg, trace_seeds, reward, max_slots)
        self.cfg, self.trace_seeds, self.reward_kind = s.cfg, s.trace_seeds, s.reward
        self.max_slots = s.max_slots
        jobs = max_jobs if max_jobs is not None else (env_config or {}).get("max_jobs")
        self.max_jobs = int(jobs) if jobs is not None else s.cfg.policy.window
        if self.max_jobs < 1:
            raise ValueError(f"max_jobs: {self.max_jobs}: must be at least 1")
        self.enc = ShapeEncoding.from_config(operator_config(s.cfg))
        self.sim = s.simulator()
        J, K = self.max_jobs, self.enc.num_shapes
        self.observation_space = spaces.Dict({
            "jobs": spaces.Box(-1.0, np.inf, (J, self.enc.job_dim), np.float32),
            "global": spaces.Box(0.0, np.inf, (self.enc.global_dim,), np.float32),
            "job_mask": spaces.Box(0.0, 1.0, (J,), np.float32),
            "action_mask": spaces.Box(0.0, 1.0, (J, K), np.float32),
        })
        self.action_space = spaces.MultiDiscrete([K] * J)
        self._view: ClusterView | None = None
        self._masked = self._waiting = 0
        self.trace_seed = -1

    @property
    def view(self) -> ClusterView | None:
        """The slot's whole view the next action decides (None before reset and after the episode)."""
        return self._view

    # -- gymnasium API -----------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """``options={"trace_seed": s}`` runs trace ``s``; otherwise a trace drawn among ``trace_seeds``."""
        super().reset(seed=seed)
        start_trace(self._start, self.trace_seeds, self.np_random, options)
        return self._obs(), self._info()

    def step(self, action):
        if self._view is None:
            raise RuntimeError("step() before reset() or after the episode ended")
        acts = np.asarray(action, dtype=np.int64).reshape(-1)
        if acts.shape != (self.max_jobs,):
            raise ValueError(f"action: {acts.size} menu rows; the action space has {self.max_jobs}")
        view = self._view
        shown = shown_view(view, self.max_jobs)
        decision, masked = apply_actions(shown, self.enc, acts[:len(shown.jobs)])
        self._masked += masked
        self._waiting += len(view.jobs) - len(shown.jobs)
        reward = step_slot(self.sim, decision.allocation, self.reward_kind)
        more, ended, truncated = self._advance()
        reward += more
        if ended:
            self._view = None
            info = {**self._info(), "metrics": summarize_run(self.sim.result)}
            return self._empty_obs(), reward, not truncated, truncated, info
        return self._obs(), reward, False, False, self._info()

    # -- internals ---------------------------------------------------------------------------

    def _start(self, trace_seed: int) -> bool:
        """Reset the simulator on ``trace_seed``; False if the run ends before any decision."""
        self.trace_seed = trace_seed
        self.sim.reset(trace_seed)
        self._masked = self._waiting = 0
        _, ended, _ = self._advance()
        return not ended

    def _advance(self) -> tuple[float, bool, bool]:
        """Step slots without jobs; ``(their reward, episode ended, truncated)``; else ``_view`` is the next
        slot's view."""
        reward = 0.0
        while True:
            if self.sim.done or self.sim.slot >= self.max_slots:
                return reward, True, self.sim.slot >= self.max_slots
            view = self.sim.view()
            if view.jobs:
                self._view = view
                return reward, False, False
            reward += step_slot(self.sim, Allocation.empty(), self.reward_kind)

    def _obs(self) -> dict[str, np.ndarray]:
        assert self._view is not None
        shown = shown_view(self._view, self.max_jobs)
        n = len(shown.jobs)
        x, g = job_features(shown, self.enc)
        obs = self._empty_obs()
        obs["jobs"][:n] = x
        obs["global"][:] = g
        obs["job_mask"][:n] = 1.0
        obs["action_mask"][:n] = menu_mask(shown, self.enc)
        return obs

    def _empty_obs(self) -> dict[str, np.ndarray]:
        """No job: zeros, padding rows that allow wait only."""
        J, K = self.max_jobs, self.enc.num_shapes
        menu = np.zeros((J, K), np.float32)
        menu[:, WAIT] = 1.0
        return {"jobs": np.zeros((J, self.enc.job_dim), np.float32),
                "global": np.zeros(self.enc.global_dim, np.float32),
                "job_mask": np.zeros(J, np.float32), "action_mask": menu}

    def _info(self) -> dict[str, Any]:
        return {"trace_seed": self.trace_seed, "slot": self.sim.slot, "masked_actions": self._masked,
                "waiting_jobs": self._waiting}
