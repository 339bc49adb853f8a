"""Recorded decisions of every shipped shape policy, for the fused decision path's identity test.

Each case drives the simulator of a config with a shipped checkpoint, built as a deployment builds it
(``make_scheduler("dl2:PATH", cfg)``: the operator's world, the checkpoint's own placer), over several
seeds until at least :data:`SLOTS` slots were decided. Each slot's allocation is reduced to a short digest
of its jobs in order, their task counts and their nodes (:func:`digest`).
``tests/data/regression/shape_decisions.json`` holds the digests recorded from the decision path before
issue 38 (main at f06c8e3: numpy job features, the network in numpy, the compiled menu loop, Python's
placement and Optimus layout), except ``dl2-large``'s, re-recorded when its weights were re-shipped
(issue 37, 2026-12-02), and ``dl2-large-clairvoyant``'s, re-recorded from the reference path under the
pinned kernel below (2026-12-02: 4 slots changed, each a near-tie); re-record only for a change that
is meant to change decisions::

    PYTHONPATH=. .venv/bin/python tests/policy/shape_recorded.py

A policy's logits are sums of products, and OpenBLAS picks its matrix kernel for the CPU it runs on:
an AVX-512 kernel and an AVX2 one round a near-tie apart, so the same weights can decide a slot
differently on another machine (CI's AVX2 machine decided 4 of ``dl2-large-clairvoyant``'s 200 slots
differently from a record made under AVX-512). The record is therefore made, and checked, in a child
process under one named kernel, :data:`OPENBLAS_CORETYPE` (AVX2, which every x86-64 CPU since 2013 runs),
with one BLAS thread: :func:`recorded_run` is that child.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RECORD = REPO / "tests/data/regression/shape_decisions.json"
SLOTS = 200
"""Slots recorded per policy (the issue's floor)."""
OPENBLAS_CORETYPE = "Haswell"
"""The OpenBLAS kernel the record is made and checked under (AVX2)."""

CASES = {
    "dl2-large": ("models/dl2-large.pt", "configs/large.yaml"),
    "dl2-large-clairvoyant": ("models/dl2-large-clairvoyant.pt", "configs/large-clairvoyant.yaml"),
    "dl2-philly": ("models/dl2-philly.pt", "configs/testbed-philly.yaml"),
    "dl2-philly-clairvoyant": ("models/dl2-philly-clairvoyant.pt", "configs/testbed-philly-clairvoyant.yaml"),
    "dl2-testbed": ("models/dl2-testbed.pt", "configs/testbed-layouts.yaml"),
    "dl2-testbed-busy": ("models/dl2-testbed-busy.pt", "configs/testbed-busy-layouts.yaml"),
    "dl2-testbed-clairvoyant": ("models/dl2-testbed-clairvoyant.pt", "configs/testbed-clairvoyant.yaml"),
    "dl2-testbed-seen6": ("models/dl2-testbed-seen6.pt", "configs/testbed-seen6.yaml"),
}
"""Every shape checkpoint of ``models/`` with the config its model card evaluates it on."""


def digest(allocation) -> str:
    """12 hex digits of the allocation's jobs in order with their counts and nodes."""
    placement = allocation.placement or {}
    parts = []
    for job_id, t in allocation.tasks.items():
        pl = placement.get(job_id)
        nodes = (tuple(pl.worker_nodes), tuple(pl.ps_nodes)) if pl is not None else None
        parts.append((int(job_id), int(t.workers), int(t.ps), nodes))
    return hashlib.sha1(repr(parts).encode()).hexdigest()[:12]


def scheduler(case: str):
    from dl2ray.config import load_config
    from dl2ray.schedulers.base import make_scheduler

    model, config = CASES[case]
    cfg = load_config(REPO / config)
    return cfg, make_scheduler(f"dl2:{REPO / model}", cfg)


def drive(case: str, decide: Callable | None = None, slots: int = SLOTS
          ) -> Iterator[tuple[int, int, object, object]]:
    """``(seed, slot, view, allocation)`` for the first ``slots`` slots of ``case`` over seeds 0, 1, …;
    ``decide(scheduler, view)`` decides (default: the scheduler's own ``decide``) and its allocation drives
    the simulator."""
    from dl2ray.world import build_simulator

    cfg, sched = scheduler(case)
    sim = build_simulator(cfg)
    done, seed = 0, 0
    while done < slots:
        view = sim.reset(seed)
        sched.reset(seed)
        while not sim.done and done < slots:
            alloc = sched.decide(view) if decide is None else decide(sched, view)
            yield seed, view.slot, view, alloc
            done += 1
            view = sim.step(alloc).view
        seed += 1


def record() -> dict[str, list[str]]:
    """``{case: [digest of each slot's allocation]}`` from the deployed scheduler, in this process."""
    return {case: [digest(alloc) for *_, alloc in drive(case)] for case in CASES}


def recorded_run() -> dict[str, list[str]]:
    """:func:`record` in a child process under the pinned kernel :data:`OPENBLAS_CORETYPE`, one thread."""
    env = {**os.environ, "OPENBLAS_CORETYPE": OPENBLAS_CORETYPE, "OPENBLAS_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, __file__, "--print"], env=env, capture_output=True, text=True,
                         check=False)
    if out.returncode != 0:
        raise RuntimeError(f"recording under OPENBLAS_CORETYPE={OPENBLAS_CORETYPE} failed:\n{out.stderr}")
    return json.loads(out.stdout)


if __name__ == "__main__":
    if sys.argv[1:] == ["--print"]:
        print(json.dumps(record()))
    else:
        out = recorded_run()
        RECORD.parent.mkdir(parents=True, exist_ok=True)
        RECORD.write_text(json.dumps(out, indent=0) + "\n")
        print({k: len(v) for k, v in out.items()}, file=sys.stderr)
