"""``dl2ray train rl --agents N`` and ``dl2ray bench a3c``: the clusters plugin through the core CLI."""

from __future__ import annotations

import json

import pytest
import typer
from support import run_cli

from dl2ray.cli.commands import Plugins, load_plugins
from dl2ray.cli.train import app as train_app
from dl2ray.policy.network import load_checkpoint


def test_the_entry_point_registers_the_plugin() -> None:
    plugins = load_plugins(Plugins({"bench": typer.Typer(), "train": train_app, "trace": typer.Typer()}))
    assert "clusters" in plugins.loaded and not plugins.failed
    assert plugins.multi_agent_rl is not None
    assert "a3c" in [c.name for c in plugins.groups["bench"].registered_commands]


def test_a_broken_plugin_is_named_when_needed(capsys, monkeypatch) -> None:
    """Without the plugin's trainer, --agents 2 says why in one line (exit 2); --agents 1 needs no plugin."""
    from dl2ray.cli import app as cli

    plugins = cli._register()
    monkeypatch.setattr(plugins, "multi_agent_rl", None)
    monkeypatch.setattr(plugins, "failed", {"clusters": "ImportError: no ray"})
    code, _, err = run_cli(capsys, "train", "rl", "--agents", "2", "--updates", "1", "--out", "x.pt")
    assert code == 2 and "clusters" in err and "no ray" in err and len(err.strip().splitlines()) == 1


def test_profile_live_comes_from_the_plugin_and_is_named_without_it(capsys, monkeypatch, tmp_path) -> None:
    """``profile --live`` drives real elastic MXNet jobs: the clusters plugin adds it; without it the
    option says why in one line (exit 2), before anything starts."""
    from dl2ray.cli import app as cli

    plugins = cli._register()
    assert plugins.live_profile is not None
    monkeypatch.setattr(plugins, "live_profile", None)
    monkeypatch.setattr(plugins, "failed", {"clusters": "ImportError: no ray"})
    code, _, err = run_cli(capsys, "profile", "--live", "job.yaml", "--out", str(tmp_path / "p.json"))
    assert code == 2 and "clusters plugin" in err and "no ray" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize(("argv", "message"), [
    (["train", "rl", "--agents", "0"], "--agents: 0"),
    (["train", "rl", "--agents", "-2"], "--agents: -2"),
    (["train", "rl", "--agents", "3", "--traces", "2"], "--traces 2"),
    (["train", "rl", "--agents", "2", "--replay"], "no replay"),
    (["train", "rl", "--agents", "2", "--no-replay", "--prioritized"], "no replay"),
    (["bench", "a3c", "--agents", "1", "0"], "--agents: 0"),
    (["bench", "a3c", "--init", "/nonexistent/x.pt"], "no such policy checkpoint"),
])
def test_bad_agent_options_exit_2_with_one_line(capsys, tmp_path, argv, message) -> None:
    extra = ["--out", str(tmp_path / "a.pt"), "--updates", "1"] if argv[0] == "train" else []
    code, _, err = run_cli(capsys, *argv, *extra)
    assert code == 2 and message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.slow
def test_resume_refuses_a_single_process_checkpoint(capsys, tmp_path, tiny, tiny_yaml) -> None:
    from dl2ray.learn.records import RLOptions
    from dl2ray.learn.train import train_rl

    out = tmp_path / "rl.pt"
    train_rl(tiny, None, 1, 0, out, RLOptions(traces=2, val_traces=1, replay=False))
    code, _, err = run_cli(capsys, "train", "rl", "--config", str(tiny_yaml), "--agents", "2",
                           "--updates", "2", "--out", str(out), "--resume", "--traces", "2")
    assert code == 2 and "'rl' checkpoint" in err


@pytest.mark.ray
@pytest.mark.slow
def test_train_rl_with_two_agents_end_to_end(capsys, tmp_path, tiny_yaml, ray_session) -> None:
    """In-process on the session's Ray: exact update count, validation rows, best/JSON/TensorBoard files.

    (One run: actor start-up dominates. Resuming is tested on the plain GlobalPolicy class.)"""
    out = tmp_path / "m" / "a3c.pt"
    code, stdout, err = run_cli(capsys, "train", "rl", "--config", str(tiny_yaml), "--agents", "2",
                                "--updates", "6", "--out", str(out), "--traces", "4", "--val-traces", "1",
                                "--val-every", "3", "--checkpoint-every", "3", "--json")
    assert code == 0, err
    doc = json.loads(stdout)
    assert doc["updates"] == 6 and doc["agents"] == 2 and sum(doc["per_agent"].values()) == 6
    assert doc["initial_val_avg_jct"] > 0 and doc["drf_val_avg_jct"] > 0
    run = json.loads(out.with_suffix(".json").read_text())
    assert [r["update"] for r in run["history"]] == list(range(1, 7))
    assert run["validation"][0]["update"] == 0 and run["validation"][-1]["update"] == 6
    assert run["options"]["agents"] == 2 and run["seed"] == 0 and run["config"]["policy"]["window"] == 6
    assert len(run["train_seeds"]) == 4 and run["wall_seconds"] > 0
    ckpt = load_checkpoint(out)
    assert ckpt.extra["kind"] == "a3c" and ckpt.extra["updates"] == 6
    assert out.with_suffix(".best.pt").is_file()
    assert any(p.name.startswith("events.out.tfevents") for p in out.with_suffix(".tb").iterdir())
