"""The DL2 decision loop as a gymnasium environment: one step = one inference.

Observation (a ``Dict``, the layout RLlib's action-masking modules expect):

- ``"observations"``: the current window's state, shape ``(J·(L+5),)`` float32
  in ``[0, 1]`` (:func:`dl2ray.policy.encoding.SlotState.state`);
- ``"action_mask"``: shape ``(3J+1,)`` float32, 1 where the action is feasible
  (:meth:`~dl2ray.policy.encoding.SlotState.mask`; the stop action is always 1).

Action: ``Discrete(3J+1)`` in the encoding's order (stop last). A non-stop
action places its tasks; stop ends the current window. A window with no
feasible non-stop action is skipped, as in
:func:`~dl2ray.policy.decision.run_decision`; after the last window the slot's
allocation is stepped in the simulator. An action the mask forbids is treated
as stop (counted in ``info["masked_actions"]``), so learners without masking run.

Reward (``reward=``, paid in the step that ends a slot, 0 for steps inside a slot;
slots with no decision to make are stepped automatically and their reward joins
the next reward paid):

- ``"paper"`` (default, the DL2 paper's): ``r_t = Σ_j epochs_j(t)/E_j``. Its
  episode return is the number of jobs for *every* policy that finishes the
  trace, so it says nothing about JCT (RLlib's ``episode_return_mean`` stays flat).
- ``"jct"``: ``r_t = −Σ_j time job j spent in the cluster during slot t`` (slots;
  1 for a job present all slot, the fraction until it finished otherwise). The
  episode return is minus the total JCT, unfinished jobs counted until the run
  stopped: ``−N · censored_avg_jct`` (:func:`dl2ray.evaluation.metrics.censored_avg_jct`).
- ``"avg_jct"``: the ``"jct"`` reward divided by the trace's number of jobs N:
  the return is ``−censored_avg_jct``, the metric our trainer selects models on.

The episode terminates when the trace completes, and is truncated when
``sim.max_slots`` or the early cut-off ``max_slots`` (if given; for hopeless
episodes, e.g. a greedy policy that starves jobs) is reached first.

Info: every step has ``trace_seed``, ``slot`` and ``masked_actions``; the last
step of an episode also has ``metrics``, :func:`dl2ray.evaluation.metrics.summarize_run` of
the run so far (``avg_jct``, ``censored_avg_jct``, ``makespan``, ``completed``,
… in slots): what ``dl2ray simulate`` reports for the same trace and allocations
(with ``sim.max_slots`` = the cut-off when the cut-off ended the episode).

Seeding: ``reset(options={"trace_seed": s})`` runs trace ``s`` (any seed, e.g.
a test seed); otherwise ``reset(seed=s)`` seeds ``np_random``, which draws the
trace among ``trace_seeds`` (default: the first 100 training seeds). The
simulator is deterministic given the trace seed. Imports gymnasium, never Ray.

The settings, trace choice and slot reward are shared with the shape policy's
environment (:mod:`dl2ray.envs.shape_env`): :func:`episode_settings`,
:func:`start_trace`, :func:`step_slot`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from dl2ray import seeds as seedsets
from dl2ray.allocation import Allocation
from dl2ray.config import ExperimentConfig, load_config
from dl2ray.evaluation.metrics import summarize_run
from dl2ray.policy.encoding import Encoding, SlotState
from dl2ray.sim import Simulator

REWARDS = ("paper", "jct", "avg_jct")
"""The reward options (see the module docstring); ``"paper"`` is the default."""


@dataclass(frozen=True)
class EpisodeSettings:
    """What every environment of this project reads from ``env_config`` and keywords (:class:`DL2Env`)."""

    cfg: ExperimentConfig
    trace_seeds: list[int]  # traces reset() draws from
    reward: str  # one of REWARDS
    max_slots: int  # the episode's cut-off, slots (at most sim.max_slots)

    def simulator(self) -> Simulator:
        """The training world's simulator (``policy.train_world``: the truth, or the operator's profile)."""
        from dl2ray.world import build_simulator

        return build_simulator(self.cfg, world=self.cfg.policy.train_world)


def episode_settings(env_config: Mapping[str, Any] | None, cfg: ExperimentConfig | str | None,
                     trace_seeds: Sequence[int] | None, reward: str | None, max_slots: int | None
                     ) -> EpisodeSettings:
    """Keywords win over ``env_config``; a ValueError names a bad field."""
    opts = dict(env_config or {})
    cfg = cfg or opts.get("cfg")
    if not isinstance(cfg, ExperimentConfig):
        cfg = load_config(cfg)
    seeds = list(trace_seeds or opts.get("trace_seeds") or seedsets.training(100))
    kind = reward or opts.get("reward") or "paper"
    if kind not in REWARDS:
        raise ValueError(f"reward: {kind!r}; known: {list(REWARDS)}")
    cutoff = max_slots if max_slots is not None else opts.get("max_slots")
    if cutoff is not None and int(cutoff) < 1:
        raise ValueError(f"max_slots: {cutoff}: must be at least 1")
    limit = min(int(cutoff), cfg.sim.max_slots) if cutoff is not None else cfg.sim.max_slots
    return EpisodeSettings(cfg, seeds, kind, limit)


def start_trace(start: Callable[[int], bool], trace_seeds: Sequence[int], rng: np.random.Generator,
                options: Mapping[str, Any] | None) -> None:
    """Start an episode: ``options["trace_seed"]`` if given, else traces drawn among ``trace_seeds`` with
    ``rng`` until ``start(trace_seed)`` (False: the run ended before any decision) finds a decision."""
    chosen = (options or {}).get("trace_seed")
    if chosen is not None:
        if start(int(chosen)):
            return
        raise ValueError(f"trace {chosen}: no decision to make (every slot stepped by itself)")
    for _ in range(len(trace_seeds)):
        if start(int(trace_seeds[int(rng.integers(len(trace_seeds)))])):
            return
    raise RuntimeError("no trace among trace_seeds has a decision to make")


def step_slot(sim: Simulator, allocation: Allocation, reward: str) -> float:
    """Step ``sim`` one slot with ``allocation``; that slot's reward of kind ``reward`` (module docstring)."""
    t, present = sim.slot, list(sim.jobs)
    res = sim.step(allocation)
    if reward == "paper":
        return float(res.reward)
    end = sim.result.end_time
    # Time each job present during slot t spent in the cluster: until t+1, or until it finished.
    held = sum(min(end.get(j, t + 1.0), t + 1.0) - t for j in present)
    if reward == "avg_jct":
        held /= max(len(sim.result.arrival), 1)
    return -float(held)


class DL2Env(gym.Env):
    """See the module docstring.

    Build with keywords, or (as RLlib does) with one ``env_config`` mapping
    holding ``cfg`` (an :class:`ExperimentConfig` or a YAML path; default the
    testbed), ``trace_seeds``, ``reward`` (one of :data:`REWARDS`) and
    ``max_slots`` (the early cut-off, slots; ``None``: ``sim.max_slots``).
    Keywords win over ``env_config``.
    """

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012  (gymnasium's class attribute)

    def __init__(self, env_config: Mapping[str, Any] | None = None, *, cfg: ExperimentConfig | None = None,
                 trace_seeds: Sequence[int] | None = None, reward: str | None = None,
                 max_slots: int | None = None) -> None:
        s = episode_settings(env_config, cfg, trace_seeds, reward, max_slots)
        self.cfg, self.trace_seeds, self.reward_kind = s.cfg, s.trace_seeds, s.reward
        self.max_slots = s.max_slots
        self.enc = Encoding.from_config(s.cfg)
        self.sim = s.simulator()
        self.observation_space = spaces.Dict({
            "observations": spaces.Box(0.0, 1.0, (self.enc.state_dim,), np.float32),
            "action_mask": spaces.Box(0.0, 1.0, (self.enc.action_dim,), np.float32),
        })
        self.action_space = spaces.Discrete(self.enc.action_dim)
        self._slot: SlotState | None = None
        self._window = 0
        self._masked = 0
        self.trace_seed = -1

    # -- gymnasium API -----------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """``options={"trace_seed": s}`` runs trace ``s``; otherwise a trace drawn among ``trace_seeds``."""
        super().reset(seed=seed)
        start_trace(self._start, self.trace_seeds, self.np_random, options)
        return self._obs(), self._info()

    def step(self, action):
        if self._slot is None:
            raise RuntimeError("step() before reset() or after the episode ended")
        a = int(action)
        mask = self._slot.mask()
        if not (0 <= a < self.enc.action_dim and mask[a]):
            a, self._masked = self.enc.stop, self._masked + 1
        if a == self.enc.stop:
            self._window += 1
        else:
            self._slot.apply(a)
        reward, ended, truncated = self._advance()
        if ended:
            self._slot = None
            obs = {"observations": np.zeros(self.enc.state_dim, np.float32),
                   "action_mask": self._stop_only()}
            info = {**self._info(), "metrics": summarize_run(self.sim.result)}
            return obs, reward, not truncated, truncated, info
        return self._obs(), reward, False, False, self._info()

    # -- internals ---------------------------------------------------------------------------

    def _start(self, trace_seed: int) -> bool:
        """Reset the simulator on ``trace_seed``; False if the run ends before any decision."""
        self.trace_seed = trace_seed
        self._start_slot(SlotState(self.sim.reset(trace_seed), self.enc))
        self._masked = 0
        _, ended, _ = self._advance()
        return not ended

    def _start_slot(self, slot: SlotState) -> None:
        self._slot, self._window = slot, 0
        slot.begin(0)

    def _advance(self) -> tuple[float, bool, bool]:
        """Move to the next decision point; ``(reward of slots ended, episode ended, truncated)``."""
        reward = 0.0
        stop = self.enc.stop
        while True:
            slot = self._slot
            assert slot is not None
            if self._window < slot.num_windows:
                if slot.window_index != self._window:
                    slot.begin(self._window)
                if slot.mask()[:stop].any():
                    return reward, False, False
                self._window += 1
                continue
            reward += self._step_slot(slot)
            if self.sim.done or self.sim.slot >= self.max_slots:
                return reward, True, self.sim.slot >= self.max_slots
            self._start_slot(SlotState(self.sim.view(), self.enc))

    def _step_slot(self, slot: SlotState) -> float:
        """Step the simulator one slot with ``slot``'s allocation; that slot's reward."""
        return step_slot(self.sim, slot.allocation(), self.reward_kind)

    def _obs(self) -> dict[str, np.ndarray]:
        assert self._slot is not None
        return {"observations": self._slot.state().astype(np.float32, copy=True),
                "action_mask": self._slot.mask().astype(np.float32)}

    def _stop_only(self) -> np.ndarray:
        m = np.zeros(self.enc.action_dim, np.float32)
        m[self.enc.stop] = 1.0
        return m

    def _info(self) -> dict[str, Any]:
        return {"trace_seed": self.trace_seed, "slot": self.sim.slot, "masked_actions": self._masked}
