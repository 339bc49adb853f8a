"""``dl2ray submit JOB.yaml --address http://HEAD:8265``: the submission Ray users write, done for them.

The same as ``ray job submit --address URL --working-dir DIR -- dl2ray submit JOB.yaml``: the job spec
alone goes to the cluster as the Ray job's working directory (a folder holding only that file, so no
other local file is uploaded), the entrypoint ``dl2ray submit FILE`` runs on the cluster (the head puts
the project's ``dl2ray`` on its ``PATH``, :mod:`clusters.ray.head`) and follows the job there; this
command follows the Ray job's log and ends with the entrypoint's exit code (0: the job finished, 1: it
failed or was cancelled, 2: refused). The token of a cluster with token authentication goes in the
``Authorization`` header (:mod:`clusters.ray.auth`).
"""

from __future__ import annotations

import shlex
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from clusters.ray.auth import auth_headers
from dl2ray.errors import UserError

TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


def is_jobs_api(address: str | None) -> bool:
    """True for the dashboard's URL (``http(s)://host:port``), False for a GCS address (``host:port``)."""
    return address is not None and address.startswith(("http://", "https://"))


def _client(url: str, token: Path | None) -> Any:
    from ray.job_submission import JobSubmissionClient

    try:
        return JobSubmissionClient(url, headers=auth_headers(token))
    except (ConnectionError, RuntimeError) as exc:
        raise UserError(f"--address: no Ray Jobs API at {url}: {exc}") from None


def submit_job(job: Path, url: str, token: Path | None, follow: bool, poll_s: float) -> int:
    """Submit ``job`` (a checked spec file) as a Ray job running ``dl2ray submit``; with ``follow``, print
    its log until it ends and return the entrypoint's exit code (else 0 once submitted)."""
    client = _client(url, token)
    with tempfile.TemporaryDirectory(prefix="dl2ray-submit-") as tmp:
        shutil.copyfile(job, Path(tmp) / job.name)
        entry = f"dl2ray submit {shlex.quote(job.name)} --poll {poll_s:g}"
        try:
            ray_job = client.submit_job(entrypoint=entry, runtime_env={"working_dir": tmp})
        except RuntimeError as exc:  # the Jobs API's refusals (401/403 without the right token, ...)
            raise UserError(f"--address: the Ray Jobs API at {url} refused the job: {exc}") from None
    print(f"submitted Ray job {ray_job} to {url}: {entry}", flush=True)
    if not follow:
        return 0
    return follow_job(client, ray_job, poll_s)


def follow_job(client: Any, ray_job: str, poll_s: float) -> int:
    """Print the Ray job's log as it grows until the job ends; the entrypoint's exit code (1 when the
    Ray job failed without one: it never started, or was stopped)."""
    shown = 0
    while True:
        status = str(client.get_job_status(ray_job)).split(".")[-1]
        text = client.get_job_logs(ray_job)
        if len(text) > shown:
            print(text[shown:], end="", flush=True)
            shown = len(text)
        if status in TERMINAL:
            info = client.get_job_info(ray_job)
            code = info.driver_exit_code
            if status != "SUCCEEDED" and info.message and code is None:
                print(f"Ray job {ray_job}: {status}: {info.message}", flush=True)
            return int(code) if code is not None else (0 if status == "SUCCEEDED" else 1)
        time.sleep(poll_s)
