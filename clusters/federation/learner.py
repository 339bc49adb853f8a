"""Federated learning across clusters: the learner (:class:`FederatedPolicyImpl`).

:class:`FederatedPolicyImpl` is the A3C :class:`~clusters.a3c.global_policy.GlobalPolicyImpl`
(same Adam step, history, TensorBoard, checkpoint ``global.pt`` + ``.json``
+ ``.best.pt``) with a member registry. A member *joins* (gets the current
weights), *pushes* gradients computed on the weights of update ``version``
and *pulls* weights. A push whose lag ``updates - version`` exceeds the
member's ``staleness`` bound is dropped and counted; an accepted one is
multiplied by the member's ``weight`` and applied at once. The registry
(per member: updates, dropped, joins, last contact, lag, bytes, validation)
is saved in the checkpoint, so it survives a restart. ``boot`` counts the
learner's starts (saved at each start): a member that sees it change knows
the learner restarted from its last checkpoint and takes fresh weights.
A push computed on weights newer than the learner (``version > updates``,
lost in a restart) is dropped as ``rewound`` and answered with fresh weights.

Members: :mod:`clusters.federation.members` (simulated clusters),
:mod:`clusters.federation.live` (live Ray and Kubernetes clusters); how they
reach the learner: :mod:`clusters.federation.links`, :mod:`clusters.federation.http`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from clusters.a3c.global_policy import A3COptions, GlobalPolicyImpl
from clusters.runtime import actor_class
from dl2ray.config import ExperimentConfig
from dl2ray.learn.records import UpdateRow

log = logging.getLogger("dl2ray.federation")


@dataclass
class MemberRecord:
    """What the learner knows of one member (saved in its checkpoint)."""

    name: str
    index: int
    mode: str = "learn"
    weight: float = 1.0
    staleness: int = 8
    updates: int = 0  # accepted gradients
    dropped: int = 0  # gradients over the staleness bound
    rewound: int = 0  # gradients on weights a learner restart lost
    refused: int = 0  # gradients the checks refused (wrong shape, NaN, norm above the bound)
    joins: int = 0
    pulls: int = 0
    last_contact: float = 0.0  # time.time() of the latest call; 0: never
    last_lag: int = 0
    max_lag: int = 0
    bytes_last: int = 0  # HTTP bytes (request + reply) of its latest update, as it measured them; 0: actor
    bytes_total: int = 0
    val_update: int = -1  # global update of the weights its latest validation judged
    val_jct: float | None = None  # greedy policy's average JCT on its validation traces (slots)
    drf_jct: float | None = None  # DRF's on the same traces
    val_history: list[tuple[int, float]] = field(default_factory=list)


class FederatedPolicyImpl(GlobalPolicyImpl):
    """The learner (module docstring); the plain class behind :data:`FederatedPolicy`."""

    def __init__(self, cfg: ExperimentConfig, init: str | None, seed: int, checkpoint: str | None,
                 options: A3COptions, members: list[dict[str, Any]], logdir: str | None = None) -> None:
        self.members: dict[str, MemberRecord] = {
            m["name"]: MemberRecord(m["name"], i, m["mode"], float(m["weight"]), int(m["staleness"]))
            for i, m in enumerate(members)}
        self.boot = 0
        super().__init__(cfg, init, seed, checkpoint, options, logdir, resume=True)
        self.boot += 1
        self.started = time.time()
        if self.checkpoint is not None:
            self.save(str(self.checkpoint))  # the boot count survives a crash before the next checkpoint

    # -- the member protocol -----------------------------------------------------------------------

    def _record(self, name: str) -> MemberRecord:
        try:
            rec = self.members[name]
        except KeyError:
            raise ValueError(f"unknown member {name!r}; members: {sorted(self.members)}") from None
        rec.last_contact = time.time()
        return rec

    def join(self, name: str) -> dict[str, Any]:
        """A member (re)starts: ``{"updates", "boot", "weights"}`` (fresh weights)."""
        rec = self._record(name)
        rec.joins += 1
        return {"updates": self.opt.updates, "boot": self.boot,
                "weights": self._weights()}

    def push_member(self, name: str, flat_grad: np.ndarray, row: UpdateRow, version: int, boot: int,
                    pull: bool = True, bytes_last: int = 0) -> dict[str, Any]:
        """Apply (or drop) one gradient computed on the weights of update ``version`` of boot ``boot``.

        Returns ``{"updates", "boot", "accepted": "yes" | "stale" | "rewound" | "shape" | "nan" | "norm",
        "lag", "weights"}`` (the last three: refused by :meth:`check`, counted in ``refused``);
        weights (the flat vector) when ``pull``, when dropped, or when ``boot`` is not the current one.
        """
        rec = self._record(name)
        if bytes_last:
            rec.bytes_last = int(bytes_last)
            rec.bytes_total += int(bytes_last)
        lag = self.opt.updates - version
        if version > self.opt.updates:
            rec.rewound += 1
            verdict = "rewound"
        elif lag > rec.staleness:
            rec.dropped += 1
            verdict = "stale"
        elif (why := self.check(flat_grad)) is not None:
            rec.refused += 1
            self.refused[why] += 1
            verdict = why
        else:
            grad = np.asarray(flat_grad, dtype=np.float32) * np.float32(rec.weight)
            self.push(grad, row, rec.index)
            rec.updates += 1
            verdict = "yes"
        rec.last_lag = lag
        rec.max_lag = max(rec.max_lag, lag)
        send = pull or verdict != "yes" or boot != self.boot
        return {"updates": self.opt.updates, "boot": self.boot, "accepted": verdict, "lag": lag,
                "weights": self._weights() if send else None}

    def pull_member(self, name: str, since: int = -1, boot: int = -1) -> dict[str, Any]:
        """``{"updates", "boot", "weights"}``; weights None when ``since`` is current in this boot."""
        rec = self._record(name)
        rec.pulls += 1
        fresh = since != self.opt.updates or boot != self.boot
        return {"updates": self.opt.updates, "boot": self.boot, "weights": self._weights() if fresh else None}

    def report(self, name: str, update: int, val_jct: float, drf_jct: float) -> None:
        """A member's validation: the greedy policy of ``update`` vs DRF on its own validation traces."""
        rec = self._record(name)
        rec.val_update, rec.val_jct, rec.drf_jct = int(update), float(val_jct), float(drf_jct)
        rec.val_history.append((int(update), float(val_jct)))
        if self.writer is not None:
            self.writer.add_scalar(f"federation/{name}/val_avg_jct", val_jct, update)
            self.writer.add_scalar(f"federation/{name}/jct_over_drf", val_jct / drf_jct, update)

    def version(self) -> dict[str, int]:
        return {"updates": self.opt.updates, "boot": self.boot}

    def status(self) -> dict[str, Any]:
        """The learner's view: total updates, boot, and one dict per member (:class:`MemberRecord`)."""
        now = time.time()
        members = []
        for rec in self.members.values():
            d = dataclasses.asdict(rec)
            d.pop("val_history")
            d["last_contact_s"] = round(now - rec.last_contact, 3) if rec.last_contact else None
            d["staleness"] = rec.last_lag
            d["staleness_bound"] = rec.staleness
            members.append(d)
        return {"updates": self.opt.updates, "boot": self.boot, "resumed": self.resumed,
                "uptime_s": round(now - self.started, 3), "members": members}

    def final_checkpoint(self) -> int:
        """Finish (validations due, checkpoint, run JSON, logs); the update count written."""
        self.finish()
        return self.opt.updates

    def _weights(self) -> np.ndarray:
        return self._vector()

    # -- checkpoints: GlobalPolicyImpl's, plus the registry and boot count --------------------------

    def _checkpoint_extra(self) -> dict[str, Any]:
        return {**super()._checkpoint_extra(),
                "federation": {"boot": self.boot,
                               "members": [dataclasses.asdict(r) for r in self.members.values()]}}

    def _restore_extra(self, extra: dict[str, Any]) -> None:
        fed = extra.get("federation") or {}
        self.boot = int(fed.get("boot", 0))
        for saved in fed.get("members", []):
            rec = self.members.get(saved["name"])
            if rec is None:  # a member no longer in the file: its counts stay in the history only
                continue
            rec.refused = int(saved.get("refused", 0))
            for k in ("updates", "dropped", "rewound", "joins", "pulls", "last_contact", "last_lag",
                      "max_lag", "bytes_last", "bytes_total", "val_update", "val_jct", "drf_jct"):
                setattr(rec, k, saved[k])
            rec.val_history = [tuple(x) for x in saved.get("val_history", [])]


FederatedPolicy = actor_class(FederatedPolicyImpl, num_cpus=0, max_restarts=-1, max_task_retries=-1)
"""The learner actor: named ``fed-NAME-learner`` in namespace ``dl2ray``, detached, restarted without limit
(a restart resumes from its checkpoint; calls in flight run again once it is back)."""


def a3c_options(fed) -> A3COptions:
    lrn = fed.learner.learning
    n = len(fed.members)
    return A3COptions(agents=n, traces=max(n, sum(m.traces for m in fed.members)), val_every=None,
                      checkpoint_every=fed.learner.checkpoint_every, critic=lrn.critic,
                      exploration=lrn.exploration, steps_per_update=lrn.steps_per_update,
                      max_grad_norm=lrn.max_grad_norm, threads=lrn.threads)
