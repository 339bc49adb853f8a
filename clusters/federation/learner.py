"""Federated learning across clusters: the learner (:class:`FederatedPolicyImpl`) and its members.

- :class:`FederatedPolicyImpl` is the A3C :class:`~clusters.a3c.training.GlobalPolicyImpl`
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
- :class:`MemberAgentImpl` is one member cluster's agent: a control loop in its
  own thread (each step's failure is logged and retried with capped backoff,
  never ends the loop) on a simulated cluster of the member's own config. In
  ``learn`` mode it collects ``steps_per_update`` decision steps with the
  sampled policy, pushes the gradient and takes the reply's weights; in
  ``shadow`` and ``serve-only`` it pulls weights every ``pull_interval_s``
  and pushes nothing (shadow: its cluster keeps the fallback, DRF, and the
  policy is only judged; serve-only: the cluster is scheduled by the pulled
  policy). Every ``val_every`` pushes (pulls) it measures the greedy policy's
  average JCT on its own validation traces against DRF's and reports it.
- A member reaches the learner through a *link*: :class:`ActorLink` (same Ray
  cluster: calls on the named actor, retried by Ray while the learner
  restarts) or :class:`clusters.federation.http.HttpLink` (another Ray cluster: the
  learner's HTTP endpoint with the shared token). Both raise
  :class:`LinkDown` when the learner cannot be reached.

Random streams: member ``i``'s action sampling ``[seed, 1, i, incarnation]``,
exploration ``[seed, 2, i, incarnation]`` (incarnation: 1 after a Ray restart
of that member); networks from ``seed``.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import ray
import torch

from clusters.a3c.sim_backend import SimBackend
from clusters.a3c.training import A3COptions, GlobalPolicyImpl, _atomic_save, _incarnation, _load_vector
from dl2ray.config import ExperimentConfig
from dl2ray.learn import rl
from dl2ray.learn import seeds as seedsets
from dl2ray.learn.actor_critic import LossConfig, compute_gradients, flatten
from dl2ray.learn.exploration import JobAwareExploration
from dl2ray.learn.rl import UpdateRow
from dl2ray.learn.rollout import Collector, to_batch
from dl2ray.policy.encoding import Encoding
from dl2ray.policy.network import NumpyPolicy, build_networks, load_checkpoint

log = logging.getLogger("dl2ray.federation")
NAMESPACE = "dl2ray"  # every federation actor lives here (as the live agents do)


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

        Returns ``{"updates", "boot", "accepted": "yes" | "stale" | "rewound", "lag", "weights"}``;
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
        from clusters.a3c.training import _params_vector

        return _params_vector(self.policy, self.value)

    # -- checkpoints: GlobalPolicyImpl's, plus the registry and boot count --------------------------

    def save(self, path: str) -> None:
        extra = {"kind": "a3c", "seed": self.seed, "updates": self.opt.updates,
                 "optimizer": self.opt.state_dict(),
                 "per_agent": {str(k): v for k, v in self.per_agent.items()},
                 "options": dataclasses.asdict(self.opts), "result": dataclasses.asdict(self.result),
                 "federation": {"boot": self.boot,
                                "members": [dataclasses.asdict(r) for r in self.members.values()]}}
        _atomic_save(Path(path), self.policy, self.value, self.cfg.catalogue.names, extra)

    def _restore(self, path: Path) -> None:
        super()._restore(path)
        fed = load_checkpoint(path).extra.get("federation") or {}
        self.boot = int(fed.get("boot", 0))
        for saved in fed.get("members", []):
            rec = self.members.get(saved["name"])
            if rec is None:  # a member no longer in the file: its counts stay in the history only
                continue
            for k in ("updates", "dropped", "rewound", "joins", "pulls", "last_contact", "last_lag",
                      "max_lag", "bytes_last", "bytes_total", "val_update", "val_jct", "drf_jct"):
                setattr(rec, k, saved[k])
            rec.val_history = [tuple(x) for x in saved.get("val_history", [])]


FederatedPolicy = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)(FederatedPolicyImpl)
"""The learner actor: named ``fed-NAME-learner`` in namespace ``dl2ray``, detached, restarted without limit
(a restart resumes from its checkpoint; calls in flight run again once it is back)."""


# -- links -----------------------------------------------------------------------------------------------


class LinkDown(RuntimeError):
    """The learner cannot be reached now (the member backs off and retries)."""


class Link(Protocol):
    def join(self, name: str) -> dict[str, Any]: ...
    def push(self, name: str, flat_grad: np.ndarray, row: UpdateRow, version: int, boot: int,
             pull: bool) -> dict[str, Any]: ...
    def pull(self, name: str, since: int, boot: int) -> dict[str, Any]: ...
    def report(self, name: str, update: int, val_jct: float, drf_jct: float) -> None: ...


class ActorLink:
    """Calls on the named learner actor of the current Ray cluster."""

    def __init__(self, actor_name: str, timeout_s: float = 60.0) -> None:
        self.actor_name, self.timeout_s = actor_name, timeout_s
        self.bytes_last = 0  # no HTTP: nothing to measure

    def _call(self, method: str, *args: Any) -> Any:
        try:
            actor = ray.get_actor(self.actor_name, namespace=NAMESPACE)
            return ray.get(getattr(actor, method).remote(*args), timeout=self.timeout_s)
        except (ValueError, ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
            raise LinkDown(f"learner {self.actor_name}: {type(exc).__name__}: {exc}") from exc

    def join(self, name: str) -> dict[str, Any]:
        return self._call("join", name)

    def push(self, name, flat_grad, row, version, boot, pull):
        return self._call("push_member", name, flat_grad, row, version, boot, pull, 0)

    def pull(self, name, since, boot):
        return self._call("pull_member", name, since, boot)

    def report(self, name, update, val_jct, drf_jct):
        self._call("report", name, update, val_jct, drf_jct)


# -- the member ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemberSpec:
    """What a member agent needs of the federation file (plain values: it travels to another Ray)."""

    name: str
    index: int
    mode: str
    traces: list[int]
    val_traces: list[int]
    val_every: int
    pull_interval_s: float
    seed: int
    steps_per_update: int | None = None
    critic: bool = True
    exploration: bool = True
    pull_every: int = 1
    threads: int = 1


@dataclass
class MemberCounters:
    pushed: int = 0
    accepted: int = 0
    stale: int = 0
    rewound: int = 0
    pulls: int = 0
    joins: int = 0
    reconnects: int = 0  # learner boots seen change (restarts survived)
    errors: int = 0
    last_error: str | None = None
    version: int = -1
    boot: int = -1
    slots: int = 0
    bytes_last: int = 0
    validations: int = 0


class MemberAgentImpl:
    """One member's agent (module docstring); behind :data:`MemberAgent`. The loop starts at once."""

    def __init__(self, cfg: ExperimentConfig, spec: MemberSpec, link: Link, start: bool = True) -> None:
        torch.set_num_threads(spec.threads)
        self.cfg, self.spec, self.link = cfg, spec, link
        self.incarnation = _incarnation()
        self.enc = Encoding.from_config(cfg)
        self.policy, self.value = build_networks(self.enc, cfg.policy.hidden, spec.seed)  # replaced on join
        self.numpy: NumpyPolicy | None = None
        self.loss_cfg = LossConfig.from_config(cfg, critic=spec.critic)
        self.steps = spec.steps_per_update or cfg.policy.minibatch
        explore = JobAwareExploration.from_config(cfg) if spec.exploration else None
        streams = [spec.index, self.incarnation]
        self.collector = Collector(
            SimBackend.from_config(cfg),  # type: ignore[arg-type]  # duck-typed like ClusterAgentImpl's
            self.enc, spec.traces, np.random.default_rng([spec.seed, 1, *streams]), explore,
            np.random.default_rng([spec.seed, 2, *streams]))
        self.c = MemberCounters()
        self.drf: float | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        if start:
            self.start()

    def start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name=f"member-{self.spec.name}", daemon=True)
            self._thread.start()

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=120)
        return self.status()

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {"name": self.spec.name, "mode": self.spec.mode, "incarnation": self.incarnation,
                    "running": bool(self._thread and self._thread.is_alive()), **dataclasses.asdict(self.c)}

    # -- the loop --------------------------------------------------------------------------------------

    def _loop(self) -> None:
        backoff = 0.2
        while not self._stop.is_set():
            try:
                self.step()
                backoff = 0.2
            except LinkDown as exc:
                self._error(exc)
                self.numpy = None  # rejoin with fresh weights once the learner answers again
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
            except Exception as exc:  # a step's failure is logged and never ends the loop
                log.exception("member %s: step failed", self.spec.name)
                self._error(exc)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)

    def _error(self, exc: BaseException) -> None:
        with self._lock:
            self.c.errors += 1
            self.c.last_error = f"{type(exc).__name__}: {exc}"[:300]

    def step(self) -> None:
        """One turn: join if needed; then one push (learn) or one pull (shadow, serve-only)."""
        if self.numpy is None:
            r = self.link.join(self.spec.name)
            with self._lock:
                self.c.joins += 1
            self._take(r)
        if self.spec.mode == "learn":
            self._learn_turn()
            due = self.c.pushed % self.spec.val_every == 0
        else:
            self._stop.wait(self.spec.pull_interval_s)
            r = self.link.pull(self.spec.name, self.c.version, self.c.boot)
            with self._lock:
                self.c.pulls += 1
            self._take(r)
            due = self.c.pulls % self.spec.val_every == 0
        if due:
            self.validate_and_report()

    def _learn_turn(self) -> None:
        assert self.numpy is not None
        records = self.collector.collect(self.numpy, self.steps, whole_episodes=not self.loss_cfg.critic)
        batch = to_batch(records, self.enc, self.loss_cfg.gamma)
        loss_cfg = LossConfig.from_config(self.cfg, self.spec.critic, max(self.c.version, 0))
        grads, st = compute_gradients(self.policy, self.value, batch, loss_cfg)
        row = UpdateRow(-1, st.policy_loss, st.value_loss, st.entropy,
                        float(np.mean([r.reward for r in records])), st.mean_value, len(batch),
                        len(records), sum(r.explored for r in records))
        pull = (self.c.pushed + 1) % self.spec.pull_every == 0
        r = self.link.push(self.spec.name, flatten(grads), row, self.c.version, self.c.boot, pull)
        with self._lock:
            self.c.pushed += 1
            self.c.slots += len(records)
            self.c.bytes_last = getattr(self.link, "bytes_last", 0)
            if r["accepted"] == "yes":
                self.c.accepted += 1
            elif r["accepted"] == "stale":
                self.c.stale += 1
            else:
                self.c.rewound += 1
        self._take(r)

    def _take(self, r: dict[str, Any]) -> None:
        with self._lock:
            if self.c.boot not in (-1, r["boot"]):
                self.c.reconnects += 1
            self.c.boot = r["boot"]
        if r.get("weights") is None:
            return
        _load_vector(self.policy, self.value, r["weights"])
        self.numpy = NumpyPolicy.from_torch(self.policy)
        with self._lock:
            self.c.version = int(r["updates"])

    def validate_and_report(self) -> tuple[float, float]:
        """Greedy JCT of the current weights and DRF's on this member's validation traces; reported."""
        if self.drf is None:
            self.drf = rl.heuristic_jct(self.cfg, "drf", self.spec.val_traces)
        version = self.c.version
        jct = rl.validate(self.cfg, self.policy, self.spec.val_traces)
        self.link.report(self.spec.name, version, jct, self.drf)
        with self._lock:
            self.c.validations += 1
        return jct, self.drf


MemberAgent = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)(MemberAgentImpl)
"""A member's Ray actor: named ``fed-NAME-member-MEMBER`` in ``dl2ray``, detached; no CPU reserved
(members share the machine's cores; a reservation would cap how many fit on a small head)."""


def member_specs(fed, learning_seed: int) -> list[MemberSpec]:
    """Every member's :class:`MemberSpec`: disjoint training seeds (in file order), validation seeds."""
    specs, offset = [], 0
    lrn = fed.learner.learning
    for i, m in enumerate(fed.members):
        specs.append(MemberSpec(
            m.name, i, m.mode, seedsets.training(m.traces, offset), seedsets.validation(m.val_traces),
            m.val_every, m.pull_interval_s, learning_seed, m.steps_per_update or lrn.steps_per_update,
            lrn.critic, lrn.exploration, lrn.pull_every, lrn.threads))
        offset += m.traces
    return specs


def a3c_options(fed) -> A3COptions:
    lrn = fed.learner.learning
    n = len(fed.members)
    return A3COptions(agents=n, traces=max(n, sum(m.traces for m in fed.members)), val_every=None,
                      checkpoint_every=fed.learner.checkpoint_every, critic=lrn.critic,
                      exploration=lrn.exploration, steps_per_update=lrn.steps_per_update,
                      max_grad_norm=lrn.max_grad_norm, threads=lrn.threads)
