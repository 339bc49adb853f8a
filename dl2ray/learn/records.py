"""What every learner records, written once: its options, one typed record per update, validations, the run's
result and its checkpoint document; and the :class:`Learner` protocol the trainers implement.

Update records are typed per kind of learner, never one type whose fields change meaning:

* :class:`UpdateRow`: an actor-critic update (the paper's trainer, ``improve``, the A3C agents, the
  live learner): policy loss, value loss, entropy, mean slot reward, mean value, new experience;
* :class:`CounterfactualRow`: an update of the shape policy by counterfactual rollouts
  (:class:`~dl2ray.learn.shape.trainer.ShapeTrainer`): its loss, the KL divergence from the policy before
  the update, entropy, mean slot reward, mean counterfactual gain, tries, slots and rollouts;
* :class:`PolicyGradientRow`: an on-policy update of the shape policy (``--algo pg``): surrogate and
  baseline losses, KL, entropy, mean slot reward, mean credit, slots, job decisions, episodes, steps;
* :class:`MixRow`: an update of the shape policy on both (``--algo mix``): both losses, the baseline's,
  KL, entropy, the greedy episodes' reward, mean gain and mean credit, tries, decisions, rollouts,
  episodes, steps.

A run's history (:class:`RLResult`, the run JSON ``OUT.json`` and the checkpoint's ``result``) holds the
records as they are; :func:`update_record` reads one back by its fields (an older shape run, written
before the two were told apart, reads back as :class:`UpdateRow` with the KL in ``value_loss``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from dl2ray.errors import UserError


@dataclass(frozen=True)
class Algorithm:
    """One ``--algo``: the architecture it trains and where its learning signal comes from. The trainers
    branch on these flags, never on the name (:data:`ALGORITHMS` is the one place names live)."""

    name: str
    arch: Literal["paper", "shape"]
    summary: str
    rollout_labels: bool = False  # paper: imitation labels from re-simulated alternatives, not TD
    counterfactual: bool = False  # shape: each tried row re-simulated (in a twin) against the greedy one
    on_policy: bool = False  # shape: episodes of the sampled policy against a learned value baseline
    a3c: bool = False  # runs on A3C agents (``train rl --agents N``), not only in one process
    #: the :class:`RLOptions` switches it honours (Table 2's ablations): a run that turns off another
    #: one is refused (:func:`check_switches`), never trained as if it had been
    switches: tuple[str, ...] = ()


ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (
    Algorithm("paper", "paper", "the DL2 paper's TD actor-critic (slot reward copied to its decisions)",
              a3c=True, switches=("critic", "exploration", "replay")),
    Algorithm("improve", "paper", "rollout policy improvement with per-step credit (dl2ray.learn.improve)",
              rollout_labels=True),
    Algorithm("counterfactual", "shape", "per-job counterfactual policy optimisation of the shape policy "
              "(dl2ray.learn.shape.counterfactual)", counterfactual=True, a3c=True),
    Algorithm("pg", "shape", "on-policy per-job policy gradient with a learned value baseline "
              "(dl2ray.learn.shape.pg)", on_policy=True, a3c=True, switches=("critic", "exploration")),
    Algorithm("mix", "shape", "both in one update (dl2ray.learn.shape.mix)", counterfactual=True,
              on_policy=True),
)}
"""Every RL algorithm ``train rl --algo`` knows, by name."""

ALGOS = tuple(ALGORITHMS)
"""Their names (``--algo``)."""

SHAPE_ALGOS = tuple(a.name for a in ALGORITHMS.values() if a.arch == "shape")
"""The algorithms that train the shape architecture (the others train the paper's)."""


SWITCHES = ("critic", "exploration", "replay")
"""The :class:`RLOptions` switches an algorithm may honour (:attr:`Algorithm.switches`)."""


def check_switches(opts: RLOptions) -> None:
    """UserError naming each switch ``opts`` turns off that ``opts.algo`` does not have."""
    algo = algorithm(opts.algo)
    off = [name for name in SWITCHES if not getattr(opts, name) and name not in algo.switches]
    if off:
        has = ", ".join(algo.switches) or "none"
        raise UserError(f"{', '.join(f'{n}=false' for n in off)}: --algo {algo.name} has no such part to "
                        f"turn off (its switches: {has})")


def algorithm(name: str) -> Algorithm:
    """The registered algorithm ``name``; ValueError naming the known ones otherwise."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown RL algorithm {name!r}; known: {', '.join(ALGORITHMS)}")
    return ALGORITHMS[name]


@dataclass
class RLOptions:
    """One run's switches (the ablations of the paper's Table 2) and its schedule."""

    critic: bool = True  # False: REINFORCE with the minibatch-mean return as baseline
    exploration: bool = True  # job-aware exploration (policy.exploration_eps / _ratio)
    replay: bool = True  # False: learn on each update's fresh steps only
    prioritized: bool = False  # prioritised replay (see dl2ray.learn.replay)
    traces: int = 100  # training traces, cycled
    val_traces: int = 3  # validation traces for the periodic JCT
    val_every: int = 25  # updates between validations
    checkpoint_every: int = 50  # updates between checkpoints
    steps_per_update: int | None = None  # new steps per update; None: policy.minibatch
    critic_warmup: int = 0  # first updates that train only the value network
    max_grad_norm: float | None = None  # per-network gradient-norm clip; None: no clipping
    algo: Literal["paper", "improve", "counterfactual", "pg", "mix"] = "paper"  # see ALGOS
    zero_advantage: bool = False  # the control: the same run with the outcomes' signal removed
    twin: Literal["config", "observed"] = "config"  # counterfactual: where tries come from (learn.twin)
    credit: Literal["job", "slot"] = "job"  # pg, mix: each choice's return (dl2ray.learn.shape.pg)
    mix_weight: float = 1.0  # mix: the on-policy surrogate's weight beside the counterfactual loss
    share_baseline: bool = False  # pg with A3C agents or federation members: the master keeps the baseline
    defer_validation: bool = False  # A3C: validate the due weight snapshots after the last update
    # online learners (policy.experience: cluster): stretches replay these Parquet traces, stretch k the
    # file k mod n with training seed k's noise (train rl --train-trace); () : generated traces
    train_files: tuple[str, ...] = ()
    # validation on these Parquet traces, each with every one of the val_traces validation seeds
    val_files: tuple[str, ...] = ()


@dataclass
class UpdateRow:
    """Per update: losses, mean entropy, mean slot reward and counts of the new experience."""

    update: int
    policy_loss: float
    value_loss: float
    entropy: float
    reward: float
    mean_value: float
    new_steps: int
    new_slots: int
    explored: int


@dataclass
class ValidationRow:
    update: int
    avg_jct: float


@dataclass
class RLResult:
    """History of a run; ``baseline_avg_jct`` is DRF's average JCT on the same validation traces."""

    seed: int
    init: str | None
    updates: int
    val_seeds: list[int]
    baseline_avg_jct: float
    history: list[UpdateRecord] = field(default_factory=list)
    validation: list[ValidationRow] = field(default_factory=list)
    wall_seconds: float = 0.0  # training and validation, summed over resumed sessions
    rewinds: list[int] = field(default_factory=list)  # updates after which it went back to its best

    @property
    def best(self) -> ValidationRow | None:
        return min(self.validation, key=lambda r: r.avg_jct) if self.validation else None


@dataclass
class CounterfactualRow:
    """Per update of the shape policy by counterfactual rollouts
    (:mod:`dl2ray.learn.shape.counterfactual`)."""

    update: int
    policy_loss: float  # the clipped surrogate's loss
    kl: float  # KL(policy before the update || after), mean over the tries' states
    entropy: float
    reward: float  # mean slot reward of the greedy episodes the tries came from
    mean_gain: float  # mean counterfactual gain of the tries (slots of JCT saved)
    tries: int
    slots: int
    rollouts: int


@dataclass
class PolicyGradientRow:
    """Per update of the shape policy by on-policy per-job policy gradient (:mod:`dl2ray.learn.shape.pg`)."""

    update: int
    policy_loss: float  # the clipped surrogate's loss (with the entropy term)
    value_loss: float  # the baseline's MSE on standardised credit, after its fit
    kl: float  # KL(policy before the update || after), mean over the job decisions
    entropy: float
    reward: float  # mean slot reward of the sampled episodes
    mean_credit: float  # mean credit of a job decision (slots; minus remaining JCT)
    slots: int
    decisions: int  # job decisions (one menu row each)
    episodes: int
    steps: int  # Adam steps taken before the KL limit stopped the update


@dataclass
class MixRow:
    """Per update of the shape policy on twin credit and on-policy advantages
    (:mod:`dl2ray.learn.shape.mix`)."""

    update: int
    policy_loss: float  # the whole loss L_cf + w·L_pg at the last step
    improvement_loss: float  # the counterfactual term (with the entropy bonus) at the last step
    surrogate_loss: float  # the on-policy clipped surrogate at the last step (unweighted)
    value_loss: float  # the baseline's MSE on standardised credit, after its fit
    kl: float  # KL(policy before the update || after): the larger of the two batches' means
    entropy: float
    reward: float  # mean slot reward of the greedy episodes the tries came from
    mean_gain: float  # mean counterfactual gain of the tries (slots of JCT saved)
    mean_credit: float  # mean credit of an on-policy job decision (slots; minus remaining JCT)
    tries: int
    decisions: int  # on-policy job decisions
    rollouts: int
    episodes: int  # on-policy episodes
    steps: int  # Adam steps taken before the KL limit stopped the update


UpdateRecord = UpdateRow | CounterfactualRow | PolicyGradientRow | MixRow
"""One update of any learner."""


def update_record(doc: dict[str, Any]) -> UpdateRecord:
    """A record of a history read back (a run JSON, a checkpoint's ``result``), typed by its fields."""
    if "surrogate_loss" in doc:
        return MixRow(**doc)
    if "decisions" in doc:
        return PolicyGradientRow(**doc)
    return CounterfactualRow(**doc) if "kl" in doc else UpdateRow(**doc)


def restore_result(result: RLResult, doc: dict[str, Any], updates: int) -> None:
    """Put a checkpoint's ``result`` document (:func:`result_doc`) back into ``result`` (in place), at
    ``updates`` updates. Every learner that resumes restores its result here."""
    result.history = [update_record(row) for row in doc["history"]]
    result.validation = [ValidationRow(**row) for row in doc["validation"]]
    result.baseline_avg_jct = float(doc["baseline_avg_jct"])
    result.wall_seconds = float(doc.get("wall_seconds", 0.0))
    result.rewinds = [int(u) for u in doc.get("rewinds", [])]
    result.updates = updates


def result_doc(result: RLResult) -> dict:
    """The result as a JSON-able document (with its best validation)."""
    return {**asdict(result), "best": asdict(result.best) if result.best else None}


def rng_state(rng: np.random.Generator) -> dict:
    return dict(rng.bit_generator.state)


def scalars(row: UpdateRecord) -> dict[str, float]:
    """The numbers of a record worth plotting (TensorBoard ``rl/NAME``): every field but the update count."""
    return {f.name: float(getattr(row, f.name)) for f in dataclasses.fields(row) if f.name != "update"}


class Learner(Protocol):
    """A trainer of a DL2 policy, one update at a time (the paper's :class:`~dl2ray.learn.rl.Trainer`,
    the shape policy's :class:`~dl2ray.learn.shape.trainer.ShapeTrainer`; :func:`~dl2ray.learn.train.train_rl`
    drives either). ``result`` holds the run's history; a checkpoint :meth:`save` wrote, :meth:`restore`
    continues from."""

    seed: int
    opts: RLOptions
    updates: int
    result: RLResult

    def update(self) -> UpdateRecord:
        """Collect experience and improve the policy once; the update's record (also in ``result``)."""
        ...

    def validate(self) -> ValidationRow:
        """The greedy policy's average JCT on the validation traces now (also in ``result``)."""
        ...

    def save(self, path: Path) -> None: ...

    def restore(self, path: Path) -> None: ...
