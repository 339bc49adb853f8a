"""Typed, frozen experiment configuration, loaded once at the entry point.

A config file is YAML with the groups below; every field documents its unit
and default. Paths inside a config (``jobtypes``, ``speed.surfaces``) are
relative to the config file. :func:`load_config` turns any schema or YAML
error into a :class:`ConfigError` naming the file and the field.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dl2ray.errors import UserError
from dl2ray.tenancy import TenancyConfig
from dl2ray.workload import JobCatalogue, load_catalogue


class ConfigError(UserError, ValueError):
    """A config or input file is malformed; the message names the file and field."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class NodeGroup(_Frozen):
    """``count`` identical nodes."""

    count: int = Field(default=1, ge=1)
    cpu: float = Field(default=8, gt=0, description="CPU cores per node")
    gpu: float = Field(default=2, ge=0, description="GPUs per node")
    mem: float = Field(default=48, gt=0, description="memory per node, GB")


PlacementName = Literal["load_balancing", "packing", "optimus", "tetris"]
PlacementChoice = Literal["own", "load_balancing", "packing", "optimus", "tetris"]


class ClusterConfig(_Frozen):
    """Nodes (heterogeneous lists allowed) and the placement policy.

    ``placement``: ``own`` (the default) lets every scheduler place its tasks as its paper defines
    (:mod:`dl2ray.schedulers.placed`); a policy name forces that placer on every scheduler (how every
    table before issue 36 was measured: ``load_balancing``).
    """

    nodes: tuple[NodeGroup, ...] = Field(default=(NodeGroup(count=13),), min_length=1)
    placement: PlacementChoice = "own"

    @property
    def default_placement(self) -> PlacementName:
        """The placer of whatever no scheduler places (a counts-only allocation, a live backend's new
        member without a wish): the forced policy, or with ``own`` the DL2 paper's cluster default,
        load balancing."""
        return "load_balancing" if self.placement == "own" else self.placement

    @cached_property
    def capacity(self) -> np.ndarray:
        """Shape (N, 3): per-node (cpu, gpu, mem) capacity."""
        rows = [[g.cpu, g.gpu, g.mem] for g in self.nodes for _ in range(g.count)]
        arr = np.array(rows, dtype=np.float64)
        arr.setflags(write=False)
        return arr

    @property
    def num_nodes(self) -> int:
        return sum(g.count for g in self.nodes)


class ArrivalConfig(_Frozen):
    """Job arrivals per slot.

    ``uniform``: exactly ``rate`` jobs per slot (rounded, carried over).
    ``poisson``: Poisson(``rate``) per slot. ``diurnal``: Poisson with a
    weekly-and-daily modulated rate whose busiest hour is ``peak`` times the
    mean ``rate`` (weekends at ``weekend_factor`` of weekdays). All capped at
    ``max_per_slot``.
    """

    pattern: Literal["uniform", "poisson", "diurnal"] = "poisson"
    rate: float = Field(default=1.0, gt=0, description="mean arrivals per slot")
    max_per_slot: int = Field(default=5, ge=1)
    peak: float = Field(default=2.0, ge=1.0, description="diurnal peak / mean rate")
    weekend_factor: float = Field(default=0.5, gt=0, le=1.0)


class LengthConfig(_Frozen):
    """Job length = type ``base_epochs`` × a draw from ``distribution``.

    ``uniform``: U(``low``, ``high``). ``lognormal``: exp(N(0, ``sigma``)),
    clipped to [``low``, ``high``]. ``fixed``: 1.
    """

    distribution: Literal["fixed", "uniform", "lognormal"] = "uniform"
    low: float = Field(default=0.9, gt=0)
    high: float = Field(default=1.1, gt=0)
    sigma: float = Field(default=0.5, gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> LengthConfig:
        if self.low > self.high:
            raise ValueError("low must be <= high")
        return self


class WorkloadConfig(_Frozen):
    """How ``dl2ray trace generate`` and the simulator draw a trace."""

    num_jobs: int = Field(default=30, ge=1)
    arrivals: ArrivalConfig = ArrivalConfig()
    lengths: LengthConfig = LengthConfig()
    epoch_error: float = Field(
        default=0.0, ge=0, lt=1, description="estimate = true × (1 + U(-e, e))"
    )
    types: tuple[str, ...] | None = Field(
        default=None, description="subset of the catalogue to draw from; None = all"
    )
    requested_bundles: int = Field(
        default=2, ge=1, description="size a job's user asks for, in bundles of 1 worker + 1 PS, "
        "when its trace names none (the DL2 paper's user-defined threshold; FIFO, SRTF, Tetris "
        "and static DRF give a job at most this many; docs/schedulers.md)"
    )


class SpeedConfig(_Frozen):
    """Ground-truth speed of the simulator (see :mod:`dl2ray.speed`).

    Everything in this group is the simulator's truth: no deployable scheduler
    reads it (:func:`dl2ray.knowledge.hidden.operator_config` hides it). With
    ``variation``, ``job_deviation`` and ``interference`` at 0 the speed of every
    job of a type is its type's surface: the clairvoyant world of the
    ``*-clairvoyant`` configs; docs/information.md says what the shipped
    configs set and why.
    """

    surfaces: str = Field(default="speed", description="directory of fitted surfaces")
    model: Literal["measured", "analytic"] = Field(
        default="measured",
        description="measured: interpolated testbed speeds × placement factor; "
        "analytic: the analytic PS model alone",
    )
    placement_aware: bool = True
    placement_model: Literal["analytic", "calibrated"] = Field(
        default="calibrated",
        description="communication time per layout behind the placement factor "
        "(dl2ray.speed.PlacementModel): calibrated: fitted to the co-location benchmark "
        "(full-duplex links; docs/simulator.md); "
        "analytic: the published half-duplex model, under which results recorded before it reproduce",
    )
    placement_calibration: str | None = Field(
        default=None,
        description="the calibrated model's parameters (JSON, relative to the config file); "
        "None: the shipped configs/speed/placement.json",
    )
    variation: float = Field(default=0.0, ge=0, lt=1, description="per-slot speed noise ±v")
    job_deviation: float = Field(
        default=0.0, ge=0, lt=1, description="per-job departure from the type's speed, for the job's life: "
        "its compute time × U(1-d, 1+d) and its communication time × an independent U(1-d, 1+d)")
    interference: float = Field(
        default=0.0, ge=0, lt=1, description="co-location slowdown: a job runs at 1 - s·o, o the largest "
        "share of any of its nodes held by other jobs' tasks")
    bandwidth_scale: float = Field(
        default=1.0, gt=0, description="the cluster's cross-node bandwidth now over when the speeds were "
        "measured (0.5: the network halved after the profile was taken); enters through the placement "
        "factor, so communication-heavy types and layouts slow most and the best PS:worker ratio moves")
    compute_scale: float | dict[str, float] = Field(
        default=1.0, description="each job's per-iteration compute time now over when the speeds were "
        "measured (0.5: accelerators twice as fast, bought after the profile was taken): one factor for "
        "every type, or {type name: factor} (types left out: 1); enters through the placement factor, so "
        "compute-bound types and layouts speed up most and communication weighs more: the best PS:worker "
        "ratio moves")

    @model_validator(mode="after")
    def _changes_need_placement(self) -> SpeedConfig:
        factors = (self.compute_scale.values() if isinstance(self.compute_scale, dict)
                   else [self.compute_scale])
        if not all(c > 0 for c in factors):
            raise ValueError(f"compute_scale: {self.compute_scale}: every factor must be > 0")
        changed = self.bandwidth_scale != 1.0 or any(c != 1.0 for c in factors)
        if changed and self.model == "measured" and not self.placement_aware:
            raise ValueError("bandwidth_scale, compute_scale: a changed cluster needs placement_aware: true "
                             "(it enters through the placement factor)")
        return self

    @property
    def compute_key(self) -> tuple:
        """``compute_scale`` as a hashable key (a factor, or the sorted ``(type, factor)`` pairs)."""
        c = self.compute_scale
        return tuple(sorted(c.items())) if isinstance(c, dict) else (c,)


class SimConfig(_Frozen):
    """Time-slotted engine settings."""

    slot_seconds: float = Field(default=1200.0, gt=0, description="slot length, s")
    max_slots: int = Field(default=5000, ge=1, description="hard stop of one run")
    change_cost: Literal["none", "hot", "checkpoint_restart"] = "none"
    hot_scaling_s: float = Field(default=0.1, ge=0, description="suspension per change, s")
    task_start_s: float = Field(
        default=0.0, ge=0, description="hot and checkpoint_restart: seconds a started task needs before it "
        "trains (process start, framework import, data); a job starting or resuming trains nothing for this "
        "long, a hot scale-up keeps its old deployment training meanwhile")
    checkpoint_restart_s: float = Field(
        default=60.0, ge=0, description="suspension per change, s"
    )
    loss_noise: float = Field(
        default=0.02, ge=0, description="relative noise of the reported training loss"
    )
    convergence_gap: float = Field(
        default=0.01,
        gt=0,
        lt=1,
        description="a job converges when its loss gap l - l_inf has shrunk to this "
        "fraction of the initial gap (see dl2ray.sim.LossCurve)",
    )

    @property
    def change_seconds(self) -> float:
        """Seconds a running job loses when its deployment changes."""
        return {
            "none": 0.0,
            "hot": self.hot_scaling_s,
            "checkpoint_restart": self.checkpoint_restart_s,
        }[self.change_cost]


class ImproveConfig(_Frozen):
    """Rollout policy improvement (``dl2ray train rl --algo improve``; :mod:`dl2ray.learn.improve`).

    Each training slot's greedy decision is recorded; at ``points`` of its steps
    the greedy action and up to ``alternatives`` other allowed actions are each
    taken and followed for ``horizon`` slots by the greedy policy, from the same
    simulator state; the best becomes an imitation label.
    """

    envs: int = Field(default=8, ge=1, description="training episodes run side by side")
    slots_per_update: int = Field(default=8, ge=1, description="training slots labelled per update")
    points: int = Field(default=2, ge=1, description="decision steps tried per slot")
    alternatives: int = Field(default=5, ge=1, description="actions tried per step besides the greedy one")
    temperature: float = Field(default=1.0, gt=0, description="alternatives: Gumbel top-k of logits / this")
    horizon: int = Field(default=10, ge=1, description="slots simulated after each tried action")
    reward: Literal["progress", "jobs"] = Field(
        default="jobs", description="rollout return: jobs = minus job-slots in the system (Σ = −total JCT); "
        "progress = the paper's Σ epochs/E")
    gamma: float = Field(default=1.0, ge=0, le=1, description="discount per slot inside a rollout")
    buffer: int = Field(default=20000, ge=1, description="imitation labels kept (FIFO)")
    batches: int = Field(default=8, ge=1, description="cross-entropy minibatches per update")
    batch_size: int = Field(default=256, ge=1, description="labels per minibatch")
    lr: float = Field(default=3e-4, gt=0, description="Adam learning rate of the imitation updates")
    operator: Literal["step", "shape"] = Field(
        default="step", description="step: re-take single decision steps (dl2ray.learn.improve); shape: "
        "local search over each job's (workers, PS) in the slot, whole slot labelled "
        "(dl2ray.learn.shape.search)")
    rounds: int = Field(default=2, ge=1, description="shape: moves per slot at most (improvement rounds)")
    min_gain: float = Field(default=0.0, ge=0, description="shape: a move is taken only if it beats the "
                            "current counts' return by more than this (near-ties are noise to imitate)")
    futures: int = Field(default=0, ge=0, description="shape: score each move over this many re-drawn "
                         "futures (0: the trace's own future, which the state does not show)")


class ShapeConfig(_Frozen):
    """The shape policy (``policy.arch: shape``; :mod:`dl2ray.policy.shape`) and its counterfactual
    per-job policy optimisation (``dl2ray train rl --algo counterfactual``;
    :mod:`dl2ray.learn.shape.counterfactual`).

    Menu: wait, then every ``(w, p)`` of ``menu_workers × menu_ps``. Learning, per update:
    ``slots_per_update`` greedy slots of ``envs`` side-by-side training episodes; in each, up to
    ``jobs_per_slot`` jobs each try their greedy row, ``samples`` rows drawn from the policy at
    ``temperature`` and ``uniform`` rows drawn uniformly, every try followed by ``horizon`` greedy slots
    from the same simulator state; then a policy improvement on the tries limited to ``kl`` nats.
    """

    menu_workers: tuple[int, ...] = Field(default=(1, 2, 3, 4, 6, 8), min_length=1,
                                          description="worker counts of the menu")
    menu_ps: tuple[int, ...] = Field(default=(1, 2, 3, 4, 5, 6, 8, 12, 16), min_length=1,
                                     description="PS counts of the menu")
    embed: tuple[int, ...] = Field(default=(64, 64), min_length=1, description="per-job embedding widths")
    head: int = Field(default=64, ge=1, description="hidden width of the per-job head")
    placement: Literal["interleaved", "per-job"] = Field(
        default="interleaved", description="where the decided tasks go: interleaved (every job's first "
        "worker and PS, then one task per job per round, as the planner places) or per-job (one job's whole "
        "shape after another's; the decoder before issue 22) (dl2ray.policy.shape)")
    work_conserving: bool = Field(
        default=True, description="wait only when no other menu row of the job fits (never idle capacity "
        "a waiting job could use); False: wait is always allowed")
    envs: int = Field(default=8, ge=1, description="training episodes run side by side")
    slots_per_update: int = Field(default=32, ge=1, description="training slots per update")
    jobs_per_slot: int = Field(default=8, ge=1, description="jobs whose choice is re-tried per slot")
    samples: int = Field(default=3, ge=0, description="rows tried per job drawn from the policy (no repeats)")
    uniform: int = Field(default=2, ge=0, description="rows tried per job drawn uniformly from its mask")
    temperature: float = Field(default=2.0, gt=0,
                               description="the policy's rows: Gumbel top-k of logits / this")
    horizon: int = Field(default=10_000, ge=1,
                         description="slots simulated after each try (the default: to the end of the run)")
    gamma: float = Field(default=1.0, ge=0, le=1, description="discount per slot inside a rollout")
    lr: float = Field(default=1e-3, gt=0, description="Adam learning rate")
    epochs: int = Field(default=4, ge=1, description="Adam steps on each update's tries")
    kl: float = Field(default=0.1, gt=0, description="KL limit (nats) of each update's target")
    trust: float | None = Field(
        default=0.02, gt=0, description="stop an update's Adam steps once the mean KL(old ‖ new) over every "
        "job of its slots exceeds this (nats); None: all epochs")
    entropy_weight: float = Field(default=0.0, ge=0, description="entropy bonus weight")
    credit_discount: float = Field(
        default=1.0, gt=0, le=1, description="online pg with --credit slot: the return of slot t is "
        "−Σ_{h≥t} γ^(h−t)·(jobs in the system at h) with this γ (1: the undiscounted remaining total JCT; "
        "dl2ray.learn.shape.pg)")
    entropy_decay_updates: int = Field(
        default=0, ge=0, description="online pg: the entropy bonus falls linearly to 0 over this many "
        "updates (0: constant); update u's weight is entropy_weight·max(0, 1 − u/this), u counted from 0")
    rollback: float | None = Field(
        default=None, gt=1, description="single-process RL (dl2ray.learn.train): after a validation whose "
        "average JCT is above this × the best so far, the learner goes on from the best checkpoint's "
        "weights, optimiser and baseline (its sampling generator runs on: new stretches); None: never")
    profile_features: bool = Field(
        default=False, description="describe jobs by the operator's profile instead of a job-type one-hot: "
        "per job its estimated slots to finish and its observed speed over the profile's, per menu row its "
        "profiled speed-up and time to finish (dl2ray.policy.shape); the policy runs on unseen job types")
    layouts: tuple[PlacementName, ...] = Field(
        default=(), description="placement as the policy's decision: every (w, p) of the menu comes once per "
        "placer named here and a job's tasks go where its row's placer puts them (e.g. [load_balancing, "
        "packing]: spread or packed, per job); empty: every job's tasks go by the view's placer "
        "(dl2ray.policy.shape, 'Layouts')")

    @field_validator("layouts")
    @classmethod
    def _distinct(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(v)) != len(v):
            raise ValueError("must name each placer at most once")
        return v

    @field_validator("menu_workers", "menu_ps")
    @classmethod
    def _positive_sorted(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if any(x < 1 for x in v) or list(v) != sorted(set(v)):
            raise ValueError("must be distinct positive counts in increasing order")
        return v


class PolicyConfig(_Frozen):
    """The DL2 policy network, its supervised warm-start and (later) its RL.

    State and action shapes follow from ``window`` (J) and the catalogue (L
    types): state ``J·(L+5)`` floats, actions ``3J+1`` (see
    :mod:`dl2ray.policy.encoding`).
    """

    window: int = Field(default=20, ge=1, description="J: jobs per decision window (state columns)")
    hidden: tuple[int, ...] = Field(
        default=(256, 128), min_length=1, description="hidden layer widths of policy and value nets"
    )
    slots_run_scale: float = Field(
        default=100.0, gt=0, description="state: slots run / this, clipped to [0, 1]"
    )
    teacher: str = Field(default="drf", description="SL teacher: any registered heuristic name")
    sl_lr: float = Field(default=0.005, gt=0, description="SL Adam learning rate")
    sl_epochs: int = Field(default=10, ge=1, description="SL passes over the recorded steps")
    sl_batch_size: int = Field(default=256, ge=1, description="SL minibatch, decision steps")
    sl_traces: int = Field(default=20, ge=1, description="SL training traces (training seed set)")
    sl_val_traces: int = Field(default=4, ge=1, description="SL validation traces (validation seeds)")
    sl_label_smoothing: float = Field(
        default=0.1, ge=0, lt=1, description="SL: probability mass spread over the allowed actions "
        "(keeps the warm-started policy exploring in RL)"
    )
    sl_max_slots: int = Field(
        default=400, ge=1, description="slots recorded per SL trace (the rest is not recorded)"
    )
    gamma: float = Field(default=0.9, ge=0, le=1, description="RL discount per slot")
    entropy_weight: float = Field(default=0.1, ge=0, description="RL entropy bonus weight")
    entropy_decay_updates: int = Field(
        default=0, ge=0, description="RL: the entropy weight falls linearly to 0 over this many updates "
        "(0: constant, the paper's setting)"
    )
    rl_lr: float = Field(default=1e-4, gt=0, description="RL Adam learning rate (policy and value)")
    replay_size: int = Field(default=8192, ge=1, description="RL replay buffer, decision steps")
    minibatch: int = Field(default=256, ge=1, description="RL minibatch, decision steps")
    exploration_eps: float = Field(
        default=0.2, ge=0, le=1, description="RL job-aware exploration: P(correcting a poor state)"
    )
    exploration_ratio: float = Field(
        default=4.0, ge=1, description="RL job-aware exploration: a job whose workers exceed this many "
        "times its PS (or PS this many times its workers) this slot is in a poor state"
    )
    improve: ImproveConfig = ImproveConfig()
    train_world: Literal["truth", "operator"] = Field(
        default="truth", description="the simulator the learners train in (SL teacher runs, RL experience): "
        "truth = the simulator's true speeds; operator = the operator's profile in their place "
        "(dl2ray.world.build_simulator), so no trained weight has seen the truth. Model selection "
        "(validation JCT) and every reported number run on the truth")
    experience: Literal["cluster", "twin"] = Field(
        default="cluster", description="where the on-policy learners (the paper's actor-critic, the shape "
        "policy's pg and the on-policy half of mix) get their episodes: cluster = online, from the "
        "learner's own cluster through the live agent's interface (act, observe, reward: "
        "dl2ray.envs.cluster_env; the simulator's truth stands in for the live cluster and is never read); "
        "twin = in a model of it (train_world's simulator, or the observed twin). The learners that "
        "re-simulate a slot (counterfactual, improve) always learn in a twin")
    arch: Literal["paper", "shape"] = Field(
        default="paper", description="paper: the DL2 paper's 3J+1 incremental actions over a window "
        "(dl2ray.policy.encoding); shape: one (workers, PS) menu row per job, one scorer shared by "
        "all jobs (dl2ray.policy.shape)")
    shape: ShapeConfig = ShapeConfig()


class InterferenceConfig(_Frozen):
    """Hidden pairwise co-location interference of gang mode (:mod:`dl2ray.gang`); schedulers never read it.

    A task of type ``t`` on a node slows by ``(1 + Σ_r kappa_r·u_{t,r}·Σ_{foreign tasks on the node}
    u_{t',r})^(−eta)`` with ``u`` = ``contention[type]`` over the resources (cpu, disk, net, pcie);
    a job runs at its slowest task's speed. ``eta > 1`` makes the slowdown non-linear in the load.
    """

    kappa: tuple[float, float, float, float] = Field(
        default=(0.0, 0.0, 0.0, 0.0), description="weight per contended resource (cpu, disk, net, pcie)")
    eta: float = Field(default=1.5, gt=0, description="exponent of the slowdown")
    contention: dict[str, tuple[float, float, float, float]] = Field(
        default_factory=dict, description="job type -> its use u of (cpu, disk, net, pcie), each in [0, 1]")


class GangConfig(_Frozen):
    """Opt-in non-preemptive gang mode (SCHED², Harmony; :mod:`dl2ray.gang`). Absent: the DL2 simulator.

    Jobs have a fixed size (``JobSpec.workers``/``ps``) and run with exactly it or not at all; a running
    job keeps its nodes until it completes. ``workload: philly`` draws all-reduce jobs (GPU count and
    duration) from the Philly CSV (:mod:`dl2ray.gang.trace`); ``synthetic`` draws
    ``cfg.workload`` and gives every job ``U{min_tasks..max_tasks}`` workers and PS.
    """

    workload: Literal["philly", "synthetic"] = "synthetic"
    philly_csv: str = Field(default="../../shared/data/philly_jobs.csv",
                            description="the Philly CSV, relative to the config file")
    one_gpu_share: float | None = Field(
        default=None, ge=0, le=1,
        description="philly: resample so this fraction of jobs uses 1 GPU (None: as is)")
    arrival_scale: float = Field(
        default=1.0, gt=0, description="philly: inter-arrival times multiplied by this")
    max_gpus: int = Field(default=120, ge=1, description="philly: GPU counts capped at this")
    min_duration_s: float = Field(default=60.0, gt=0, description="philly: durations clipped below, s")
    max_duration_s: float = Field(default=86400.0, gt=0, description="philly: durations clipped above, s")
    type_mix: dict[str, float] = Field(
        default_factory=dict, description="philly: job type -> weight (empty: uniform over the catalogue)")
    locality: dict[str, float] = Field(
        default_factory=dict, description="all-reduce type -> beta: a job spanning s servers runs "
        "1 + beta·2(s−1)/s times slower than on one (profiled; schedulers may read it)")
    min_tasks: int = Field(default=1, ge=1, description="synthetic: fewest workers (and PS) of a job")
    max_tasks: int = Field(default=4, ge=1, description="synthetic: most workers (and PS) of a job")
    interference: InterferenceConfig = InterferenceConfig()


class ExperimentConfig(_Frozen):
    """The whole experiment: one YAML file."""

    name: str = "default"
    jobtypes: str = Field(default="jobtypes.yaml", description="catalogue path")
    cluster: ClusterConfig = ClusterConfig()
    workload: WorkloadConfig = WorkloadConfig()
    speed: SpeedConfig = SpeedConfig()
    sim: SimConfig = SimConfig()
    policy: PolicyConfig = PolicyConfig()
    gang: GangConfig | None = Field(default=None, description="opt-in gang mode (dl2ray.gang); None: DL2")
    tenancy: TenancyConfig | None = Field(
        default=None, description="queues with quotas, borrowing and priorities (dl2ray.tenancy); None: one "
        "pool")
    profile: str | None = Field(
        default=None, description="the operator's speed profile (`dl2ray profile`), relative to the config: "
        "what deployable schedulers (the planner, the DL2 policy's training world) know of job speeds")
    base_dir: str = Field(default=".", description="set by the loader: the config's folder")

    @model_validator(mode="after")
    def _quotas_fit_the_cluster(self) -> ExperimentConfig:
        if self.tenancy is not None:
            try:
                self.tenancy.check_capacity(self.cluster.capacity)
            except ValueError as exc:
                raise ValueError(f"tenancy.{exc}") from None
        return self

    def resolve(self, relative: str) -> Path:
        """A path from this config, made absolute against its folder."""
        p = Path(relative)
        return p if p.is_absolute() else Path(self.base_dir) / p

    @cached_property
    def catalogue(self) -> JobCatalogue:
        path = self.resolve(self.jobtypes)
        try:
            cat = load_catalogue(path)
        except FileNotFoundError as exc:
            raise ConfigError(f"jobtypes: file not found: {path}") from exc
        except ValidationError as exc:
            raise ConfigError(format_validation_error(str(path), exc)) from exc
        if self.workload.types is not None:
            for name in self.workload.types:
                if name not in cat.names:
                    raise ConfigError(
                        f"workload.types: unknown job type {name!r}; known: {list(cat.names)}"
                    )
        return cat

    @property
    def surfaces_dir(self) -> Path:
        """The simulator's true speed surfaces (truth: not for deployable schedulers)."""
        return self.resolve(self.speed.surfaces)

    @property
    def profile_path(self) -> Path | None:
        """The operator's profile file, or None when the config names none."""
        return None if self.profile is None else self.resolve(self.profile)


def format_validation_error(source: str, exc: ValidationError) -> str:
    """One line per problem: ``source: field.path: message``."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "<root>"
        lines.append(f"{source}: {loc}: {err['msg']}")
    return "\n".join(lines)


DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "testbed.yaml"


def read_yaml(path: Path, what: str, error: type[Exception] = ConfigError) -> object:
    """The parsed YAML document at ``path``; ``error`` naming the file when it cannot be read or parsed."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise error(f"{path}: cannot read {what}: {exc.strerror}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise error(f"{path}: not valid YAML: {exc}") from None


def load_config(path: str | Path | None = None) -> ExperimentConfig:
    """Load and validate a config file (default: ``configs/testbed.yaml``).

    Raises :class:`ConfigError` with the file and the field for any problem,
    including the job-type catalogue it names.
    """
    path = Path(path) if path is not None else DEFAULT_CONFIG
    raw = read_yaml(path, "config", ConfigError)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: <root>: expected a mapping of config groups")
    raw = {**raw, "base_dir": str(path.resolve().parent)}
    try:
        cfg = ExperimentConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(str(path), exc)) from exc
    _ = cfg.catalogue  # validate the catalogue reference eagerly
    return cfg
