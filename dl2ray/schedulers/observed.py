"""What heuristics learn from observations: new-observation tracking and remaining time.

Schedulers see only declared epochs and :class:`~dl2ray.view.Observation`\\ s
(never the simulator's speed function), and remember what they saw across
slots in their own state, cleared by ``reset``.
"""

from __future__ import annotations

from dl2ray.view import ClusterView, JobView, Observation


class NewObservations:
    """Hands out every observation of every job exactly once across slots.

    Jobs that left the view (completed) are forgotten, so the memory is
    bounded by the number of jobs in the cluster.
    """

    def __init__(self) -> None:
        self._seen: dict[int, int] = {}

    def reset(self) -> None:
        self._seen.clear()

    def __call__(self, view: ClusterView) -> list[tuple[JobView, Observation]]:
        """(job, observation) pairs not handed out before, of slots that trained."""
        return [
            (job, obs) for job, new in self.by_job(view) for obs in new if _trained(obs)
        ]

    def by_job(self, view: ClusterView) -> list[tuple[JobView, tuple[Observation, ...]]]:
        """Per job with new observations: the new ones (untrained slots included)."""
        out = []
        seen: dict[int, int] = {}
        for job in view.jobs:
            start = self._seen.get(job.job_id, 0)
            if len(job.history) > start:
                out.append((job, job.history[start:]))
            seen[job.job_id] = len(job.history)
        self._seen = seen
        return out


def _trained(obs: Observation) -> bool:
    return obs.epochs > 0 and obs.seconds > 0


class RemainingTime:
    """Estimated remaining run time of every job, in seconds, from observations only.

    - A job that trained: ``remaining_epochs / observed_speed`` with the speed
      (epochs/s) of its most recent training slot.
    - A job that never trained, of a type seen training: ``remaining_epochs /
      s_type``, where ``s_type`` is the mean observed speed (epochs/s) of all
      observations of that type so far — the speed a job of the type actually
      reached under this scheduler (not per bundle: measured speeds scale far
      below linearly in the bundle count, so neither per-bundle × 1 nor
      per-bundle × caps is a fair stand-in).
    - A job of a type never seen training: ``(remaining_epochs / base_epochs)
      × T_ref``, with ``T_ref`` the mean of ``base_epochs / s_type`` over the
      seen types (how long a typical job of base length takes), or 1 when no
      type was seen — then all jobs rank by remaining fraction of a base job.
    """

    def __init__(self) -> None:
        self._new = NewObservations()
        self._sum: dict[int, float] = {}
        self._count: dict[int, int] = {}

    def reset(self) -> None:
        self._new.reset()
        self._sum.clear()
        self._count.clear()

    def update(self, view: ClusterView) -> None:
        """Record the observations of ``view`` not seen before."""
        for job, obs in self._new(view):
            t = job.type_index
            self._sum[t] = self._sum.get(t, 0.0) + obs.epochs / obs.seconds
            self._count[t] = self._count.get(t, 0) + 1

    def type_speed(self, type_index: int) -> float | None:
        """Mean observed speed (epochs/s) of a type, or None if never seen."""
        n = self._count.get(type_index)
        return None if not n else self._sum[type_index] / n

    def estimates(self, view: ClusterView) -> list[float]:
        """Seconds per job, in ``view.jobs`` order (see the class docstring)."""
        base = [t.base_epochs for t in view.catalogue.types]
        seen = [base[t] * n / self._sum[t] for t, n in self._count.items() if self._sum[t] > 0]
        t_ref = sum(seen) / len(seen) if seen else 1.0
        out = []
        for job in view.jobs:
            speed = job.observed_speed() or self.type_speed(job.type_index)
            if speed:
                out.append(job.remaining_epochs / speed)
            else:
                out.append(job.remaining_epochs / base[job.type_index] * t_ref)
        return out
