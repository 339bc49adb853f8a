"""``dl2ray submit --address http://...``: which addresses go through Ray's Jobs API, and how following a
Ray job prints its log once and ends with the entrypoint's exit code (a stand-in client; the real Jobs
API is in test_live_auth.py, slow)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from clusters.cli.jobs_api import follow_job, is_jobs_api


def test_only_a_dashboard_url_is_the_jobs_api() -> None:
    assert is_jobs_api("http://127.0.0.1:8265") and is_jobs_api("https://head:443")
    assert not is_jobs_api("127.0.0.1:6379") and not is_jobs_api(None) and not is_jobs_api("")


@dataclass
class Info:
    driver_exit_code: int | None
    message: str = ""


class Client:
    """The three Jobs API calls follow_job makes, replaying a job's statuses and growing log."""

    def __init__(self, statuses: list[str], logs: list[str], info: Info) -> None:
        self.statuses, self.logs, self.info, self.k = statuses, logs, info, -1

    def get_job_status(self, job: str) -> str:
        self.k += 1
        return f"JobStatus.{self.statuses[self.k]}"

    def get_job_logs(self, job: str) -> str:
        return self.logs[self.k]

    def get_job_info(self, job: str) -> Info:
        return self.info


@pytest.mark.parametrize(("final", "info", "code"), [
    ("SUCCEEDED", Info(0), 0),
    ("FAILED", Info(2), 2),  # the entrypoint refused the job: its exit code
    ("FAILED", Info(1), 1),
    ("STOPPED", Info(None, "stopped by the user"), 1),  # no driver exit code: 1
    ("SUCCEEDED", Info(None), 0),
])
def test_following_prints_the_log_once_and_returns_the_entrypoints_exit_code(capsys, final, info,
                                                                              code) -> None:
    client = Client(["PENDING", "RUNNING", final], ["", "a\n", "a\nb\n"], info)
    assert follow_job(client, "raysubmit_x", poll_s=0.0) == code
    out = capsys.readouterr().out
    assert out.startswith("a\nb\n") and out.count("a\n") == 1
    assert ("stopped by the user" in out) == (info.message != "")
