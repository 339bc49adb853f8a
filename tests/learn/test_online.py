"""Online learners touch their cluster only through the live agent's interface (issue 37).

Every online learner — the paper's actor-critic, the shape policy's on-policy gradient, alone and as an
A3C agent — runs here with an environment that answers ``observe`` and ``act`` and nothing else (any other
attribute raises), while the simulator's rewind (``snapshot``/``restore``) raises and every simulator built
during an update is counted: the updates must go through, and from nothing but that interface.
"""

from __future__ import annotations

import numpy as np
import pytest
from support import small_config, tiny_shape_config

from dl2ray.envs.cluster_env import ClusterEnvironment, Feedback, learning_environment
from dl2ray.learn.records import RLOptions
from dl2ray.sim import Simulator
from dl2ray.view import Allocation

PAPER = small_config(
    cluster={"nodes": [{"count": 3, "cpu": 8, "gpu": 2, "mem": 48}]},
    workload={"num_jobs": 5, "arrivals": {"pattern": "poisson", "rate": 1.0, "max_per_slot": 2},
              "epoch_error": 0.2},
    speed={"job_deviation": 0.2},
    policy={"window": 6, "hidden": [32], "minibatch": 32, "replay_size": 256},
    sim={"max_slots": 150},
)
SHAPE = tiny_shape_config()
INTERFACE = ("observe", "act", "stretches", "stretch_seed")


class Sealed:
    """An environment that answers the live interface alone and counts the calls."""

    def __init__(self, env: ClusterEnvironment) -> None:
        object.__setattr__(self, "_env", env)
        object.__setattr__(self, "calls", {"observe": 0, "act": 0})

    def __getattr__(self, name: str):
        if name not in INTERFACE:
            raise AssertionError(f"the learner reached past the interface: {name}")
        if name in self.calls:
            self.calls[name] += 1
        return getattr(self._env, name)

    def __setattr__(self, name: str, value) -> None:
        if name != "stretches":
            raise AssertionError(f"the learner set {name} on its environment")
        setattr(self._env, name, value)


@pytest.fixture
def sealed(monkeypatch):
    """Every learning environment sealed; simulator rewinds raise; simulators built are counted."""
    made: list[Sealed] = []
    built: list[str] = []

    def sealed_env(cfg, seeds, first=0, traces=None):
        env = Sealed(learning_environment(cfg, seeds, first, traces))
        made.append(env)
        return env

    import dl2ray.learn.rl as rl
    import dl2ray.learn.shape.trainer as shape_trainer
    import dl2ray.world as world

    for mod in (rl, shape_trainer):
        monkeypatch.setattr(mod, "learning_environment", sealed_env)

    def no_rewind(*_a, **_k):
        raise AssertionError("an online learner rewound its cluster")

    monkeypatch.setattr(Simulator, "snapshot", no_rewind)
    monkeypatch.setattr(Simulator, "restore", no_rewind)
    real = world.build_simulator

    def counted(cfg, *a, **k):
        built.append(k.get("world", "truth"))
        return real(cfg, *a, **k)

    monkeypatch.setattr(world, "build_simulator", counted)
    return made, built


@pytest.mark.parametrize("algo, cfg", [("paper", PAPER), ("pg", SHAPE)])
def test_an_online_run_touches_its_cluster_only_through_observe_and_act(sealed, algo, cfg) -> None:
    made, built = sealed
    opts = RLOptions(algo=algo, traces=2, val_traces=1, val_every=100, replay=False)  # type: ignore[arg-type]
    if algo == "pg":
        from dl2ray.learn.shape.trainer import ShapeTrainer

        trainer = ShapeTrainer(cfg, None, 0, opts)
    else:
        from dl2ray.learn.rl import Trainer

        trainer = Trainer(cfg, None, 0, opts)
    assert len(made) == 1 and trainer.episodes == 0
    before = len(built)
    for _ in range(2):
        trainer.update()
    assert len(built) == before, "an update built a simulator of its own (a model of the cluster)"
    env = made[0]
    assert env.calls["act"] > 0 and env.calls["observe"] > 0
    assert trainer.episodes >= 1


def test_the_a3c_agents_online_step_uses_the_interface_alone(sealed, monkeypatch) -> None:
    """The shape policy's A3C agent (``--algo pg --agents N``) computes its pushes the same way."""
    import clusters.a3c.local as local
    from clusters.a3c.weights import params_vector

    made, _ = sealed
    monkeypatch.setattr(local, "learning_environment", lambda cfg, seeds, first=0: (
        made.append(Sealed(ClusterEnvironment.over_seeds(Simulator(cfg, _truth(cfg)), seeds))) or made[-1]))
    step = local.local_learner(SHAPE, [11, 12], 0, [0, 0], local.LocalSettings(algo="pg"))
    assert isinstance(step, local.OnPolicyStep)
    step.take(params_vector(step.policy, None))
    push = step.compute(0)
    assert made[-1].calls["act"] > 0 and push.slots > 0 and np.abs(push.grad).sum() > 0


def _truth(cfg):
    from dl2ray.world import speed_model

    return speed_model(cfg, "truth")


def test_feedback_is_what_the_cluster_showed() -> None:
    """A stretch of one job on an idle cluster: it runs, reports progress over its declared epochs, and
    finishes; the feedback's job-slots add up to its JCT, and the next observe starts the next stretch."""
    from dl2ray.schedulers.drf import DRF
    from dl2ray.world import build_simulator

    env = ClusterEnvironment.over_seeds(build_simulator(PAPER), [5, 6])
    total, finished, ended = 0.0, {}, False
    view = env.observe()
    assert env.stretches == 1 and env.stretch_seed == 5
    while not ended:
        fb: Feedback = env.act(DRF().decide(view) if view.jobs else Allocation.empty())
        total += fb.in_system
        finished.update(fb.finished)
        assert fb.progress >= 0 and (fb.view is None) == fb.ended
        ended = fb.ended
        if fb.view is not None:
            view = fb.view
    sim = build_simulator(PAPER)
    from dl2ray.sim import run_episode

    truth = run_episode(sim, DRF(), 5)
    assert finished == pytest.approx(truth.end_time)
    assert total == pytest.approx(sum(truth.end_time[j] - truth.arrival[j] for j in truth.end_time))
    env.observe()
    assert env.stretches == 2 and env.stretch_seed == 6


@pytest.mark.parametrize(("critic", "exploration"), [(False, True), (True, False)])
def test_the_a3c_agents_online_step_honours_table_2s_switches(monkeypatch, critic, exploration) -> None:
    """``--algo pg --agents N --no-critic`` (or ``--no-exploration``) reaches each agent's update."""
    import clusters.a3c.local as local
    from clusters.a3c.weights import params_vector

    seen: dict = {}
    real = local.pg_update

    def spy(*args, **kw):
        seen["entropy"], seen["critic"] = args[7], kw["critic"]
        return real(*args, **kw)

    monkeypatch.setattr(local, "pg_update", spy)
    settings = local.LocalSettings(algo="pg", critic=critic, exploration=exploration)
    step = local.local_learner(SHAPE, [11], 0, [0, 0], settings)
    step.take(params_vector(step.policy, None))
    step.compute(0)
    assert seen["critic"] is critic
    assert seen["entropy"] == (SHAPE.policy.shape.entropy_weight if exploration else 0.0)


def test_the_shape_entropy_bonus_falls_to_zero_over_its_decay_updates(monkeypatch) -> None:
    """``policy.shape.entropy_decay_updates``: update u (from 0) learns with β·max(0, 1 − u/D), alone and
    in an A3C agent (there u is the global update its weights came from)."""
    import clusters.a3c.local as local
    import dl2ray.learn.shape.trainer as trainer_mod
    from clusters.a3c.weights import params_vector

    shape = SHAPE.policy.shape.model_copy(update={"entropy_weight": 0.2, "entropy_decay_updates": 2})
    cfg = SHAPE.model_copy(update={"policy": SHAPE.policy.model_copy(update={"shape": shape})})
    seen: list[float] = []

    def spy_of(real):
        def spy(*args, **kw):
            seen.append(args[7])
            return real(*args, **kw)
        return spy

    monkeypatch.setattr(trainer_mod, "pg_update", spy_of(trainer_mod.pg_update))
    opts = RLOptions(algo="pg", traces=2, val_traces=1, val_every=100)
    trainer = trainer_mod.ShapeTrainer(cfg, None, 0, opts)
    for _ in range(3):
        trainer.update()
    assert seen == pytest.approx([0.2, 0.1, 0.0])

    seen.clear()
    monkeypatch.setattr(local, "pg_update", spy_of(local.pg_update))
    step = local.local_learner(cfg, [11], 0, [0, 0], local.LocalSettings(algo="pg"))
    step.take(params_vector(step.policy, None))
    step.compute(1)
    assert seen == pytest.approx([0.1])


def _with_shape(cfg, **update):
    shape = cfg.policy.shape.model_copy(update=update)
    return cfg.model_copy(update={"policy": cfg.policy.model_copy(update={"shape": shape})})


def test_rewind_restores_the_learning_state_and_keeps_the_run_going(tmp_path) -> None:
    """``ShapeTrainer.rewind``: weights, optimiser and baseline as saved; updates, episodes, the sampling
    generator and the history as they were."""
    import torch

    from dl2ray.learn.shape.trainer import ShapeTrainer

    trainer = ShapeTrainer(SHAPE, None, 0, RLOptions(algo="pg", traces=2, val_traces=1, val_every=100))
    trainer.update()
    trainer.save(tmp_path / "best.pt")
    saved = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    saved_value = {k: v.clone() for k, v in trainer.value.state_dict().items()}
    saved_steps = float(trainer.opt.state_dict()["state"][0]["step"])
    trainer.update()
    trainer.update()
    moved = any(not torch.equal(v, saved[k]) for k, v in trainer.policy.state_dict().items())
    assert moved, "two updates left the weights where they were: nothing to rewind"
    state, episodes = dict(trainer.sample_rng.bit_generator.state), trainer.episodes
    rows = len(trainer.result.history)
    trainer.rewind(tmp_path / "best.pt")
    assert all(torch.equal(v, saved[k]) for k, v in trainer.policy.state_dict().items())
    assert all(torch.equal(v, saved_value[k]) for k, v in trainer.value.state_dict().items())
    assert float(trainer.opt.state_dict()["state"][0]["step"]) == saved_steps  # Adam's, as saved
    assert (trainer.updates, trainer.episodes, len(trainer.result.history)) == (3, episodes, rows)
    assert trainer.sample_rng.bit_generator.state == state
    trainer.update()  # and it learns on
    assert trainer.updates == 4


@pytest.mark.parametrize("rollback", [None, 1.0001])
def test_train_rl_rewinds_after_a_validation_worse_than_rollback_times_the_best(tmp_path, monkeypatch,
                                                                                  rollback) -> None:
    """``policy.shape.rollback`` ρ: after each validation above ρ × the best before it (not the last),
    the learner continues from ``OUT.best.pt``; ``result.rewinds`` lists those updates, the checkpoint
    keeps them; without it, never."""
    import dl2ray.learn.shape.trainer as trainer_mod
    from dl2ray.learn.train import train_rl

    rewound: list[int] = []
    real = trainer_mod.ShapeTrainer.rewind

    def spy(self, path):
        assert path == tmp_path / "run.best.pt"
        rewound.append(self.updates)
        real(self, path)

    monkeypatch.setattr(trainer_mod.ShapeTrainer, "rewind", spy)
    cfg = _with_shape(SHAPE, rollback=rollback, entropy_weight=0.5, lr=0.05, trust=None)  # large steps
    opts = RLOptions(algo="pg", traces=2, val_traces=1, val_every=1, checkpoint_every=1)
    _, result = train_rl(cfg, None, 6, 0, tmp_path / "run.pt", opts)
    jct = [v.avg_jct for v in result.validation]
    want = [v.update for i, v in enumerate(result.validation[1:], 1)
            if rollback is not None and v.update < 6 and v.avg_jct > rollback * min(jct[:i])]
    assert result.rewinds == rewound == want
    if rollback is not None:
        assert want, f"validation {jct} never worse than its best: the test does not test a rewind"
    from dl2ray.policy.shape_net import load_shape_checkpoint

    assert load_shape_checkpoint(tmp_path / "run.pt").extra["result"]["rewinds"] == want


def _stretch_jct(env: ClusterEnvironment) -> float:
    """One stretch of DRF through the interface: its total JCT (the sum of the slots' job-slots)."""
    from dl2ray.schedulers.drf import DRF

    total, view = 0.0, env.observe()
    while True:
        fb = env.act(DRF().decide(view) if view.jobs else Allocation.empty())
        total += fb.in_system
        if fb.ended:
            return total
        assert fb.view is not None
        view = fb.view


def test_stretches_replay_the_trace_files_in_turn_with_the_training_seeds_noise() -> None:
    """``train rl --train-trace``: stretch ``k`` replays file ``k mod n`` with seed ``k mod m``'s noise —
    each stretch is exactly the simulator's run of that (trace, seed)."""
    from dl2ray.evaluation.metrics import censored_avg_jct
    from dl2ray.schedulers.drf import DRF
    from dl2ray.sim import run_episode
    from dl2ray.traces.generate import generate_trace
    from dl2ray.world import build_simulator

    a, b = generate_trace(PAPER, 21), generate_trace(PAPER, 22)
    env = learning_environment(PAPER, [5, 6, 7], traces=[a, b])
    for trace, seed in ((a, 5), (b, 6), (a, 7), (b, 5)):
        total = _stretch_jct(env)
        assert env.stretch_seed == seed
        alone = censored_avg_jct(run_episode(build_simulator(PAPER, trace), DRF(), seed))
        assert total / len(trace) == pytest.approx(alone)
    assert _stretch_jct(env) != _stretch_jct(env)  # (a, 6) and (b, 7): other noise, other trace


def test_validation_on_trace_files_runs_every_file_with_every_seed() -> None:
    from dl2ray.evaluation.metrics import censored_avg_jct
    from dl2ray.learn.validation import episodes, heuristic_jct
    from dl2ray.schedulers.drf import DRF
    from dl2ray.sim import run_episode
    from dl2ray.traces.generate import generate_trace
    from dl2ray.world import build_simulator

    a, b = generate_trace(PAPER, 21), generate_trace(PAPER, 22)
    runs = episodes(PAPER, [1, 2], [a, b])
    assert [s for _, s in runs] == [1, 2, 1, 2]  # a with each seed, then b
    assert runs[0][0] is runs[1][0] and runs[2][0] is runs[3][0] and runs[0][0] is not runs[2][0]
    each = [censored_avg_jct(run_episode(build_simulator(PAPER, t), DRF(), s))
            for t in (a, b) for s in (1, 2)]
    assert heuristic_jct(PAPER, "drf", [1, 2], [a, b]) == pytest.approx(float(np.mean(each)))
    assert heuristic_jct(PAPER, "drf", [1, 2]) != pytest.approx(float(np.mean(each)))  # generated ones


@pytest.mark.slow
def test_train_rl_learns_online_on_trace_files_and_refuses_them_elsewhere(capsys, tmp_path) -> None:
    import json

    from support import config_yaml, run_cli

    from dl2ray import seeds
    from dl2ray.learn.validation import heuristic_jct
    from dl2ray.traces.generate import generate_trace
    from dl2ray.traces.parquet import write_trace

    cfg = config_yaml(SHAPE, tmp_path / "tiny.yaml")
    files = [write_trace(tmp_path / f"t{i}.parquet", generate_trace(SHAPE, 30 + i), source="test",
                         slot_seconds=SHAPE.sim.slot_seconds) for i in range(3)]
    common = ["train", "rl", "--config", str(cfg), "--updates", "1", "--traces", "2", "--val-traces", "2"]
    out = tmp_path / "pg.pt"
    code, _, err = run_cli(capsys, *common, "--algo", "pg", "--out", str(out), "--train-trace", str(files[0]),
                           "--train-trace", str(files[1]), "--val-trace", str(files[2]))
    assert code == 0, err
    run = json.loads(out.with_suffix(".json").read_text())
    assert run["options"]["train_files"] == [str(files[0]), str(files[1])]
    assert run["options"]["val_files"] == [str(files[2])]
    assert len(run["validation"]) == 2 and run["history"][0]["slots"] > 0
    # the reference is DRF's on the validation file, with each validation seed's noise
    val = [generate_trace(SHAPE, 32)]
    assert run["baseline_avg_jct"] == pytest.approx(heuristic_jct(SHAPE, "drf", seeds.validation(2), val))
    for argv, message in ((["--algo", "counterfactual"], "--train-trace: only the online learners"),
                          (["--algo", "pg", "--agents", "2"], "one learner only"),
                          (["--algo", "pg", "--experience", "twin"], "experience twin")):
        code, _, err = run_cli(capsys, *common, *argv, "--out", str(tmp_path / "x.pt"),
                               "--train-trace", str(files[0]))
        assert code == 2 and message in err and "Traceback" not in err, err
    code, _, err = run_cli(capsys, *common, "--algo", "pg", "--out", str(tmp_path / "x.pt"),
                           "--val-trace", str(tmp_path / "missing.parquet"))
    assert code == 2 and "--val-trace" in err and "no such trace file" in err
