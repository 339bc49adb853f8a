"""The SCHED² scheduler: the decision loop over :mod:`dl2ray.sched2.state` with a Q-function.

Event-driven as in the paper: the agent acts only in slots where the job set changed (an
arrival or a completion since its last decision) and some waiting job fits. There, with the
clock frozen, it takes actions — start window job ``i`` (placed by gang packing) or ϕ —
until ϕ or until nothing more fits. Running jobs are re-emitted where they are.

``choose(state, mask) -> action`` picks actions (greedy on the numpy Q-network for
``sched2:PATH``; ε-greedy while training); ``record(state, mask, action, reward)``, when
given, sees every decision step (the DQN trainer builds transitions from it); ``cost(c)``,
when given, hears at the start of every slot the job-hours that slot adds to the total JCT,
``c = jobs in the system × slot seconds / time_scale``, before any decision of that slot (the
JCT reward of :mod:`dl2ray.sched2.dqn` charges it to the latest decision).
:meth:`Sched2Scheduler.pick` is the one place an action is chosen; a teacher that needs the
jobs behind the state (:class:`dl2ray.sched2.imitation.TeacherScheduler`) overrides it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dl2ray.gang.sim import keep_running, running, usage_of
from dl2ray.sched2.baselines import Profile
from dl2ray.sched2.state import Sched2Shape, busy_gpus, effectiveness, encode, waiting_jobs
from dl2ray.view import Allocation, ClusterView, JobPlacement, JobView, Tasks

Choose = Callable[[np.ndarray, np.ndarray], int]
Record = Callable[[np.ndarray, np.ndarray, int, float], None]
Cost = Callable[[float], None]


class Sched2Scheduler:
    """SCHED²'s job selection (see the module docstring)."""

    name = "sched2"

    def __init__(
        self, cfg, shape: Sched2Shape, choose: Choose, record: Record | None = None, cost: Cost | None = None
    ) -> None:
        self.profile = Profile(cfg)
        self.shape = shape
        cap = cfg.cluster.capacity
        if (cap.shape[0], int(cap[:, 1].max())) != (shape.servers, shape.gpus):
            from dl2ray.errors import UserError

            raise UserError(
                f"sched2: the model is for {shape.servers} servers × {shape.gpus} GPUs, the "
                f"config has {cap.shape[0]} × {int(cap[:, 1].max())}"
            )
        self.choose, self.record, self.cost = choose, record, cost
        self._seen: frozenset[int] | None = None

    def reset(self, seed: int) -> None:
        self._seen = None

    def pick(
        self,
        view: ClusterView,
        waiting: list[JobView],
        places: list[JobPlacement | None],
        state: np.ndarray,
        mask: np.ndarray,
    ) -> int:
        """The action for ``state`` (window = ``waiting[:J]``, their placements ``places``)."""
        return int(self.choose(state, mask))

    def acts_on(self, view: ClusterView) -> bool:
        """Whether :meth:`decide` will consider starting jobs in ``view`` (its job set changed)."""
        return frozenset(j.job_id for j in view.jobs) != self._seen

    def decide(self, view: ClusterView) -> Allocation:
        if self.cost is not None:
            self.cost(len(view.jobs) * view.slot_seconds / self.shape.time_scale)
        tasks, placement, free = keep_running(view)
        if not self.acts_on(view):
            return Allocation(tasks, placement)
        self._seen = frozenset(j.job_id for j in view.jobs)
        run = running(view.jobs)
        busy = busy_gpus(view, self.profile, run)
        started: set[int] = set()
        while True:
            waiting = waiting_jobs(view, started)
            state, mask, places = encode(view, self.shape, self.profile, free, busy, waiting)
            if not mask[:-1].any():
                break
            action = self.pick(view, waiting, places, state, mask)
            if not mask[action]:
                raise ValueError(f"sched2: action {action} is masked")
            if action == self.shape.window:
                if self.record:
                    self.record(state, mask, action, 0.0)
                break
            job, pl = waiting[action], places[action]
            assert pl is not None and job.fixed_tasks is not None
            reward = effectiveness(view, job, pl, self.profile)
            if self.record:
                self.record(state, mask, action, reward)
            tasks[job.job_id] = Tasks(job.fixed_tasks.workers, job.fixed_tasks.ps)
            placement[job.job_id] = pl
            free = free - usage_of(view.capacity, [job], lambda _j, pl=pl: pl)
            left = self.profile.actual_s(job, pl)
            for node in pl.worker_nodes:
                busy[node].append(left)
            started.add(job.job_id)
        return Allocation(tasks, placement)


def load(arg: str | None, cfg) -> Sched2Scheduler:
    """``sched2:PATH``: the greedy scheduler of a checkpoint written by ``dl2ray train sched2``."""
    from pathlib import Path

    from dl2ray.errors import UserError
    from dl2ray.sched2.qnet import numpy_qnet, read_checkpoint

    if not arg:
        raise UserError("sched2 needs a checkpoint: sched2:PATH (e.g. sched2:models/sched2.pt)")
    if not Path(arg).is_file():
        raise UserError(f"sched2: {arg}: no such checkpoint")
    shape, weights, _ = read_checkpoint(arg)
    net = numpy_qnet(shape, weights)
    return Sched2Scheduler(cfg, shape, net.greedy)
