"""`dl2ray serve`, `bench serve` and `serve:URL` reach the CLI through the plugins; user errors exit 2."""

from __future__ import annotations

from support import CONFIGS, REPO, run_cli


def test_serve_refuses_a_checkpoint_of_another_config_before_starting_anything(capsys):
    code, _, err = run_cli(capsys, "serve", "--config", str(CONFIGS / "large.yaml"),
                           "--checkpoint", str(REPO / "models" / "dl2-testbed.pt"))
    assert code == 2 and "state dim" in err and "Traceback" not in err


def test_serve_and_bench_serve_name_a_missing_checkpoint(capsys, tmp_path):
    for cmd in (["serve"], ["bench", "serve"]):
        code, _, err = run_cli(capsys, *cmd, "--checkpoint", str(tmp_path / "nope.pt"))
        assert code == 2 and "nope.pt: no such file" in err


def test_serve_scheduler_needs_a_url(capsys):
    code, _, err = run_cli(capsys, "simulate", "--scheduler", "serve")
    assert code == 2 and "serve needs the endpoint's URL" in err
    code, _, err = run_cli(capsys, "simulate", "--scheduler", "serve:http://127.0.0.1:9")
    assert code == 2 and "cannot reach the endpoint" in err
