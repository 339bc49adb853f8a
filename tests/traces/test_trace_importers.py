"""Importers on the shipped samples: filters, ids, slots, the epochs rule, errors, seeds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dl2ray.speed import SpeedModel
from dl2ray.traces import TraceError
from dl2ray.traces.importers import FORMATS, ImportOptions, import_trace

SAMPLE = {
    "philly": "philly_small.csv",
    "alibaba-gpu-2023": "alibaba_gpu_2023_small.csv",
    "helios": "helios_small.csv",
}
# Kept records, sorted by submit time: (arrival slot at 1200 s, duration s, GPUs).
EXPECTED = {
    "philly": [
        (0, 3600.0, 4), (0, 2951.0, 1), (2, 300.0, 1), (3, 66.0, 1),
        (6, 7200.0, 2), (6, 600.0, 32), (72, 86400.0, 8),
    ],
    "alibaba-gpu-2023": [(0, 11900.0, 1), (1, 3200.0, 8), (2, 6550.0, 1)],
    "helios": [(0, 3600.0, 1), (1, 7200.0, 2), (6, 1800.0, 16)],
}  # fmt: skip
SURFACES = Path(__file__).resolve().parents[2] / "configs" / "speed" / "surfaces.json"


def expected_epochs(job_type: str, gpus: int, duration_s: float, speed: SpeedModel) -> float:
    """The documented rule, computed from the raw surfaces file."""
    jt = speed.catalogue.get(job_type)
    g = max(1, min(gpus, jt.max_workers, jt.max_ps))
    grid = json.loads(SURFACES.read_text())["models"][job_type]["speed"]
    row = grid[min(g, len(grid)) - 1]
    return row[min(g, len(row)) - 1] * duration_s / jt.batches_per_epoch


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_sample_imports_with_the_documented_rule(fmt, samples, speed_model, check_trace) -> None:
    trace = import_trace(fmt, samples / SAMPLE[fmt], speed_model, ImportOptions())
    check_trace(trace, speed_model.catalogue)
    expected = EXPECTED[fmt]
    assert len(trace) == len(expected)  # the filtered rows are gone
    assert [j.arrival_slot for j in trace] == [e[0] for e in expected]
    for job, (_, duration, gpus) in zip(trace, expected, strict=True):
        want = expected_epochs(job.job_type, gpus, duration, speed_model)
        assert job.true_epochs == pytest.approx(want, rel=1e-12)
        assert job.est_epochs == job.true_epochs


def test_one_record_by_hand(samples, speed_model) -> None:
    """Philly's first job: 4 GPUs for 3600 s, time scale 0.5 → 1800 s at (4 PS, 4 workers)."""
    opts = ImportOptions(time_scale=0.5, seed=5)
    job = import_trace("philly", samples / SAMPLE["philly"], speed_model, opts)[0]
    jt = speed_model.catalogue.get(job.job_type)
    bps = speed_model.surfaces[job.job_type].speed[3, 3]  # speed[ps-1, workers-1]
    assert job.true_epochs == pytest.approx(bps * 1800.0 / jt.batches_per_epoch)


def test_time_scale_compresses_arrivals(samples, speed_model) -> None:
    trace = import_trace(
        "philly", samples / SAMPLE["philly"], speed_model, ImportOptions(time_scale=0.1)
    )
    # 86400 s × 0.1 / 1200 s = 7.2 → slot 7; 7200 × 0.1 / 1200 = 0.6 → slot 0.
    assert [j.arrival_slot for j in trace] == [0, 0, 0, 0, 0, 0, 7]


@pytest.mark.parametrize("fmt, cluster, n", [("philly", "6214e9", 4), ("helios", "vcA", 2)])
def test_cluster_filter(fmt, cluster, n, samples, speed_model, check_trace) -> None:
    trace = import_trace(fmt, samples / SAMPLE[fmt], speed_model, ImportOptions(cluster=cluster))
    check_trace(trace, speed_model.catalogue)
    assert len(trace) == n


def test_cluster_filter_philly_slots(samples, speed_model) -> None:
    opts = ImportOptions(cluster="6214e9")
    trace = import_trace("philly", samples / SAMPLE["philly"], speed_model, opts)
    assert [j.arrival_slot for j in trace] == [0, 0, 6, 72]


def test_cluster_is_rejected_for_alibaba(samples, speed_model) -> None:
    with pytest.raises(TraceError, match="--cluster"):
        path = samples / SAMPLE["alibaba-gpu-2023"]
        import_trace("alibaba-gpu-2023", path, speed_model, ImportOptions(cluster="x"))


def test_unknown_cluster_leaves_no_jobs(samples, speed_model) -> None:
    with pytest.raises(TraceError, match="no jobs left"):
        opts = ImportOptions(cluster="nope")
        import_trace("philly", samples / SAMPLE["philly"], speed_model, opts)


def test_max_jobs_keeps_the_first(samples, speed_model) -> None:
    path = samples / SAMPLE["philly"]
    full = import_trace("philly", path, speed_model, ImportOptions(seed=3))
    head = import_trace("philly", path, speed_model, ImportOptions(seed=3, max_jobs=3))
    assert head == full[:3]


def test_skip_takes_a_later_segment(samples, speed_model) -> None:
    path = samples / SAMPLE["philly"]
    full = import_trace("philly", path, speed_model, ImportOptions(seed=3))
    seg = import_trace("philly", path, speed_model, ImportOptions(seed=3, skip=2, max_jobs=2))
    assert len(seg) == 2 and [j.job_id for j in seg] == [0, 1]
    assert [j.true_epochs for j in seg] != [j.true_epochs for j in full[:2]]
    with pytest.raises(TraceError, match="--skip"):
        import_trace("philly", path, speed_model, ImportOptions(skip=len(full)))


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_seed_determinism(fmt, samples, speed_model) -> None:
    path = samples / SAMPLE[fmt]
    opts = ImportOptions(seed=11, epoch_error=0.3)
    a = import_trace(fmt, path, speed_model, opts)
    assert import_trace(fmt, path, speed_model, opts) == a
    ratios = np.array([j.est_epochs / j.true_epochs for j in a])
    assert np.all((ratios >= 0.7) & (ratios <= 1.3))
    others = [import_trace(fmt, path, speed_model, ImportOptions(seed=s)) for s in range(5)]
    assert any([j.job_type for j in o] != [j.job_type for j in a] for o in others)


def test_types_subset(samples, speed_model) -> None:
    opts = ImportOptions(types=("dssm",))
    trace = import_trace("philly", samples / SAMPLE["philly"], speed_model, opts)
    assert {j.job_type for j in trace} == {"dssm"}


# -- malformed input -------------------------------------------------------------------


def corrupt(samples: Path, tmp_path: Path, fmt: str, line: int, text: str) -> Path:
    """The sample with physical line ``line`` (1 = header) replaced by ``text``."""
    lines = (samples / SAMPLE[fmt]).read_text().splitlines()
    lines[line - 1] = text
    out = tmp_path / SAMPLE[fmt]
    out.write_text("\n".join(lines) + "\n")
    return out


MALFORMED = [
    ("philly", 3, "2017-10-09 06:13:03,abc,1,2951.0,6214e9", "'duration'"),
    ("philly", 4, "2017-10-09 6:00,3600.0,4,14400.0,6214e9", "'timestamp'"),
    ("philly", 5, "2017-10-09 06:20:00,0.0,1,0.0", "'cluster'"),
    ("philly", 6, "2017-10-09 06:30:00,1200.0,1.5,0.0,6214e9", "'num_gpus'"),
    ("alibaba-gpu-2023", 3, "openb-pod-0001,6000,12288,x,0,,BE,Running,50,5000,60", "'num_gpu'"),
    ("alibaba-gpu-2023", 4, "openb-pod-0002,8000,30000,2,1000,V100M32,LS,Succeeded,,4000,",
     "'creation_time'"),
    ("alibaba-gpu-2023", 2, "openb-pod-0000,12000,16384,1,1000", "'gpu_spec'"),
    ("helios", 3, "j2,u2,vcB,0,4,1,COMPLETED,yesterday,,,60,0", "'submit_time'"),
    ("helios", 5, "j4,u3,vcB,2,12,1,COMPLETED,2020-04-01 00:20:00,,,nan,0", "'duration'"),
]  # fmt: skip


@pytest.mark.parametrize("fmt, line, text, field", MALFORMED)
def test_malformed_row_names_file_line_field(fmt, line, text, field, samples, tmp_path, speed_model):
    path = corrupt(samples, tmp_path, fmt, line, text)
    with pytest.raises(TraceError) as err:
        import_trace(fmt, path, speed_model, ImportOptions())
    message = str(err.value)
    assert f"{path}:{line}:" in message
    assert field in message


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_wrong_header(fmt, samples, tmp_path, speed_model) -> None:
    header = (samples / SAMPLE[fmt]).read_text().splitlines()[0]
    path = corrupt(samples, tmp_path, fmt, 1, header.replace("_", "-").replace("duration", "dur"))
    with pytest.raises(TraceError, match=f"{path}:1: header lacks"):
        import_trace(fmt, path, speed_model, ImportOptions())


def test_extra_field_is_rejected(samples, tmp_path, speed_model) -> None:
    path = corrupt(samples, tmp_path, "philly", 2, "2017-10-09 07:01:55,66.0,1,66.0,11cb48,x")
    with pytest.raises(TraceError, match=r":2: 6 fields, expected 5"):
        import_trace("philly", path, speed_model, ImportOptions())


def test_missing_file_and_unknown_format(tmp_path, speed_model) -> None:
    with pytest.raises(TraceError, match="cannot read trace"):
        import_trace("philly", tmp_path / "none.csv", speed_model, ImportOptions())
    with pytest.raises(TraceError, match="unknown format"):
        import_trace("sge", tmp_path / "none.csv", speed_model, ImportOptions())


@pytest.mark.parametrize(
    "kwargs, option",
    [
        ({"slot_seconds": 0.0}, "--slot-seconds"),
        ({"time_scale": -1.0}, "--time-scale"),
        ({"max_jobs": 0}, "--max-jobs"),
        ({"skip": -1}, "--skip"),
        ({"epoch_error": 1.0}, "--epoch-error"),
        ({"seed": -1}, "--seed"),
    ],
)
def test_bad_options(kwargs, option) -> None:
    with pytest.raises(TraceError, match=option):
        ImportOptions(**kwargs)


def test_byte_order_mark_is_tolerated(samples, tmp_path, speed_model) -> None:
    path = tmp_path / "bom.csv"
    path.write_bytes(b"\xef\xbb\xbf" + (samples / SAMPLE["helios"]).read_bytes())
    assert len(import_trace("helios", path, speed_model, ImportOptions())) == 3


# -- requested sizes and the offered load -------------------------------------------------

TESTBED_TOTAL = (104.0, 26.0, 624.0)  # 13 nodes × (8 cores, 2 GPUs, 48 GB)


def test_requested_size_is_the_gpu_count_within_the_caps(samples, speed_model) -> None:
    trace = import_trace("philly", samples / SAMPLE["philly"], speed_model, ImportOptions())
    for job, (_, _, gpus) in zip(trace, EXPECTED["philly"], strict=True):
        jt = speed_model.catalogue.get(job.job_type)
        assert job.requested_bundles == min(gpus, jt.max_workers, jt.max_ps)
    assert [j.requested_bundles for j in trace][:5] == [4, 1, 1, 1, 2]


def _raw(*jobs):
    from dl2ray.traces.importers import RawJob

    return [RawJob(submit, duration, gpus, line) for line, (submit, duration, gpus) in
            enumerate(jobs, start=2)]


def test_target_load_compresses_arrivals_by_hand(speed_model) -> None:
    """Two 1-GPU jobs of 31,200 s submitted 12,000 s apart on 26 GPUs (a bundle's dominant share
    is 1/26 for every type): offered load (2 × 31200 / 26) / 12000 = 0.2. Target 0.4 halves the
    gap (slot 10 → 5); durations stay."""
    from dl2ray.traces.importers import to_trace

    records = _raw((0.0, 31200.0, 1), (12000.0, 31200.0, 1))
    plain = to_trace(records, speed_model, ImportOptions(seed=1))
    loaded = to_trace(records, speed_model, ImportOptions(
        seed=1, target_load=0.4, cluster_total=TESTBED_TOTAL))
    assert [j.arrival_slot for j in plain] == [0, 10]
    assert [j.arrival_slot for j in loaded] == [0, 5]
    assert [j.true_epochs for j in loaded] == [j.true_epochs for j in plain]
    stretched = to_trace(records, speed_model, ImportOptions(
        seed=1, target_load=0.1, cluster_total=TESTBED_TOTAL))
    assert [j.arrival_slot for j in stretched] == [0, 20]


def test_offered_load_weighs_jobs_by_their_dominant_share(testbed) -> None:
    from dl2ray.traces.importers import bundle_share, offered_load

    total = np.array(TESTBED_TOTAL)
    resnet, dssm = testbed.catalogue.get("resnet-50"), testbed.catalogue.get("dssm")
    assert bundle_share(resnet, 2, total) == pytest.approx(2 / 26)  # GPUs: 2 of 26
    assert bundle_share(dssm, 2, total) == pytest.approx(8 / 104)  # CPU-only: 8 of 104 cores
    assert offered_load(np.array([0.5, 0.25]), np.array([100.0, 400.0]), 300.0) == pytest.approx(0.5)


def test_higher_target_load_means_earlier_arrivals(samples, speed_model) -> None:
    def last(load):
        opts = ImportOptions(target_load=load, cluster_total=TESTBED_TOTAL)
        return import_trace("philly", samples / SAMPLE["philly"], speed_model, opts)[-1].arrival_slot

    assert last(0.2) > last(0.8) > last(3.0)


@pytest.mark.parametrize(
    ("records", "options", "message"),
    [
        (((0.0, 60.0, 1), (10.0, 60.0, 1)), {"target_load": 0.5}, "needs the cluster"),
        (((5.0, 60.0, 1), (5.0, 60.0, 2)), {"target_load": 0.5, "cluster_total": TESTBED_TOTAL},
         "same time"),
    ],
)
def test_target_load_errors(speed_model, records, options, message) -> None:
    from dl2ray.traces.importers import to_trace

    with pytest.raises(TraceError, match=message):
        to_trace(_raw(*records), speed_model, ImportOptions(**options))


@pytest.mark.parametrize("load", [0.0, -1.0, float("inf")])
def test_target_load_must_be_positive(load) -> None:
    with pytest.raises(TraceError, match="--target-load"):
        ImportOptions(target_load=load)


@pytest.mark.parametrize("fmt", ["philly", "helios"])
def test_queues_put_every_job_in_its_virtual_cluster(fmt, samples, speed_model) -> None:
    from dl2ray.traces.importers import vc_tenancy

    path = samples / SAMPLE[fmt]
    trace = import_trace(fmt, path, speed_model, ImportOptions(queues=True))
    records = sorted(FORMATS[fmt](path, None), key=lambda r: (r.submit_s, r.line))
    assert [j.queue for j in sorted(trace, key=lambda j: j.job_id)] == [r.group for r in records]
    tenancy = vc_tenancy(records, np.array(TESTBED_TOTAL))
    assert set(tenancy.names) == {r.group for r in records}
    nominal = sum(q.nominal.as_array() for q in tenancy.queues)
    assert np.all(nominal <= np.array(TESTBED_TOTAL) + 1e-9)
    gpu_time = {g: sum(r.gpus * r.duration_s for r in records if r.group == g) for g in tenancy.names}
    biggest = max(gpu_time, key=gpu_time.get)
    assert tenancy.queue(biggest).nominal.gpu == max(q.nominal.gpu for q in tenancy.queues)


def test_queues_need_a_format_that_names_virtual_clusters(samples, speed_model) -> None:
    with pytest.raises(TraceError, match="--queues: this format names no virtual cluster"):
        import_trace("alibaba-gpu-2023", samples / SAMPLE["alibaba-gpu-2023"], speed_model,
                     ImportOptions(queues=True))
