"""``dl2ray federation up|status|down``: the federation's composition root.

Only here are the federation file, Ray clusters, the HTTP endpoint and the
output folder wired together. ``up`` is idempotent: the learner, the endpoint
and each member are named, detached actors in namespace ``dl2ray``
(``fed-NAME-learner``, ``fed-NAME-gateway``, ``fed-NAME-member-MEMBER``) created
with ``get_if_exists``; a second ``up`` starts only what is missing (a member
that disappeared rejoins with fresh weights). When the file names no Ray
address, ``up`` starts a head (``ray start --head --block``, pid in
``OUT/state.json``) that ``down`` stops by that pid after the final checkpoint.

Members in other Ray clusters (``ray_address`` set, or a ``ray`` member whose
``backend.address`` is not the learner's) are started by a short child process
(``python -m clusters.federation.deploy``) connected to that cluster: one driver can be
connected to one Ray cluster only.

Live members (:mod:`clusters.federation.live`): a ``ray`` member is its cluster's live
agent (named by its live config's ``agent_name``), a ``k8s`` member a
``fed-NAME-member-MEMBER`` actor running the Kubernetes agent loop. Before
anything starts, ``up`` checks that every ``ray`` member's address answers and
that every ``k8s`` member's context is in its kubeconfig (UserError naming the
field, exit 2). ``down`` stops their agents; their jobs keep running and are
adopted by the next agent.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from clusters import runtime
from clusters.federation.config import FederationFile, learner_config, load_federation
from clusters.federation.kinds import KINDS, kind_of
from clusters.runtime import NAMESPACE, ray_env
from dl2ray.errors import UserError


def read_token(fed: FederationFile, create: bool = False) -> str:
    """The shared token (first line of ``learner.http.token_file``); a new random one when ``create``."""
    path = fed.resolve(fed.learner.http.token_file)
    if path.exists():
        token = path.read_text(encoding="utf-8").strip()
        if len(token) < 16:
            raise UserError(f"{path}: learner.http.token_file: token shorter than 16 characters")
        return token
    if not create:
        raise UserError(f"{path}: learner.http.token_file: no token file (federation up creates it)")
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def read_state(fed: FederationFile) -> dict[str, Any]:
    try:
        return json.loads(fed.state_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _write_state(fed: FederationFile, state: dict[str, Any]) -> None:
    fed.out.mkdir(parents=True, exist_ok=True)
    tmp = fed.state_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2), encoding="utf-8")
    os.replace(tmp, fed.state_file)


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def learner_address(fed: FederationFile) -> str | None:
    state = read_state(fed)
    if fed.learner.ray.address:
        return fed.learner.ray.address
    return state.get("address") if _alive(state.get("head_pid")) else None


def connect(address: str) -> Any:
    """A driver on the Ray cluster at ``address`` in namespace ``dl2ray`` (this process's own when it is
    already connected)."""
    return runtime.connect(address, NAMESPACE)


def head_token(fed: FederationFile) -> Path:
    """The Ray token file of the head ``up`` starts (token authentication on: :mod:`clusters.ray.auth`)."""
    return fed.out / "ray_auth_token"


def connect_learner(fed: FederationFile, address: str) -> Any:
    """:func:`connect` to the learner's Ray, presenting its head's token when ``up`` started it with one."""
    auth = read_state(fed).get("auth") or {}
    if auth.get("mode") == "token":
        from clusters.ray.auth import use_token

        use_token(Path(auth["token_path"]))
    return connect(address)


def names(fed: FederationFile) -> dict[str, str]:
    """Actor names in namespace ``dl2ray``: a ``ray`` member's is its live agent's (``live.agent_name``)."""
    p = fed.actor_prefix
    out = {"learner": f"{p}-learner", "gateway": f"{p}-gateway"}
    for i, m in enumerate(fed.members):
        out[f"member:{m.name}"] = kind_of(fed, i).actor_name(fed, i)
    return out


def preflight(fed: FederationFile) -> None:
    """Before anything starts: every member's own checks (:mod:`clusters.federation.kinds`: a ``ray``
    member's Ray head answers, a ``k8s`` member's kubeconfig holds its context). UserError naming the
    field (exit 2)."""
    for i in range(len(fed.members)):
        kind_of(fed, i).preflight(fed, i)


def ensure_learner(fed: FederationFile) -> tuple[Any, Any | None, str | None]:
    """Learner and (if enabled) gateway actors of the connected Ray; ``(learner, gateway, url)``."""
    import ray

    from clusters.a3c.weights import with_hidden_of
    from clusters.federation.http import gateway_actor
    from clusters.federation.learner import FederatedPolicy, a3c_options

    n = names(fed)
    init = fed.resolve(fed.learner.init) if fed.learner.init else None
    cfg = with_hidden_of(learner_config(fed), init)
    fed.out.mkdir(parents=True, exist_ok=True)
    members = [{"name": m.name, "mode": m.mode, "weight": m.weight, "staleness": m.staleness}
               for m in fed.members]
    learner = FederatedPolicy.options(name=n["learner"], namespace=NAMESPACE, lifetime="detached",
                                      get_if_exists=True).remote(
        cfg, str(init) if init else None, fed.learner.seed, str(fed.checkpoint), a3c_options(fed), members,
        str(fed.out / "tb"))
    ray.get(learner.version.remote())
    if not fed.learner.http.enabled:
        return learner, None, None
    h = fed.learner.http
    gw = gateway_actor().options(name=n["gateway"], namespace=NAMESPACE, lifetime="detached",
                                 get_if_exists=True).remote(n["learner"], read_token(fed, create=True),
                                                            h.host, h.port)
    try:
        url = ray.get(gw.url.remote())
    except ray.exceptions.RayActorError as exc:
        ray.kill(gw, no_restart=True)
        raise UserError(f"learner.http.port: cannot serve on {h.host}:{h.port}: {exc}") from None
    return learner, gw, url


def start_local_member(fed: FederationFile, index: int, link: Any) -> Any:
    """Member ``index``'s agent in the connected Ray (created unless it runs): a simulated member's
    :class:`~clusters.federation.learner.MemberAgentImpl`, a ``ray`` member's live agent, a ``k8s`` member's
    Kubernetes agent actor (:mod:`clusters.federation.kinds`). Raises UserError naming the member when its
    agent cannot start."""
    return kind_of(fed, index).start(fed, index, link)


def _remote(fed_path: Path, action: str, members: list[str], where: str, url: str = "") -> None:
    """One child process connected to the Ray cluster at ``where`` starts or stops ``members`` there."""
    cmd = [sys.executable, "-m", "clusters.federation.deploy", action, str(fed_path), ",".join(members), url]
    from clusters.ray.auth import MODE_VAR, PATH_VAR

    env = dict(os.environ)
    if env.get(PATH_VAR) == str(head_token(load_federation(fed_path))):  # the learner's token is not theirs
        env.pop(PATH_VAR)
        env.pop(MODE_VAR, None)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180 + 60 * len(members), env=env)
    if proc.returncode != 0:
        last = ((proc.stderr or proc.stdout).strip().splitlines() or ["no output"])[-1]
        raise UserError(f"members {', '.join(members)}: {action} in the Ray cluster at {where} failed: "
                        f"{last}")


def _by_cluster(fed: FederationFile) -> dict[str, list[str]]:
    """Members in other Ray clusters, grouped by cluster (``host:port`` → member names, in file order)."""
    out: dict[str, list[str]] = {}
    for m in fed.members:
        where = fed.where(m)
        if where is not None:
            out.setdefault(where, []).append(m.name)
    return out


def up(path: Path, wait_s: float = 180.0) -> dict[str, Any]:
    """Start what is missing; return once every member has contacted the learner since this call."""
    ray_env()
    from clusters.federation.links import ActorLink
    from clusters.ray.head import start_head

    fed = load_federation(path)
    preflight(fed)
    state = read_state(fed)
    address = learner_address(fed)
    if address is None:  # a head of its own, with Ray's token authentication on
        from clusters.ray.auth import create_token

        token = create_token(head_token(fed))
        head = start_head(fed.learner.ray.num_cpus, 0, fed.out / "ray-head.log", token)
        address = head["address"]
        state = {"address": address, "head_pid": head["pid"],
                 "auth": {"mode": "token", "token_path": str(token)}}
        _write_state(fed, state)
    ray = connect_learner(fed, address)
    t0 = time.time()
    learner, _, url = ensure_learner(fed)
    state.update({"address": address, "url": url, "learner": names(fed)["learner"]})
    _write_state(fed, state)
    for i, m in enumerate(fed.members):
        if fed.where(m) is None:
            start_local_member(fed, i, ActorLink(names(fed)["learner"]))
    for where, members in _by_cluster(fed).items():
        _remote(path, "start-member", members, where, url or "")
    deadline = time.monotonic() + wait_s
    while True:
        st = ray.get(learner.status.remote())
        waiting = [m["name"] for m in st["members"] if m["last_contact_s"] is None
                   or m["last_contact_s"] > time.time() - t0 + 1.0]
        if not waiting:
            return {"address": address, "url": url, "updates": st["updates"], "boot": st["boot"],
                    "members": [m.name for m in fed.members]}
        if time.monotonic() > deadline:
            raise UserError(f"members {waiting} did not contact the learner within {wait_s:.0f} s; "
                            f"see `dl2ray federation status {path}`")
        time.sleep(0.5)


def status(path: Path) -> dict[str, Any]:
    """The learner's view of every member (the ``status --json`` document)."""
    ray_env()
    fed = load_federation(path)
    address = learner_address(fed)
    if address is None:
        raise UserError(f"{path}: federation {fed.name!r} is not running (no Ray head recorded in "
                        f"{fed.state_file}); start it with `dl2ray federation up {path}`")
    ray = connect_learner(fed, address)

    try:
        learner = ray.get_actor(names(fed)["learner"], namespace=NAMESPACE)
    except ValueError:
        raise UserError(f"federation {fed.name!r}: no learner in the Ray cluster at {address}") from None
    st = ray.get(learner.status.remote(), timeout=60)
    for m in st["members"]:
        member = fed.member(m["name"])
        m["jct_over_drf"] = (m["val_jct"] / m["drf_jct"]) if m["val_jct"] and m["drf_jct"] else None
        m["where"] = fed.where(member) or "learner's Ray (actor)"
        m["backend"] = member.backend.kind
        m["validation"] = KINDS[member.backend.kind].validation
    return {"federation": fed.name, "address": address, "url": read_state(fed).get("url"),
            "checkpoint": str(fed.checkpoint), **st}


def down(path: Path) -> dict[str, Any]:
    """Stop members, write the final checkpoint, stop the learner and endpoint (and the head up started)."""
    ray_env()
    from clusters.ray.head import stop_head

    fed = load_federation(path)
    state = read_state(fed)
    address = learner_address(fed)
    if address is None:
        raise UserError(f"{path}: federation {fed.name!r} is not running")
    ray_env()
    import ray as ray_module

    owned = not ray_module.is_initialized()  # a caller's own driver (tests) stays connected
    ray = connect_learner(fed, address)
    n = names(fed)
    for where, members in _by_cluster(fed).items():
        try:
            _remote(path, "stop-member", members, where)
        except UserError as exc:  # its cluster is gone: nothing of it is left to stop
            print(f"warning: {exc}", file=sys.stderr)
    for m in fed.members:
        if fed.where(m) is None:
            stop_member(fed, m.name)
    updates = None
    try:
        learner = ray.get_actor(n["learner"], namespace=NAMESPACE)
        updates = ray.get(learner.final_checkpoint.remote(), timeout=300)
        ray.kill(learner, no_restart=True)
    except ValueError:
        pass
    with contextlib.suppress(ValueError):
        ray.kill(ray.get_actor(n["gateway"], namespace=NAMESPACE), no_restart=True)
    if owned:
        ray.shutdown()
    if not fed.learner.ray.address and state.get("head_pid"):
        stop_head(int(state["head_pid"]))
    _write_state(fed, {**state, "head_pid": None, "stopped": time.time()})
    return {"federation": fed.name, "updates": updates, "checkpoint": str(fed.checkpoint)}


def _member_main(action: str, path: str, members: str, url: str) -> None:
    """Child process: start or stop members (comma-separated names) in their own Ray cluster, one driver."""
    ray_env()
    from clusters.federation.http import HttpLink, member_token

    fed = load_federation(path)
    wanted = members.split(",")
    where = {fed.where(fed.member(name)) for name in wanted}
    assert len(where) == 1 and None not in where, where
    ray = connect(where.pop())  # type: ignore[arg-type]
    for index, m in enumerate(fed.members):
        if m.name not in wanted:
            continue
        if action == "start-member":
            # the member's own token: it can push, pull and report as itself only
            agent = start_local_member(fed, index, HttpLink(url, member_token(read_token(fed), m.name),
                                                            member=m.name))
            ray.get(agent.status.remote())
        else:
            stop_member(fed, m.name)


def stop_member(fed: FederationFile, member: str) -> None:
    """Stop and end a member's agent in the connected Ray cluster (none running: nothing to do). A ``ray``
    member's live agent is left alone when it is not this federation's (the cluster's own agent)."""
    import ray


    try:
        agent = ray.get_actor(names(fed)[f"member:{member}"], namespace=NAMESPACE)
    except ValueError:
        return
    if not KINDS[fed.member(member).backend.kind].owned(fed, agent):
        return
    ray.get(agent.stop.remote(), timeout=180)
    ray.kill(agent, no_restart=True)


if __name__ == "__main__":
    try:
        _member_main(*sys.argv[1:5])
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
