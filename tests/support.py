"""Shared test helpers (importable as ``support`` from any test directory)."""

from __future__ import annotations

from pathlib import Path

from dl2ray.config import ExperimentConfig, load_config

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
SHARED_DATA = REPO.parent / "shared" / "data"


def small_config(**groups) -> ExperimentConfig:
    """The testbed config with whole groups replaced (dicts are validated)."""
    raw = load_config(CONFIGS / "testbed-clairvoyant.yaml").model_dump()
    raw["profile"] = "profiles/testbed.json"  # the operator's profile, so the planner can run
    for key, value in groups.items():
        raw[key] = value if not isinstance(value, dict) else {**raw.get(key, {}), **value}
    raw["base_dir"] = str(CONFIGS)
    return ExperimentConfig.model_validate(raw)


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """Run ``dl2ray ARGV`` in-process; return (exit code, stdout, stderr)."""
    from dl2ray.cli import main

    try:
        main(list(argv))
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def wait_for(what: str, check, timeout_s: float = 180.0, poll_s: float = 0.3):
    """Poll ``check()`` until it returns something truthy (returned); AssertionError naming ``what``
    after ``timeout_s``. Live tests wait on conditions, never on fixed sleeps."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out waiting for {what}")
