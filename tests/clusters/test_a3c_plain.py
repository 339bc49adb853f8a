"""``bench a3c --plain``: the agents' own work in plain processes, without Ray (what the machine gives)."""

from __future__ import annotations

import pytest

from clusters.a3c.global_policy import A3COptions
from clusters.a3c.plain import PlainJob, plain_row


def _jobs(cfg, n: int, init: str | None = None, same: bool = False) -> list[PlainJob]:
    opts = A3COptions(agents=n, traces=2 if same else 2 * n, val_every=None, same_traces=same)
    return [PlainJob(cfg, init, 0, i, opts.agent_traces(i), opts.local_settings(), 1, 0.05) for i in range(n)]


def test_plain_processes_compute_the_agents_pushes_together(tiny_shape) -> None:
    """Two spawned processes, each agent i's learner: both measured (at least one push each), summed."""
    row = plain_row(_jobs(tiny_shape, 2, same=True), timeout_s=300)
    assert row["mode"] == "plain" and row["agents"] == 2
    assert row["updates"] >= 2 and row["slots"] > 0 and row["steps"] > 0
    assert row["slots_per_s"] == pytest.approx(row["slots"] / row["seconds"], rel=0.01)


def test_a_failing_plain_process_is_named_not_waited_for(tiny_shape, tmp_path) -> None:
    missing = str(tmp_path / "no-such.pt")
    with pytest.raises(RuntimeError, match=r"plain process 0: .*no-such\.pt"):
        plain_row(_jobs(tiny_shape, 1, init=missing), timeout_s=300)
