"""``dl2ray federation experiment FILE``: federated vs each member alone (same total updates) vs DRF, Optimus.

On one local Ray instance (2 CPUs), from the learner's ``init`` (or random
networks from its seed):

1. **federated**: one learner and every ``learn`` member of the file, until the
   learner has applied ``updates`` gradients (members are stopped then; the
   few pushes in flight at that moment are applied too, and the exact count is
   reported);
2. **alone**: for each member, a learner fed by that member only, for the same
   number of updates;
3. every policy (greedy) and DRF and Optimus on each member's held-out test
   traces (:func:`dl2ray.seeds.test`, ``test_traces`` of them, generated
   by that member's own config): average JCT in slots, unfinished jobs counted
   until the run stopped (as validation does), and the init policy's too.

Members validate nothing during training (``val_every`` is set past the end):
the comparison is on test traces only.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from dl2ray.errors import UserError


def _train(ray, fed, indices: list[int], updates: int, tag: str, out: Path) -> dict[str, Any]:
    from clusters.a3c.weights import load_vector, with_hidden_of
    from clusters.federation.config import learner_config, member_config
    from clusters.federation.learner import FederatedPolicy
    from clusters.federation.learner import a3c_options as options
    from clusters.federation.links import ActorLink
    from clusters.federation.members import MemberAgent, member_specs
    from clusters.runtime import NAMESPACE
    from dl2ray.policy.encoding import Encoding
    from dl2ray.policy.network import build_networks

    init = str(fed.resolve(fed.learner.init)) if fed.learner.init else None
    base = with_hidden_of(learner_config(fed), Path(init) if init else None)
    name = f"fed-exp-{tag}"
    members = [{"name": fed.members[i].name, "mode": "learn", "weight": fed.members[i].weight,
                "staleness": fed.members[i].staleness} for i in indices]
    gp = FederatedPolicy.options(name=name, namespace=NAMESPACE).remote(
        base, init, fed.learner.seed, str(out / f"{tag}.pt"), options(fed), members, str(out / f"tb-{tag}"))
    specs = member_specs(fed, fed.learner.seed)
    agents = []
    t0 = time.perf_counter()
    try:
        for i in indices:
            cfg = with_hidden_of(member_config(fed, i), Path(init) if init else None)
            spec = dataclasses.replace(specs[i], val_every=10**9)
            agents.append(MemberAgent.options(namespace=NAMESPACE).remote(cfg, spec, ActorLink(name)))
        while ray.get(gp.version.remote())["updates"] < updates:
            time.sleep(0.2)
        for a in agents:
            ray.kill(a, no_restart=True)
        st = ray.get(gp.status.remote())
        n, weights = ray.get(gp.get_weights.remote())
        ray.get(gp.final_checkpoint.remote())
    finally:
        for a in agents:
            ray.kill(a, no_restart=True)
        ray.kill(gp, no_restart=True)
    policy, value = build_networks(Encoding.from_config(base), base.policy.hidden, 0)
    load_vector(policy, value, weights)
    return {"updates": n, "seconds": round(time.perf_counter() - t0, 1), "policy": policy,
            "per_member": {m["name"]: m["updates"] for m in st["members"]},
            "dropped": {m["name"]: m["dropped"] for m in st["members"]}}


def _jct_policy(cfg, policy, seeds: list[int]) -> list[float]:
    from dl2ray.experiments import build_simulator
    from dl2ray.metrics import censored_avg_jct
    from dl2ray.policy.network import NumpyPolicy
    from dl2ray.schedulers.dl2 import DL2Scheduler
    from dl2ray.sim import run_episode

    sim = build_simulator(cfg)
    sched = DL2Scheduler.from_policy(NumpyPolicy.from_torch(policy))
    return [float(censored_avg_jct(run_episode(sim, sched, s))) for s in seeds]


def _jct_heuristic(cfg, name: str, seeds: list[int]) -> list[float]:
    from dl2ray.experiments import build_simulator
    from dl2ray.metrics import censored_avg_jct
    from dl2ray.schedulers.base import make_scheduler
    from dl2ray.sim import run_episode

    sim = build_simulator(cfg)
    return [float(censored_avg_jct(run_episode(sim, make_scheduler(name, cfg), s))) for s in seeds]


def run_experiment(path: Path, updates: int, test_traces: int, members: list[str] | None = None,
                   progress=print) -> dict[str, Any]:
    from clusters.a3c.weights import with_hidden_of
    from clusters.federation.config import load_federation, member_config
    from clusters.runtime import start_ray
    from dl2ray import seeds
    from dl2ray.policy.network import load_checkpoint

    fed = load_federation(path)
    known = [m.name for m in fed.members]
    for name in members or []:
        if name not in known:
            raise UserError(f"--member: {name!r}: no such member of {path}; members: {', '.join(known)}")
    idx = [i for i, m in enumerate(fed.members)
           if m.mode == "learn" and m.backend.kind == "sim" and (members is None or m.name in members)]
    if not idx:
        raise UserError(f"--member: none of the chosen members of {path} is a simulated `learn` member")
    started = start_ray(2)
    import ray

    test = seeds.test(test_traces)
    init = fed.resolve(fed.learner.init) if fed.learner.init else None
    try:
        with tempfile.TemporaryDirectory(prefix="dl2ray-fedexp-") as tmp:
            progress(f"federated: {len(idx)} members, {updates} updates")
            runs = {"federated": _train(ray, fed, idx, updates, "federated", Path(tmp))}
            for i in idx:
                name = fed.members[i].name
                progress(f"alone: {name}, {updates} updates ({runs['federated']['seconds']} s federated)")
                runs[name] = _train(ray, fed, [i], updates, f"alone-{name}", Path(tmp))
    finally:
        if started:
            ray.shutdown()
    rows = []
    for i in idx:
        name = fed.members[i].name
        cfg = with_hidden_of(member_config(fed, i), init)
        progress(f"test traces of {name}")
        row: dict[str, Any] = {"member": name, "nodes": cfg.cluster.num_nodes,
                               "federated_updates_from_it": runs["federated"]["per_member"][name]}
        row["drf"] = _jct_heuristic(cfg, "drf", test)
        row["optimus"] = _jct_heuristic(cfg, "optimus", test)
        if init is not None:
            row["init"] = _jct_policy(cfg, load_checkpoint(init).policy, test)
        row["federated"] = _jct_policy(cfg, runs["federated"]["policy"], test)
        row["alone"] = _jct_policy(cfg, runs[name]["policy"], test)
        for k in ("drf", "optimus", "init", "federated", "alone"):
            if k in row:
                row[f"{k}_mean"] = round(float(np.mean(row[k])), 3)
        row["federated_vs_alone"] = round(row["federated_mean"] / row["alone_mean"], 4)
        row["federated_vs_drf"] = round(row["federated_mean"] / row["drf_mean"], 4)
        rows.append(row)
    return {"experiment": "federation", "file": str(path), "updates": updates, "test_seeds": test,
            "init": str(init) if init else None,
            "training": {k: {kk: vv for kk, vv in v.items() if kk != "policy"} for k, v in runs.items()},
            "members": rows}
