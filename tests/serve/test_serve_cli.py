"""`dl2ray serve`, `bench serve` and `serve:URL` reach the CLI through the plugins; user errors exit 2."""

from __future__ import annotations

from pathlib import Path

import yaml
from support import CONFIGS, REPO, run_cli

from serve.app import DEPLOYMENT_DEFAULTS, ServeSettings, build


def test_serve_refuses_a_checkpoint_of_another_config_before_starting_anything(capsys):
    # the paper architecture's window differs between testbed (J = 20) and large (J = 40); a shape
    # policy has no window and serves any cluster size of the same catalogue and menu
    code, _, err = run_cli(capsys, "serve", "--config", str(CONFIGS / "large.yaml"),
                           "--checkpoint", str(REPO / "models" / "dl2-testbed-paper.pt"))
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


def test_config_yaml_is_a_valid_serve_config():
    from ray.serve.schema import ServeDeploySchema

    doc = yaml.safe_load((REPO / "serve" / "config.yaml").read_text(encoding="utf-8"))
    schema = ServeDeploySchema.model_validate(doc)
    (app,) = schema.applications
    assert app.import_path == "serve.app:build"
    settings = ServeSettings.model_validate(app.args)
    assert Path(settings.config).name == "testbed.yaml"
    assert Path(str(settings.checkpoint)).name == "dl2-testbed.pt"
    (dep,) = app.deployments  # overrides the deployment the builder makes, by name
    assert dep.name == DEPLOYMENT_DEFAULTS["name"]
    assert dep.max_ongoing_requests == DEPLOYMENT_DEFAULTS["max_ongoing_requests"]
    build(app.args)  # the builder takes the file's args


def test_bench_serve_refuses_a_bad_replica_count(capsys):
    code, out, err = run_cli(capsys, "bench", "serve", "--modes", "haproxy:zero", "--json")
    assert code == 2 and out == ""
    assert "haproxy:zero" in err and "Traceback" not in err
