"""Warm start by imitation (DL2's recipe): the actor learns a baseline's placements first.

A *teacher* is a :data:`~dl2ray.harmony.policy.Choose` that reproduces a baseline inside
Harmony's one-task-at-a-time loop: it reads the state (:func:`~dl2ray.harmony.policy.decode`),
takes the role the baseline would place next (workers and PS alternate, as
:func:`~dl2ray.harmony.baselines.place_job` does) and the allowed server with the baseline's
lowest score, or ``-1`` (the job waits) where that role fits nowhere, as the baseline gives a
job up; it runs without Harmony's load-balancing pre-check. ``lif-linear``'s score needs only
the task counts and the load, both in the state, so its teacher places every job as
``lif-linear`` does (the test checks equal JCTs).

The imitation data: (state, mask, teacher action, reward ``R`` of the placed job) from the
teacher's runs on training traces; the loss per minibatch is the masked cross-entropy of the
actor plus ``½ (R − V(s))²`` for the critic (so the critic starts out knowing the teacher's
returns); accuracy is measured on a validation trace.
"""

from __future__ import annotations

import numpy as np

from dl2ray.harmony.policy import Choose, decode

TEACHERS = ("lif-linear", "lb-place", "rm-planner", "pack-place")
"""``rm-planner``: :class:`~dl2ray.harmony.planner.PlannerScheduler` on the reward model being
trained, ``pack-place``: :class:`~dl2ray.harmony.planner.PackTeacher` (both replayed through
Harmony's loop); the others: :func:`teacher_choose`."""
REPLAYED = ("rm-planner", "pack-place")


def teacher_choose(name: str, cfg) -> Choose:
    """The teacher for baseline ``name`` (one of :data:`TEACHERS`) on ``cfg``'s cluster."""
    from dl2ray.errors import UserError

    if name not in TEACHERS or name in REPLAYED:
        raise UserError(f"teacher_choose: {name!r}; choose from {list(TEACHERS[:2])}")
    m, types = int(cfg.cluster.capacity.shape[0]), len(cfg.catalogue)
    if name == "lif-linear":
        from dl2ray.harmony.linear import fitted_coefficients

        return linear_teacher(fitted_coefficients(cfg), m)
    return linear_teacher(np.zeros((types, types)), m)


def linear_teacher(coef: np.ndarray, servers: int) -> Choose:
    """The teacher of ``FifoPlacer(linear_score(coef))`` on ``servers`` servers; ``coef`` (L, L)
    all zero is ``lb-place``'s (least load)."""
    m, types = servers, coef.shape[0]

    def choose(state: np.ndarray, mask: np.ndarray, hint) -> int:
        d = decode(state, m, types)
        t = int(np.argmax(d["type"]))
        placed = d["size"] - d["left"]
        worker = d["left"][0] > 0 and (placed[0] <= placed[1] or d["left"][1] == 0)
        role = 0 if worker else 1
        load = 1.0 - d["free_share"].min(axis=1)  # dominant used share, as baselines.load_of
        score = d["counts"] @ (coef[t] + coef[:, t]) + 1e-6 * load
        allowed = mask[role * m : (role + 1) * m]
        if not allowed.any():  # the baseline's next task does not fit: it gives the job up
            return -1
        return role * m + int(np.argmin(np.where(allowed, score, np.inf)))

    return choose


def collect(
    cfg, teacher: Choose | str, predict, seeds
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(S (n, state), M (n, 2M) bool, A (n,), R (n,))``: the teacher's steps on ``seeds``' traces,
    each with the reward model's return of the job it placed (``teacher``: a :data:`Choose` or
    one of :data:`REPLAYED`)."""
    from dl2ray.harmony.nets import max_nodes
    from dl2ray.harmony.planner import PackTeacher, PlannerScheduler
    from dl2ray.harmony.policy import HarmonyScheduler
    from dl2ray.world import build_simulator

    rows: list[tuple] = []
    cur: list[tuple] = []

    def choose(s, mk, h) -> int:
        assert callable(teacher)
        a = teacher(s, mk, h)
        if a >= 0:
            cur.append((s, mk, a))
        return a

    def finish(job_id: int, reward: float) -> None:
        rows.extend((s, mk, a, reward) for s, mk, a in cur)
        cur.clear()

    sched: HarmonyScheduler | PlannerScheduler
    if teacher in REPLAYED:
        kind = PlannerScheduler if teacher == "rm-planner" else PackTeacher
        sched = kind(
            predict, max_nodes=max_nodes(cfg), record=lambda s, mk, a: cur.append((s, mk, a)), finish=finish
        )
    else:
        sched = HarmonyScheduler(
            choose, predict, finish=finish, rollback=cur.clear, max_nodes=max_nodes(cfg), precheck=False
        )
    for seed in seeds:
        sim = build_simulator(cfg)
        view = sim.reset(seed)
        if isinstance(sched, PlannerScheduler):
            sched.reset(seed)
        while not sim.done:
            step = sim.step(sched.decide(view))
            cur.clear()
            view = step.view
    return (
        np.stack([r[0] for r in rows]).astype(np.float32),
        np.stack([r[1] for r in rows]),
        np.array([r[2] for r in rows], np.int64),
        np.array([r[3] for r in rows], np.float32),
    )


def imitate(net, data, steps: int, batch: int, lr: float, seed: int) -> None:
    """``steps`` Adam steps of masked cross-entropy + ½ value MSE on ``data`` (from :func:`collect`)."""
    import torch

    S, M, A, R = (torch.from_numpy(x) for x in data)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    rng = np.random.default_rng([seed, 0x1317])
    for _ in range(steps):
        idx = torch.from_numpy(rng.integers(0, len(A), size=min(batch, len(A))))
        logits, v = net(S[idx])
        logp = torch.log_softmax(logits.masked_fill(~M[idx], -1e9), 1)
        loss = -logp.gather(1, A[idx][:, None]).mean() + 0.5 * ((R[idx] - v) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def accuracy(net, data) -> float:
    """Share of ``data``'s steps where the greedy (masked) actor picks the teacher's action."""
    import torch

    S, M, A, _ = (torch.from_numpy(x) for x in data)
    with torch.no_grad():
        logits, _ = net(S)
    return float((logits.masked_fill(~M, -1e9).argmax(1) == A).float().mean())
