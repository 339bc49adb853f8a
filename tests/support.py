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
        raw[key] = value if not isinstance(value, dict) else {**(raw.get(key) or {}), **value}
    raw["base_dir"] = str(CONFIGS)
    return ExperimentConfig.model_validate(raw)


def tiny_shape_config() -> ExperimentConfig:
    """Three testbed nodes, six jobs, a small shape policy (cheap counterfactual updates) and the
    realistic information model (per-job deviation, declared-epoch error): a twin has something not to
    know."""
    return small_config(
        cluster={"nodes": [{"count": 3, "cpu": 8, "gpu": 2, "mem": 48}]},
        workload={"num_jobs": 6, "arrivals": {"pattern": "poisson", "rate": 1.5, "max_per_slot": 3},
                  "epoch_error": 0.2},
        speed={"job_deviation": 0.2},
        policy={"arch": "shape", "shape": {"embed": [16], "head": 8, "envs": 2, "slots_per_update": 3,
                                           "jobs_per_slot": 2, "samples": 2, "uniform": 1, "horizon": 4}},
        sim={"max_slots": 200},
    )


def config_yaml(cfg: ExperimentConfig, path: Path) -> Path:
    """``cfg`` as a YAML file for the CLI (absolute paths to the job types, speed surfaces and profile)."""
    import yaml

    raw = cfg.model_dump(mode="json")
    raw.pop("base_dir")
    raw["jobtypes"] = str(cfg.resolve(cfg.jobtypes))
    raw["speed"]["surfaces"] = str(cfg.surfaces_dir)
    if cfg.profile is not None:
        raw["profile"] = str(cfg.resolve(cfg.profile))
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """Run ``dl2ray ARGV`` in-process; return (exit code, stdout, stderr)."""
    from dl2ray.cli.app import main

    try:
        main(list(argv))
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def wait_for(what: str, check, timeout_s: float = 600.0, poll_s: float = 0.3, progress=None,
             within: float | None = None):
    """Poll ``check()`` until it returns something truthy (returned). Live tests wait on events, never on
    fixed sleeps, and never on the machine being idle:

    * ``timeout_s`` is hang protection, not a speed requirement: the wait fails only after ``timeout_s``
      seconds *in which nothing happened*. With ``progress`` (a callable returning a number that grows
      while the system under test works: slots stepped, updates applied, epochs trained), every advance
      starts those seconds again, so a loaded machine makes the wait longer, never failed.
    * ``within``: fail as soon as ``progress()`` has advanced by this much since the wait began and
      ``check()`` still fails (the event did not happen in that many slots/updates: a real failure,
      found without any clock).

    AssertionError naming ``what`` (and the progress seen) otherwise.
    """
    import time

    start = last = progress() if progress is not None else None
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if progress is not None:
            now = progress()
            if now != last:
                last, deadline = now, time.monotonic() + timeout_s
            if within is not None and now - start >= within:
                raise AssertionError(f"{what}: did not happen within {within:g} (progress {start} -> {now})")
        if time.monotonic() > deadline:
            seen = "" if progress is None else f" (progress stuck at {last})"
            raise AssertionError(f"timed out waiting for {what}{seen}")
        time.sleep(poll_s)


def terminal_signals() -> None:
    """``preexec_fn`` of a child a test will Ctrl-C: SIGINT as a terminal's foreground job has it (default),
    whatever the test process inherited; a child started with SIGINT ignored ignores Ctrl-C (POSIX), and
    the test runner's worker can have it ignored (a run launched in the background, or an earlier test)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
