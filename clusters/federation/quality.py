"""Fig. 18's federation row (``experiment paper``, issue 37): a federation of N simulated members of one
cluster config learning together, each member's validations against its own experience.

:func:`federated_rl` starts a :class:`~clusters.federation.learner.FederatedPolicy` and N ``learn``
members (:class:`~clusters.federation.members.MemberAgent`) of the same experiment config, member ``i``
with its own part of the training traces (``options.traces`` each, disjoint) and the same validation
traces (:func:`dl2ray.seeds.validation`, ``options.val_traces``). Every member learns as the shape
policy's single learner does with ``options.algo`` (``pg``: online, on-policy episodes of its own
cluster through the live agent's interface) and validates the global weights it holds every
``options.val_every`` of its own pushes. The run ends when the learner has applied ``N × pushes``
updates (each member about ``pushes`` of its own, as the single member of an N = 1 run). ``weight``
multiplies every member's pushes before the learner applies them: for the shape policy the outer step
``θ ← θ − weight · g`` (1: each push applied as the member computed it, the sum of the members' steps).

Returned per member, oldest first: ``(own pushes, own slots of experience, seconds since the member
started, validation avg JCT)`` (:meth:`~clusters.federation.members.MemberAgentImpl.validations`).
Needs a running Ray instance (:func:`clusters.runtime.start_ray`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from clusters.a3c.global_policy import A3COptions
from clusters.a3c.weights import with_hidden_of
from clusters.federation.learner import FederatedPolicy
from clusters.federation.links import ActorLink
from clusters.federation.members import MemberAgent, MemberSpec
from clusters.runtime import NAMESPACE
from dl2ray import seeds as seedsets
from dl2ray.config import ExperimentConfig
from dl2ray.errors import UserError
from dl2ray.learn.records import RLOptions

Validations = list[tuple[int, int, float, float]]
"""One member's ``(own pushes, own slots of experience, seconds since it started, validation avg JCT)``."""


def _specs(members: int, options: RLOptions, seed: int) -> list[MemberSpec]:
    """``members`` learn members ``m0 …``: disjoint training traces, the same validation traces."""
    if options.algo not in ("pg", "counterfactual"):
        raise UserError(f"--algo {options.algo}: a federation member learns the shape policy by pg or "
                        "counterfactual credit")
    return [MemberSpec(f"m{i}", i, "learn", seedsets.training(options.traces, i * options.traces),
                       seedsets.validation(options.val_traces), options.val_every, 1.0, seed,
                       options.steps_per_update, options.critic, options.exploration, twin=options.twin,
                       algo=options.algo, credit=options.credit, share_baseline=options.share_baseline)
            for i in range(members)]


def federated_rl(cfg: ExperimentConfig, init: Path, members: int, pushes: int, seed: int, options: RLOptions,
                 out: Path, weight: float = 1.0) -> list[Validations]:
    """The run of the module docstring; the learner's checkpoint and TensorBoard logs under ``out``."""
    import ray

    if members < 1 or pushes < 1:
        raise UserError(f"a federation of {members} members with {pushes} pushes each: both at least 1")
    if not weight > 0:
        raise UserError(f"member weight {weight}: must be above 0 (it multiplies every push)")
    cfg = with_hidden_of(cfg, init)
    specs = _specs(members, options, seed)
    a3c = A3COptions(agents=members, traces=members * options.traces, val_every=None,
                     checkpoint_every=max(members * pushes, 1), critic=options.critic,
                     exploration=options.exploration, max_grad_norm=options.max_grad_norm,
                     algo="pg" if options.algo == "pg" else "counterfactual",
                     share_baseline=options.share_baseline)
    name = f"fed-quality-{out.stem}-{os.getpid()}"
    out.mkdir(parents=True, exist_ok=True)
    learner = FederatedPolicy.options(name=name, namespace=NAMESPACE).remote(
        cfg, str(init), seed, str(out / "global.pt"),
        a3c, [{"name": s.name, "mode": "learn", "weight": weight, "staleness": 8} for s in specs],
        str(out / "tb"))
    agents = []
    try:
        agents = [MemberAgent.options(namespace=NAMESPACE).remote(cfg, s, ActorLink(name)) for s in specs]
        while ray.get(learner.version.remote())["updates"] < members * pushes:
            time.sleep(0.5)
        # every member at once: its step in progress ends (its push and a validation then due), no new one
        ray.get([a.stop.remote() for a in agents])
        return [ray.get(a.validations.remote()) for a in agents]
    finally:
        for a in agents:
            ray.kill(a, no_restart=True)
        ray.kill(learner, no_restart=True)
