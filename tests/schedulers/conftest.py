"""Hand-built views for scheduler unit tests (testbed catalogue, tiny clusters)."""

from __future__ import annotations

import numpy as np
import pytest

from dl2ray.view import ClusterView, JobView, Observation


@pytest.fixture
def make_job(testbed):
    """``make_job(job_id, type_name, arrival=0, est=100, done=0, history=(), requested=None,
    workers=0, ps=0)`` -> JobView (``workers``/``ps``: the previous slot's deployment)."""
    cat = testbed.catalogue

    def make(job_id, type_name, arrival=0, est=100.0, done=0.0, history=(), requested=None,
             workers=0, ps=0):
        t = cat.index(type_name)
        jt = cat.types[t]
        return JobView(
            job_id=job_id, job_type=type_name, type_index=t, arrival_slot=arrival,
            slots_run=len(history), est_epochs=est, done_epochs=done, workers=workers, ps=ps,
            worker_nodes=(0,) * workers, ps_nodes=(0,) * ps, worker_demand=cat.worker_demand[t],
            ps_demand=cat.ps_demand[t], max_workers=jt.max_workers, max_ps=jt.max_ps,
            history=tuple(history), requested_bundles=requested,
        )

    return make


@pytest.fixture
def make_view(testbed):
    """``make_view(jobs, nodes=1, node=(8, 2, 48), placement=..., slot=0)`` -> ClusterView."""

    def make(jobs, nodes=1, node=(8.0, 2.0, 48.0), placement="load_balancing", slot=0):
        cap = np.tile(np.asarray(node, dtype=np.float64), (nodes, 1))
        return ClusterView(slot, 1200.0, cap, cap, tuple(jobs), testbed.catalogue, placement)

    return make


def ran(slot, epochs, seconds=1200.0, ps=1, workers=1, loss=1.0) -> Observation:
    """One observation of a slot the job trained in."""
    return Observation(slot, ps, workers, epochs, seconds, loss)


@pytest.fixture
def observation():
    return ran
