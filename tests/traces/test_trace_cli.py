"""``dl2ray trace ...`` through the real entry point: exit codes and messages."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dl2ray.cli.app import main
from dl2ray.traces.parquet import read_trace, read_trace_meta

REPO = Path(__file__).resolve().parents[2]


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    """``dl2ray ARGV`` in-process: (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out = capsys.readouterr()
    return int(exc.value.code or 0), out.out, out.err


def test_import_then_describe(samples, tmp_path, capsys, testbed) -> None:
    out = tmp_path / "p.parquet"
    argv = ["trace", "import", "--format", "philly", str(samples / "philly_small.csv"),
            "--out", str(out), "--cluster", "6214e9", "--slot-seconds", "600", "--seed", "4"]  # fmt: skip
    code, stdout, _ = run(argv, capsys)
    assert code == 0, stdout
    assert "wrote 4 jobs" in stdout
    assert [j.arrival_slot for j in read_trace(out, testbed.catalogue)] == [0, 1, 12, 144]
    meta = read_trace_meta(out)
    assert meta.slot_seconds == 600.0
    assert meta.source.startswith("philly:philly_small.csv cluster=6214e9")

    code, stdout, _ = run(["trace", "describe", str(out), "--json"], capsys)
    assert code == 0
    summary = json.loads(stdout)
    assert summary["jobs"] == 4 and summary["span_slots"] == 145

    code, stdout, _ = run(["trace", "describe", str(out)], capsys)
    assert code == 0
    assert "span_slots" in stdout and "145" in stdout


def test_import_with_queues_writes_a_tenancy_block_the_config_accepts(samples, tmp_path, capsys) -> None:
    import yaml

    from dl2ray.tenancy import TenancyConfig

    out, block = tmp_path / "q.parquet", tmp_path / "tenancy.yaml"
    code, stdout, _ = run(["trace", "import", "--format", "philly", str(samples / "philly_small.csv"),
                           "--out", str(out), "--queues", "--tenancy-out", str(block)], capsys)
    assert code == 0 and "queues to" in stdout
    tenancy = TenancyConfig.model_validate(yaml.safe_load(block.read_text())["tenancy"])
    assert {j.queue for j in read_trace(out, load_config_default().catalogue)} == set(tenancy.names)


def load_config_default():
    from dl2ray.config import load_config

    return load_config(None)


def test_generate_is_seeded(tmp_path, capsys, testbed) -> None:
    paths = [tmp_path / f"g{i}.parquet" for i in range(3)]
    for path, seed in zip(paths, [1, 1, 2], strict=True):
        code, stdout, _ = run(["trace", "generate", "--seed", str(seed), "--out", str(path)], capsys)
        assert code == 0 and "wrote 30 jobs" in stdout
    a, b, c = (read_trace(p, testbed.catalogue) for p in paths)
    assert a == b != c
    assert read_trace_meta(paths[0]).source == "generate:testbed seed=1"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["trace", "import", "--format", "philly", "missing.csv", "--out", "x.parquet"],
         "missing.csv: cannot read trace"),
        (["trace", "import", "--format", "slurm", "f.csv", "--out", "x.parquet"],
         "--format: unknown format 'slurm'"),
        (["trace", "import", "--format", "philly", "f.csv", "--out", "x.parquet",
          "--epoch-error", "1.5"], "--epoch-error"),
        (["trace", "describe", "missing.parquet"], "missing.parquet: no such trace file"),
        (["trace", "import", "--format", "philly", "f.csv", "--out", "x.parquet",
          "--target-load", "0"], "--target-load: 0.0 must be > 0"),
        (["trace", "generate", "--config", "missing.yaml", "--out", "x.parquet"],
         "missing.yaml: cannot read config"),
        (["trace", "import", "--format", "philly", "f.csv", "--out", "x.parquet",
          "--tenancy-out", "t.yaml"], "--tenancy-out: needs --queues"),
    ],
)  # fmt: skip
def test_user_errors_exit_2(argv, message, capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, stderr = run(argv, capsys)
    assert code == 2
    assert message in stderr
    assert "Traceback" not in stderr


def test_malformed_csv_exit_2(samples, tmp_path, capsys) -> None:
    bad = tmp_path / "h.csv"
    lines = (samples / "helios_small.csv").read_text().splitlines()
    lines[2] = lines[2].replace(",4,1,", ",four,1,")  # cpu_num is unused; still a valid row
    lines[3] = lines[3].replace(",8,48,", ",eight,48,")
    bad.write_text("\n".join(lines) + "\n")
    argv = ["trace", "import", "--format", "helios", str(bad), "--out", str(tmp_path / "o.parquet")]
    code, _, stderr = run(argv, capsys)
    assert code == 2
    assert f"{bad}:4: field 'gpu_num'" in stderr


def test_console_entry_point_subprocess(samples, tmp_path) -> None:
    out = tmp_path / "a.parquet"
    cmd = [sys.executable, "-c", "from dl2ray.cli.app import main; main()", "trace", "import",
           "--format", "alibaba-gpu-2023", str(samples / "alibaba_gpu_2023_small.csv"),
           "--out", str(out), "--cluster", "x"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, check=False)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: --cluster")
    assert "Traceback" not in proc.stderr


def test_import_with_target_load_keeps_gpu_counts(samples, tmp_path, capsys, testbed) -> None:
    out = tmp_path / "p.parquet"
    argv = ["trace", "import", "--format", "philly", str(samples / "philly_small.csv"),
            "--out", str(out), "--target-load", "0.8", "--config", str(REPO / "configs" / "testbed.yaml")]
    code, stdout, _ = run(argv, capsys)
    assert code == 0, stdout
    trace = read_trace(out, testbed.catalogue)
    assert [j.requested_bundles for j in trace][:5] == [4, 1, 1, 1, 2]
    assert "target_load=0.8 load_cluster=testbed" in read_trace_meta(out).source
    # the sample's own load on the 26-GPU testbed is far below 0.8: arrivals come closer together
    plain = tmp_path / "q.parquet"
    run(["trace", "import", "--format", "philly", str(samples / "philly_small.csv"), "--out", str(plain)],
        capsys)
    assert trace[-1].arrival_slot < read_trace(plain, testbed.catalogue)[-1].arrival_slot


def test_describe_reports_the_offered_load_the_import_aimed_at(samples, tmp_path, capsys) -> None:
    out = tmp_path / "p.parquet"
    code, _, _ = run(["trace", "import", "--format", "philly", str(samples / "philly_small.csv"),
                      "--out", str(out), "--target-load", "0.5"], capsys)
    assert code == 0
    code, stdout, _ = run(["trace", "describe", str(out), "--json"], capsys)
    doc = json.loads(stdout)
    # recomputed from whole arrival slots, so close to (not exactly) the target
    assert doc["offered_load"] == pytest.approx(0.5, rel=0.05)
    assert doc["offered_load_cluster"] == "testbed"
    assert doc["requested_bundles"] == {"1": 3, "2": 1, "4": 1, "8": 1, "16": 1}


def test_merge_puts_each_file_in_its_queue_and_refuses_an_unknown_queue(tmp_path, capsys) -> None:
    """Two generated traces as two queues of the shared testbed: every job kept, in its file's queue, ids
    0..n-1 in arrival order; a queue the config does not have, a bad QUEUE=FILE or a config without queues:
    exit 2 naming it."""
    from dl2ray.config import load_config

    shared = str(REPO / "configs" / "testbed-shared.yaml")
    cfg = load_config(shared)
    files = []
    for seed in (1, 2):
        files.append(tmp_path / f"g{seed}.parquet")
        assert run(["trace", "generate", "--config", shared, "--seed", str(seed), "--out", str(files[-1])],
                   capsys)[0] == 0
    out = tmp_path / "merged.parquet"
    code, stdout, _ = run(["trace", "merge", "--config", shared, "--queue", f"research={files[0]}",
                           "--queue", f"prod={files[1]}", "--out", str(out)], capsys)
    assert code == 0 and "2 queue(s)" in stdout
    merged = read_trace(out, cfg.catalogue)
    parts = {q: read_trace(f, cfg.catalogue) for q, f in zip(("research", "prod"), files, strict=True)}
    assert [j.job_id for j in merged] == list(range(sum(len(p) for p in parts.values())))
    assert [j.arrival_slot for j in merged] == sorted(j.arrival_slot for j in merged)
    for q, part in parts.items():
        mine = [j for j in merged if j.queue == q]
        assert sorted((j.arrival_slot, j.job_type, j.true_epochs) for j in mine) == sorted(
            (j.arrival_slot, j.job_type, j.true_epochs) for j in part)
    assert read_trace_meta(out).source.startswith("merge:research=")

    code, _, err = run(["trace", "merge", "--config", shared, "--queue", f"nope={files[0]}",
                        "--out", str(out)], capsys)
    assert code == 2 and "'nope' is not a queue" in err and "research" in err
    code, _, err = run(["trace", "merge", "--config", shared, "--queue", str(files[0]), "--out", str(out)],
                       capsys)
    assert code == 2 and "QUEUE=FILE" in err
    code, _, err = run(["trace", "merge", "--config", str(REPO / "configs" / "testbed.yaml"), "--queue",
                        f"a={files[0]}", "--out", str(out)], capsys)
    assert code == 2 and "no tenancy" in err
