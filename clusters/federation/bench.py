"""``dl2ray bench federation``: learner throughput, bytes per update over HTTP, rejoin after a restart.

One local Ray instance (2 CPUs, loopback) started here and stopped on exit.
For each member count N: a :class:`~clusters.federation.learner.FederatedPolicy`
(checkpoint every 20 updates in a temporary folder) and N simulated members of
``--config`` (actor links, no validation);
once every member has had a gradient accepted (``start_s``), ``warmup``
unmeasured seconds, then the learner's accepted updates over ``seconds``. Then, with 2 members:

- **HTTP**: the federation endpoint (:class:`~clusters.federation.http.FedGatewayImpl`)
  beside the learner, one member in this process over :class:`~clusters.federation.http.HttpLink`
  for ``http_pushes`` pushes (each with a weight pull): request plus reply
  body bytes per update, and the seconds per push;
- **rejoin**: kill the learner (Ray restarts it from its checkpoint); seconds
  until it answers again and until every member has had a gradient accepted
  by the restarted learner.

Last (alone with ``--learner-only``), the learner's ceiling: one learner fed
ready-made gradients back to back (``learner_pushes`` of them, each answered
with the weights, a checkpoint every 20), in this process (the Adam step and
the reply) and through its actor from the driver (plus Ray's transfer of the
gradient and the weights): the updates/s no number of members can exceed.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

from dl2ray.config import load_config


def _members(cfg, n: int, seed: int):
    from clusters.federation.members import MemberSpec
    from dl2ray import seeds

    return [MemberSpec(f"m{i}", i, "learn", seeds.training(4, 4 * i), seeds.validation(1), 10**9, 1.0, seed)
            for i in range(n)]


def _learner(ray, cfg, name: str, n: int, out: Path, seed: int):
    from clusters.a3c.global_policy import A3COptions
    from clusters.federation.learner import FederatedPolicy
    from clusters.runtime import NAMESPACE

    members = [{"name": f"m{i}", "mode": "learn", "weight": 1.0, "staleness": 1000} for i in range(n)]
    opts = A3COptions(agents=max(n, 1), traces=max(n, 1), val_every=None, checkpoint_every=20)
    gp = FederatedPolicy.options(name=name, namespace=NAMESPACE).remote(
        cfg, None, seed, str(out / f"{name}.pt"), opts, members, None)
    ray.get(gp.version.remote())
    return gp


def _accepted(ray, gp) -> dict[str, int]:
    return {m["name"]: m["updates"] for m in ray.get(gp.status.remote())["members"]}


def _wait_pushing(ray, gp, names: list[str], timeout_s: float = 600.0) -> float:
    """Seconds until each named member has had a gradient accepted (actor start-up, first collection)."""
    t0 = time.perf_counter()
    while not all(_accepted(ray, gp)[n] > 0 for n in names):
        if time.perf_counter() - t0 > timeout_s:
            raise RuntimeError(f"members {names} did not push within {timeout_s:.0f} s")
        time.sleep(0.2)
    return time.perf_counter() - t0


def throughput(ray, cfg, n: int, seconds: float, warmup: float, out: Path, seed: int) -> dict[str, Any]:
    from clusters.federation.links import ActorLink
    from clusters.federation.members import MemberAgent
    from clusters.runtime import NAMESPACE

    name = f"fed-bench-{n}"
    gp = _learner(ray, cfg, name, n, out, seed)
    agents = [MemberAgent.options(namespace=NAMESPACE).remote(cfg, spec, ActorLink(name))
              for spec in _members(cfg, n, seed)]
    try:
        ready = _wait_pushing(ray, gp, [f"m{i}" for i in range(n)])
        time.sleep(warmup)
        u0, t0 = ray.get(gp.version.remote())["updates"], time.perf_counter()
        time.sleep(seconds)
        u1, t1 = ray.get(gp.version.remote())["updates"], time.perf_counter()
        return {"members": n, "start_s": round(ready, 1), "updates": u1 - u0, "seconds": round(t1 - t0, 3),
                "updates_per_s": round((u1 - u0) / (t1 - t0), 3)}
    finally:
        for a in agents:
            ray.kill(a, no_restart=True)
        ray.kill(gp, no_restart=True)


def http_and_rejoin(ray, cfg, out: Path, seed: int, http_pushes: int) -> dict[str, Any]:
    from clusters.a3c.weights import num_params
    from clusters.federation.http import HttpLink, gateway_actor
    from clusters.federation.links import ActorLink
    from clusters.federation.members import MemberAgent, MemberAgentImpl
    from clusters.runtime import NAMESPACE

    name = "fed-bench-http"
    gp = _learner(ray, cfg, name, 3, out, seed)
    token = "bench-token-0123456789abcdef"
    gw = gateway_actor().options(namespace=NAMESPACE).remote(name, token, "127.0.0.1", 0)
    url = ray.get(gw.url.remote())
    specs = _members(cfg, 3, seed)
    agents = [MemberAgent.options(namespace=NAMESPACE).remote(cfg, spec, ActorLink(name))
              for spec in specs[:2]]
    try:
        link = HttpLink(url, token)
        local = MemberAgentImpl(cfg, specs[2], link, start=False)
        local.step()  # join + first push
        sizes, t0 = [], time.perf_counter()
        for _ in range(http_pushes):
            local.step()
            sizes.append(link.bytes_last)
        per_push = (time.perf_counter() - t0) / http_pushes
        weights = num_params(local.policy, local.value) if local.joined else 0
        # rejoin: both actor members pushing, kill the learner, time the way back
        _wait_pushing(ray, gp, ["m0", "m1"])
        before = _accepted(ray, gp)
        boot = ray.get(gp.version.remote())["boot"]
        t_kill = time.perf_counter()
        ray.kill(gp, no_restart=False)
        while True:
            try:
                if ray.get(gp.version.remote(), timeout=5)["boot"] == boot + 1:
                    break
            except Exception:  # still restarting
                pass
        t_back = time.perf_counter() - t_kill
        after_restart = _accepted(ray, gp)  # the checkpoint's counts: the lost updates are gone
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            now = _accepted(ray, gp)
            if all(now[f"m{i}"] > after_restart[f"m{i}"] for i in range(2)):
                break
            time.sleep(0.05)
        t_all = time.perf_counter() - t_kill
        return {"http": {"bytes_per_update": int(sum(sizes) / len(sizes)), "parameters": weights,
                         "float32_bytes_two_vectors": 8 * weights, "seconds_per_push": round(per_push, 4),
                         "pushes": http_pushes},
                "rejoin": {"learner_back_s": round(t_back, 3), "all_members_accepted_s": round(t_all, 3),
                           "accepted_before_kill": before, "accepted_after_restart": after_restart}}
    finally:
        for a in agents:
            ray.kill(a, no_restart=True)
        ray.kill(gw, no_restart=True)
        ray.kill(gp, no_restart=True)


def learner_ceiling(ray, cfg, out: Path, seed: int, pushes: int) -> dict[str, Any]:
    """Seconds per update of a learner fed ready gradients back to back, in process and as an actor."""
    import numpy as np

    from clusters.a3c.global_policy import A3COptions
    from clusters.a3c.weights import params_vector
    from clusters.federation.learner import FederatedPolicyImpl
    from dl2ray.learn.records import UpdateRow

    row = UpdateRow(-1, 0.0, 0.0, 0.0, 0.0, 0.0, 256, 13, 0)
    members = [{"name": "m0", "mode": "learn", "weight": 1.0, "staleness": 10**9}]
    opts = A3COptions(agents=1, traces=1, val_every=None, checkpoint_every=20)
    local = FederatedPolicyImpl(cfg, None, seed, str(out / "ceiling-local.pt"), opts, members)
    size = params_vector(local.policy, local.value).size
    grad = np.random.default_rng(seed).normal(0.0, 1e-3, size).astype(np.float32)

    def timed(push) -> float:
        for _ in range(5):  # warm-up: first Adam steps allocate the moment buffers
            push()
        t0 = time.perf_counter()
        for _ in range(pushes):
            push()
        return (time.perf_counter() - t0) / pushes

    in_process = timed(lambda: local.push_member("m0", grad, row, local.opt.updates, local.boot))
    gp = _learner(ray, cfg, "fed-bench-ceiling", 1, out, seed)
    state = {"version": 0, "boot": ray.get(gp.version.remote())["boot"]}

    def actor_push() -> None:
        r = ray.get(gp.push_member.remote("m0", grad, row, state["version"], state["boot"], True))
        state["version"] = r["updates"]

    try:
        actor = timed(actor_push)
    finally:
        ray.kill(gp, no_restart=True)
    return {"parameters": int(size), "pushes": pushes, "in_process_s": round(in_process, 5),
            "actor_call_s": round(actor, 5), "updates_per_s_bound": round(1.0 / actor, 1)}


def run_bench(config: Path, counts: list[int], seconds: float, warmup: float = 5.0, seed: int = 0,
              http_pushes: int = 20, learner_pushes: int = 100, learner_only: bool = False) -> dict[str, Any]:
    from clusters.runtime import start_ray

    cfg = load_config(config)
    started = start_ray(2)
    import ray

    rows: list[dict[str, Any]] = []
    extra: dict[str, Any] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="dl2ray-fedbench-") as tmp:
            if not learner_only:
                rows = [throughput(ray, cfg, n, seconds, warmup, Path(tmp), seed) for n in counts]
                extra = http_and_rejoin(ray, cfg, Path(tmp), seed, http_pushes)
            extra["learner"] = learner_ceiling(ray, cfg, Path(tmp), seed, learner_pushes)
    finally:
        if started:
            ray.shutdown()
    return {"bench": "federation", "config": str(config), "cpus": os.cpu_count(), "ray_cpus": 2,
            "load_avg": round(os.getloadavg()[0], 2), "seconds": seconds, "warmup_s": warmup,
            "throughput": rows, **extra}
