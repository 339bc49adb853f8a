"""Ray's token authentication for a cluster that ``dl2ray`` starts: the token file, the head's environment,
and how every client command (this process, a ``ray job submit`` entrypoint) presents the token.

Ray (2.60) checks one shared token when ``RAY_AUTH_MODE=token``: on every gRPC
call to the GCS and raylets, and on every HTTP request to the dashboard and its
Jobs API (``Authorization: Bearer TOKEN``; 401 without it, 403 with a wrong
one). A process finds its token in ``RAY_AUTH_TOKEN``, else in the file named by
``RAY_AUTH_TOKEN_PATH``, else in ``~/.ray/auth_token``. The head's processes
(raylet, workers, job drivers) inherit the head's environment, so a
``ray job submit`` entrypoint finds the token without being told.

``cluster up`` writes a fresh token (256 bits) into a file only the user can
read (mode 0600) next to its ``cluster.json``, which records the file's path;
the client commands read it from there (:func:`use_token`).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

MODE_VAR, TOKEN_VAR, PATH_VAR = "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"


def create_token(path: Path) -> Path:
    """Write a fresh random token (64 hex digits) to ``path``, readable and writable by the user only
    (0600, also when the file existed); returns ``path`` made absolute."""
    path = path.resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)  # a new file, created 0600: no moment where another user could read it
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    os.chmod(path, 0o600)  # the umask cannot widen it, but make the mode explicit
    return path


def read_token(path: Path) -> str:
    """The token in ``path`` (stripped)."""
    return path.read_text().strip()


def token_env(path: Path | None) -> dict[str, str]:
    """The variables a Ray process needs for a cluster whose token is in ``path`` (None: auth disabled)."""
    if path is None:
        return {MODE_VAR: "disabled"}
    return {MODE_VAR: "token", PATH_VAR: str(path)}


def child_env(path: Path | None, base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with :func:`token_env` in place of any other token
    setting (``RAY_AUTH_TOKEN`` would win over the file, so it is dropped)."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if k != TOKEN_VAR}
    env.pop(PATH_VAR, None)
    env.update(token_env(path))
    return env


def export_line(path: Path) -> str:
    """The one shell line a client (``ray job submit``, ``ray status``...) needs for this cluster."""
    return f"export {MODE_VAR}=token {PATH_VAR}={path}"


def auth_headers(path: Path | None) -> dict[str, str]:
    """HTTP headers for the dashboard / Jobs API of a cluster whose token is in ``path`` ({} for None)."""
    return {} if path is None else {"Authorization": f"Bearer {read_token(path)}"}


def env_token_path() -> Path | None:
    """The token file this process's environment names, if it sets token mode and a file (a job
    entrypoint inherits both from the head)."""
    if os.environ.get(MODE_VAR, "").lower() != "token" or not os.environ.get(PATH_VAR):
        return None
    return Path(os.environ[PATH_VAR])


def use_token(path: Path) -> None:
    """Make this process a client of the cluster whose token is in ``path``: set the variables Ray reads,
    and, if Ray's config was read already in this process (an earlier cluster of the same process, as in
    ``bench live-demo``), have Ray read them again. Call it before connecting (no driver connected)."""
    os.environ.update(token_env(path))
    os.environ.pop(TOKEN_VAR, None)
    import sys

    if "ray" not in sys.modules:
        return  # Ray reads the environment when it first needs the mode and the token
    from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore[attr-defined]

    # The same two calls Ray makes itself when it turns token mode on for a process
    # (ray._private.authentication.authentication_token_setup): the mode is cached in
    # RayConfig and the token in the loader.
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()
