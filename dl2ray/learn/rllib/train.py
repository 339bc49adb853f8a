"""An RLlib algorithm (new API stack) on DL2Env or ShapeEnv (by architecture), selected like our trainer.

Algorithms (``run.algo``, :data:`ALGOS`): ``ppo``, ``appo`` and ``impala``, RLlib's
on-policy actor-critics; the others RLlib 2.60 has are refused with the reason
(:data:`REFUSED`, :func:`algorithm_refusal`).

One run (:func:`train_rllib`), until ``minutes`` of wall time (training and
validation; the algorithm's build is reported apart) or ``iterations``:

Architecture (:func:`run_arch`): the ``init`` checkpoint's, else the config's
``policy.arch``. ``paper``: :class:`dl2ray.envs.dl2_env.DL2Env` and
:class:`~dl2ray.learn.rllib.module.DL2TorchRLModule` (APPO:
:class:`~dl2ray.learn.rllib.module.DL2APPOTorchRLModule`), the masked DL2
policy/value networks; ``shape``: :class:`dl2ray.envs.shape_env.ShapeEnv` (``run.max_jobs``
job rows) and :class:`~dl2ray.learn.rllib.shape_module.ShapeTorchRLModule` (APPO:
:class:`~dl2ray.learn.rllib.shape_module.ShapeAPPOTorchRLModule`), the shape
network with per-job menu masks and a value head of its own.

1. ``algo.train()``: RLlib samples episodes of the architecture's environment
   (reward ``run.reward``, training traces cut off at ``run.max_slots`` slots)
   with its module and updates it (one local learner, sampling in this
   process: ``num_env_runners=0``, so no worker processes beyond Ray's own).
   IMPALA and APPO update in a thread of the learner and send the sampler the
   learner's weights after each update, so their sampler runs at most one update
   behind the learner (PPO's is synchronised at the end of every iteration).
2. Before the first and every ``val_every`` iterations (and after the last):
   the greedy policy's average JCT on ``val_traces`` validation traces, unfinished
   jobs counted until ``sim.max_slots`` — :func:`dl2ray.learn.validation.validate`, the
   very function (and traces) ``dl2ray train rl`` selects models with. The policy
   validated is the sampler's (``algo.get_module()``), a copy the learner's thread
   never writes to while it is read.
3. A better validation JCT exports that policy (:mod:`dl2ray.learn.rllib.export`,
   ``OUT/policy.pt`` in the architecture's checkpoint format: what ``rllib:OUT``
   and ``dl2:OUT/policy.pt`` run) and saves the whole algorithm
   (``OUT/rllib/``, ``Algorithm.save_to_path``; RLlib users restore it with
   ``Algorithm.from_checkpoint`` or the learner's module with ``RLModule.from_checkpoint``
   on ``OUT/rllib/learner_group/learner/rl_module/default_policy``: for PPO the
   same weights as ``policy.pt``, for IMPALA/APPO possibly one update ahead).

``OUT/run.json`` (rewritten after every iteration, so an interrupted run keeps
its record): the config, the run's options, per-iteration history and the
validation curve. Ray must already be initialised (the CLI, the composition
root, does it and shuts it down); nothing here calls ``ray.init`` or
``ray.shutdown``.

Random streams: the module's initialisation from ``seed``
(:func:`~dl2ray.policy.network.build_networks` or
:func:`~dl2ray.policy.shape_net.build_shape_policy` unless ``init``; the shape
module's value head always), RLlib's own
(sampling, minibatch shuffling) from ``config.debugging(seed=seed)``, and the
training traces drawn by each env's ``np_random``, which RLlib seeds from ``seed``.
APPO's circular buffer picks its batches with an unseeded generator of RLlib's
(``ray.rllib.algorithms.appo.utils.CircularBuffer``), and IMPALA/APPO's learner
thread makes the order of sampling and updates depend on timing: their runs are
not reproducible from ``seed`` alone.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dl2ray import seeds as seedsets
from dl2ray.config import ExperimentConfig

ALGOS = ("ppo", "appo", "impala")
"""RLlib algorithms a run can name: the on-policy actor-critics of RLlib 2.60, which train a
policy (masked logits) and a state-value network, the two networks our trainer and checkpoints have."""

#: The other algorithms of RLlib 2.60 (``ray.rllib.algorithms.registry.ALGORITHMS``) and why
#: ``--algo`` refuses them: the networks, data or action space they need.
REFUSED: dict[str, str] = {
    "dqn": "DQN learns action values Q(s, a) (RLlib's QNetAPI, with a target Q-network) and acts by "
           "argmax Q; our networks are a softmax policy (logits, warm-started by SL cross-entropy) and a "
           "state-value V(s), neither a Q-function, and rllib:DIR's checkpoint has no Q-network",
    "sac": "SAC needs twin Q-networks over the 3J+1 actions with target copies (QNetAPI, TargetNetworkAPI) "
           "beside the policy, learned off-policy from a replay buffer: a critic our networks, SL warm start "
           "and checkpoint format do not have",
    "cql": "CQL is offline (it learns from recorded episodes, not by running DL2Env) and SAC-based "
           "(Q-networks our module lacks)",
    "iql": "IQL is offline (recorded episodes, not DL2Env) and RLlib's takes continuous (Box) actions only",
    "bc": "BC is offline: it clones the actions of recorded episodes instead of running DL2Env; "
          "`dl2ray train sl` already clones the cluster's scheduler",
    "marwil": "MARWIL is offline: it learns from recorded episodes (offline_data), not by running DL2Env",
    "dreamerv3": "DreamerV3 trains its own world model, actor and critic (DreamerV3RLModule): our networks "
                 "and the action mask have no place in it",
}

_COMMON: dict[str, Any] = {"lr": 1e-4, "gamma": 0.995, "entropy_coeff": 0.01}

#: Our choices per algorithm, overridable by ``options`` (``--algo-opt KEY=VALUE``): RLlib's
#: defaults, but ``lr`` = ``policy.rl_lr`` of the testbed, a discount per decision step that spans
#: tens of slots, and for PPO smaller batches and fewer epochs, so an iteration takes seconds on two
#: cores. IMPALA and APPO keep RLlib's batch (500 env steps in 50-step fragments, V-trace) and
#: APPO its circular buffer (8 batches, each trained on twice) and target-network period.
DEFAULTS: dict[str, dict[str, Any]] = {
    "ppo": {**_COMMON, "lambda_": 0.95, "train_batch_size_per_learner": 2000, "minibatch_size": 256,
            "num_epochs": 4, "vf_clip_param": 10.0},
    "impala": {**_COMMON, "train_batch_size_per_learner": 500},
    "appo": {**_COMMON, "train_batch_size_per_learner": 500},
}


def algorithm_refusal(algo: str) -> str | None:
    """Why ``--algo algo`` cannot run (one line), or None if it can."""
    if algo in ALGOS:
        return None
    if algo in REFUSED:
        return f"{algo}: {REFUSED[algo]}"
    return f"{algo}: not an RLlib algorithm (of RLlib 2.60's registry); choose one of {', '.join(ALGOS)}"


@dataclass(frozen=True)
class RLlibRun:
    """One run's options (CLI flags of ``dl2ray experiment rllib``)."""

    algo: str = "ppo"
    minutes: float = 5.0  # wall-time budget of training + validation
    iterations: int | None = None  # stop after this many ``algo.train()`` calls (None: time only)
    seed: int = 0
    init: str | None = None  # dl2ray (SL) checkpoint to start from; None: scratch
    traces: int = 100  # training traces (training seed set), drawn per episode
    val_traces: int = 3  # validation traces (validation seed set)
    val_every: int = 2  # iterations between validations
    reward: str = "avg_jct"  # DL2Env reward option for training
    max_slots: int | None = 400  # training episodes' cut-off (slots); validation runs to sim.max_slots
    options: dict[str, Any] = field(default_factory=dict)  # algorithm config overrides
    max_jobs: int | None = None  # shape architecture: job rows of ShapeEnv (None: policy.window)


@dataclass
class IterationRow:
    """Per ``algo.train()``: cumulative seconds, env steps, episodes' return, JCT and the learner's losses."""

    iteration: int
    seconds: float
    env_steps: int
    episode_return_mean: float | None
    episode_censored_avg_jct: float | None  # mean over the iteration's finished training episodes
    policy_loss: float | None
    vf_loss: float | None
    entropy: float | None


@dataclass
class Validation:
    iteration: int
    seconds: float
    avg_jct: float  # greedy, censored, slots, mean over the validation traces


@dataclass
class RLlibResult:
    run: RLlibRun
    val_seeds: list[int]
    drf_val_avg_jct: float  # DRF on the same validation traces, counted the same way
    build_seconds: float = 0.0
    seconds: float = 0.0  # training + validation
    history: list[IterationRow] = field(default_factory=list)
    validation: list[Validation] = field(default_factory=list)
    interrupted: bool = False
    notes: dict[str, Any] = field(default_factory=dict)  # the caller's, copied into run.json
    arch: str = "paper"  # run_arch: the architecture trained and exported

    @property
    def best(self) -> Validation | None:
        return min(self.validation, key=lambda v: v.avg_jct) if self.validation else None


def run_arch(cfg: ExperimentConfig, run: RLlibRun) -> str:
    """``"paper"`` or ``"shape"``: the ``init`` checkpoint's architecture, else ``policy.arch``."""
    if run.init is None:
        return cfg.policy.arch
    from dl2ray.policy.shape_net import checkpoint_arch

    return checkpoint_arch(run.init)


def algorithm_config(cfg: ExperimentConfig, run: RLlibRun):
    """The RLlib ``AlgorithmConfig`` of ``run`` (raises ValueError for an unknown algorithm or option).

    All three sample in the driver (``num_env_runners=0``) with one local learner. PPO samples
    ``train_batch_size_per_learner`` steps per iteration (``rollout_fragment_length="auto"``);
    IMPALA and APPO keep RLlib's 50-step fragments (V-trace's time axis), update in the learner's
    background thread, and get ``min_time_s_per_iteration=1`` (RLlib's 10 s would make every
    ``train()`` call, hence every validation interval, last 10 s).
    """
    from ray.rllib.algorithms.appo import APPOConfig
    from ray.rllib.algorithms.impala import IMPALAConfig
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    refusal = algorithm_refusal(run.algo)
    if refusal is not None:
        raise ValueError(refusal)
    config = {"ppo": PPOConfig, "appo": APPOConfig, "impala": IMPALAConfig}[run.algo]()
    training = {**DEFAULTS[run.algo], **run.options}
    unknown = sorted(k for k in training if not hasattr(config, k))
    if unknown:
        raise ValueError(f"not options of {type(config).__name__}: {unknown}")
    env_config = {"cfg": cfg, "trace_seeds": seedsets.training(run.traces), "reward": run.reward,
                  "max_slots": run.max_slots}
    env_class, module_class, model_config = _arch_parts(cfg, run, env_config)
    spec = RLModuleSpec(module_class=module_class, model_config=model_config)
    config = (
        config.api_stack(enable_rl_module_and_learner=True, enable_env_runner_and_connector_v2=True)
        .environment(env_class, env_config=env_config)
        .learners(num_learners=0)
        .training(**training)
        .rl_module(rl_module_spec=spec)
        .callbacks(on_episode_end=_log_episode_jct)
        .debugging(seed=run.seed, log_sys_usage=False)
    )
    if run.algo == "ppo":
        return config.env_runners(num_env_runners=0, rollout_fragment_length="auto")
    return config.env_runners(num_env_runners=0).reporting(min_time_s_per_iteration=1)


def _arch_parts(cfg: ExperimentConfig, run: RLlibRun, env_config: dict[str, Any]):
    """``(env class, module class, model_config)`` of the run's architecture; adds the shape env's keys to
    ``env_config``."""
    appo = run.algo == "appo"
    if run_arch(cfg, run) == "shape":
        from dl2ray.envs.shape_env import ShapeEnv
        from dl2ray.knowledge.hidden import operator_config
        from dl2ray.learn.rllib.shape_module import (
            ShapeAPPOTorchRLModule,
            ShapeTorchRLModule,
            shape_module_config,
        )
        from dl2ray.policy.shape import ShapeEncoding

        max_jobs = run.max_jobs if run.max_jobs is not None else cfg.policy.window
        env_config["max_jobs"] = max_jobs
        s = cfg.policy.shape
        enc = ShapeEncoding.from_config(operator_config(cfg))
        return (ShapeEnv, ShapeAPPOTorchRLModule if appo else ShapeTorchRLModule,
                shape_module_config(enc, s.embed, s.head, max_jobs, run.seed, run.init))
    from dl2ray.envs.dl2_env import DL2Env
    from dl2ray.learn.rllib.module import DL2APPOTorchRLModule, DL2TorchRLModule, module_config
    from dl2ray.policy.encoding import Encoding

    return (DL2Env, DL2APPOTorchRLModule if appo else DL2TorchRLModule,
            module_config(Encoding.from_config(cfg), cfg.policy.hidden, run.seed, run.init))


def _log_episode_jct(*, episode, metrics_logger, **_) -> None:
    """The finished episode's censored average JCT (the env's ``info["metrics"]``) into RLlib's metrics."""
    info = episode.get_infos(-1)
    if "metrics" in info:
        metrics_logger.log_value("censored_avg_jct", info["metrics"]["censored_avg_jct"])


Progress = Callable[[IterationRow, Validation | None], None]


def train_rllib(cfg: ExperimentConfig, run: RLlibRun, out: Path, progress: Progress | None = None,
                notes: dict[str, Any] | None = None) -> RLlibResult:
    """Train, validate and export as the module docstring says; Ray must be initialised.

    ``notes`` (plain data, e.g. the Ray session's folder) go into ``run.json`` as they are.
    """
    from dl2ray.learn.validation import heuristic_jct

    val_seeds = seedsets.validation(run.val_traces)
    result = RLlibResult(run, val_seeds, heuristic_jct(cfg, "drf", val_seeds), notes=dict(notes or {}),
                         arch=run_arch(cfg, run))
    clock = time.perf_counter()
    algo = algorithm_config(cfg, run).build_algo()
    result.build_seconds = time.perf_counter() - clock
    start = time.perf_counter()
    try:
        _validate(cfg, algo, out, result, 0, start)
        while True:
            it = len(result.history) + 1
            if run.iterations is not None and it > run.iterations:
                break
            if time.perf_counter() - start >= run.minutes * 60.0:
                break
            row = _iteration(algo, it, start)
            result.history.append(row)
            last = run.iterations is not None and it == run.iterations
            val = None
            if it % run.val_every == 0 or last or time.perf_counter() - start >= run.minutes * 60.0:
                val = _validate(cfg, algo, out, result, it, start)
            result.seconds = time.perf_counter() - start
            write_record(out / "run.json", cfg, result)
            if progress is not None:
                progress(row, val)
    except KeyboardInterrupt:
        result.interrupted = True
        raise
    finally:
        result.seconds = time.perf_counter() - start
        write_record(out / "run.json", cfg, result)
        algo.stop()
    return result


def _iteration(algo, it: int, start: float) -> IterationRow:
    res = algo.train()
    runners = res.get("env_runners", {})
    learner = res.get("learners", {}).get("default_policy", {})

    def num(d: dict, *keys: str) -> float | None:
        """The first of ``keys`` in ``d`` (IMPALA names its losses ``mean_pi_loss``, ``mean_vf_loss``)."""
        v = next((d[k] for k in keys if k in d), None)
        return None if v is None or math.isnan(float(v)) else float(v)

    steps = int(runners.get("num_env_steps_sampled_lifetime", 0))
    return IterationRow(it, time.perf_counter() - start, steps,
                        num(runners, "episode_return_mean"), num(runners, "censored_avg_jct"),
                        num(learner, "policy_loss", "mean_pi_loss"), num(learner, "vf_loss", "mean_vf_loss"),
                        num(learner, "entropy"))


def _validate(cfg: ExperimentConfig, algo, out: Path, result: RLlibResult, it: int, start: float
              ) -> Validation:
    """Validate the learner's current module; export it (and save the algorithm) if it is the best."""
    from dl2ray.learn.rllib.export import export_policy
    from dl2ray.learn.validation import validate

    module = algo.get_module()
    best = result.best
    avg_jct = validate(cfg, module.pi, result.val_seeds)
    val = Validation(it, time.perf_counter() - start, avg_jct)
    result.validation.append(val)
    if best is None or val.avg_jct < best.avg_jct:
        extra = {"kind": "rllib", "arch": result.arch, "algo": result.run.algo, "iteration": it,
                 "seed": result.run.seed, "init": result.run.init, "val_avg_jct": val.avg_jct,
                 "val_seeds": result.val_seeds}
        export_policy(out, module.pi, module.vf, cfg.catalogue.names, extra)  # in pi's architecture
        algo.save_to_path(str((out / "rllib").resolve()))
    return val


def write_record(path: Path, cfg: ExperimentConfig, result: RLlibResult) -> None:
    """``OUT/run.json``: what the module docstring lists (NaN-free: missing values are null)."""
    best = result.best
    doc = {
        "kind": "rllib", **result.notes, "arch": result.arch, "run": asdict(result.run),
        "config": cfg.model_dump(mode="json"),
        "train_seeds": seedsets.training(result.run.traces), "val_seeds": result.val_seeds,
        "drf_val_avg_jct": result.drf_val_avg_jct, "build_seconds": result.build_seconds,
        "seconds": result.seconds, "iterations": len(result.history), "interrupted": result.interrupted,
        "best": asdict(best) if best else None,
        "history": [asdict(r) for r in result.history],
        "validation": [asdict(v) for v in result.validation],
    }
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)
