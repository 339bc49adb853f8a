"""Training SCHED²'s Q-network (``dl2ray train sched2``): the warm start, DAgger and rollout rounds, then the
DQN episodes (:mod:`dl2ray.sched2.dqn`), keeping the best checkpoint on the validation traces.

Warm start (``warm``, :mod:`dl2ray.sched2.imitation`): before the first episode the online net
imitates a baseline on its own training traces (training seeds from offset
:data:`DEMO_OFFSET`, so never an episode's trace and the same for any ``episodes``), the target net
copies it, the replay starts with the teacher's transitions, and the imitated net is validated
and saved as "episode −1", so ``episodes = 0`` ships the imitation as it is.
"""

from __future__ import annotations

import time

from dl2ray.sched2.dqn import DEMO_OFFSET, DQNLearner, DQNSettings, TrainLog, dqn_episode, evaluate
from dl2ray.sched2.imitation import Demos, accuracy, imitate, record_demos, student_demos
from dl2ray.sched2.rollout import improve

__all__ = ["DQNSettings", "TrainLog", "dagger", "train", "warm_stages", "warm_start"]


def warm_start(lr: DQNLearner, cfg, train_cfg, st: DQNSettings, warm,
               on_row=None) -> tuple[list[dict], tuple]:
    """Imitate ``warm.teacher`` into ``lr.net`` (module docstring).

    Returns the epoch rows and ``(training demos, validation demos)`` (DAgger and the rollout
    step refit on them)."""
    from dl2ray import seeds

    jct_scale = st.jct_scale if st.reward == "jct" else None
    train_demos = record_demos(
        train_cfg, lr.shape, warm.teacher, seeds.training(warm.traces, DEMO_OFFSET), jct_scale
    )
    val_demos = record_demos(cfg, lr.shape, warm.teacher, seeds.validation(st.val_traces), jct_scale)
    rows = imitate(lr.net, train_demos, val_demos, warm, st.seed, on_epoch=on_row)
    lr.target.load_state_dict(lr.net.state_dict())
    d = train_demos
    for i in range(min(len(d), st.buffer)):
        lr.replay.add(d.s[i], d.m[i], d.a[i], d.r[i], d.s2[i], d.m2[i], d.d[i])
    for row in rows:
        row.update(demos=len(train_demos), val_demos=len(val_demos))
    return rows, (train_demos, val_demos)


DAGGER_OFFSET = 600_000
"""Training-seed offset of DAgger's traces (round ``k`` uses ``offset + k·dagger_traces``)."""


def dagger(lr: DQNLearner, train_cfg, shape, warm, demos: tuple, seed: int):
    """DAgger rounds after the warm start (:class:`~dl2ray.sched2.imitation.ImitationSettings`
    ``dagger``): yields one log row per round, after refitting ``lr.net`` in place."""
    from dataclasses import replace

    from dl2ray import seeds
    from dl2ray.sched2.qnet import numpy_qnet

    train_demos, val_demos = demos
    got = [train_demos]
    for k in range(warm.dagger):
        net = numpy_qnet(shape, lr.weights())
        trace_seeds = seeds.training(warm.dagger_traces, DAGGER_OFFSET + k * warm.dagger_traces)
        new = student_demos(train_cfg, shape, warm.teacher, net.q, trace_seeds)
        agree = accuracy(net.q(new.s), new)
        got.append(new)
        fit = replace(warm, epochs=warm.dagger_epochs, td_weight=0.0)
        rows = imitate(lr.net, Demos.concat(got, [1] * len(got)), val_demos, fit, seed + 100 + k)
        lr.target.load_state_dict(lr.net.state_dict())
        yield {"dagger_round": k, "new_states": len(new), "agreement_before": agree, **rows[-1]}


def warm_stages(lr: DQNLearner, cfg, train_cfg, warm, rollout, log: TrainLog, on_row=None):
    """The stages before DQN, each yielding ``(log row, stage name)`` once ``lr.net`` is ready to
    validate: the imitation (its epoch rows go to ``log.imitation``), each DAgger round, each
    rollout round."""
    log.imitation, demos = warm_start(lr, cfg, train_cfg, lr.st, warm, on_row=on_row)
    yield {"episode": -1}, "imitation"
    for row in dagger(lr, train_cfg, lr.shape, warm, demos, lr.st.seed):
        yield row, f"dagger round {row['dagger_round']}"
    if rollout is not None and rollout.iterations > 0:
        train_demos, val_demos = demos
        for row in improve(lr, train_cfg, lr.shape, rollout, train_demos, val_demos, lr.st.seed):
            yield row, f"rollout round {row['rollout_iter']}"


def train(cfg, st: DQNSettings, out_path, on_episode=None, warm=None, rollout=None) -> TrainLog:
    """Train, write the best-on-validation checkpoint to ``out_path``; returns the log.

    ``warm``: an :class:`~dl2ray.sched2.imitation.ImitationSettings` to start from (None: from
    the random initialisation, as before). ``rollout``: a
    :class:`~dl2ray.sched2.rollout.RolloutSettings` to improve the imitation by rollouts
    (needs ``warm``) before the DQN episodes; each round is validated and may be kept.
    """
    import torch

    from dl2ray import seeds
    from dl2ray.sched2.qnet import save_checkpoint
    from dl2ray.sched2.state import Sched2Shape

    torch.set_num_threads(1)
    shape = Sched2Shape.from_config(cfg, st.window, st.arch)
    lr = DQNLearner(shape, st)
    train_cfg = (
        cfg
        if st.train_jobs is None
        else cfg.model_copy(update={"workload": cfg.workload.model_copy(update={"num_jobs": st.train_jobs})})
    )
    val_seeds = seeds.validation(st.val_traces)
    log = TrainLog()
    best = float("inf")
    t0 = time.time()

    def keep_if_best(val_jct: float, episode: int, stage: str = "dqn") -> None:
        nonlocal best
        if val_jct < best:
            best = val_jct
            log.best = {
                "settings": st.__dict__,
                "warm_start": None if warm is None else warm.__dict__,
                "imitation": log.imitation[-1] if log.imitation else None,
                "episode": episode,
                "stage": stage,
                "val_jct": best,
                "val_seeds": val_seeds,
                "config": cfg.name,
            }
            save_checkpoint(out_path, lr.net, log.best)

    if warm is not None:
        for row, stage in warm_stages(lr, cfg, train_cfg, warm, rollout, log, on_episode):
            row["seconds"] = time.time() - t0
            row["val_jct"] = evaluate(cfg, shape, lr.weights(), val_seeds)
            keep_if_best(row["val_jct"], -1, stage)
            log.rows.append(row)
            if on_episode:
                on_episode(row)
    for ep in range(st.episodes):
        frac = min(ep / max(1.0, st.eps_fraction * st.episodes), 1.0)
        lr.eps = max(st.eps_end, st.eps_start + (st.eps_end - st.eps_start) * frac)
        lr.beta = st.beta_start + (1.0 - st.beta_start) * ep / max(1, st.episodes - 1)
        row = dqn_episode(lr, cfg, train_cfg, shape, seeds.training(1, ep)[0])
        row.update(episode=ep, seconds=time.time() - t0)
        if (ep + 1) % st.eval_every == 0 or ep == st.episodes - 1:
            row["val_jct"] = evaluate(cfg, shape, lr.weights(), val_seeds)
            keep_if_best(row["val_jct"], ep)
        log.rows.append(row)
        if on_episode:
            on_episode(row)
    return log
