"""The scaling clock on hand-computed cases."""

from __future__ import annotations

from elastic_mxnet.coordination.clock import Progress, estimated_iteration, scaling_clock


def test_clock_is_one_past_the_extrapolated_progress_plus_the_margin():
    workers = [Progress(10, 0.05, 100.0, 0.002), Progress(9, 0.5, 80.0, 0.001)]
    # estimates: 10 + 100*0.05 = 15; 9 + 80*min(0.5, 0.2) = 25
    assert estimated_iteration(workers, 0.2) == 25.0
    # 25 + 1 = 26; margin ceil(100 * (2*0.002 + 0.010)) = ceil(1.4) = 2
    assert scaling_clock(workers, extrapolate_s=0.2) == 28


def test_recovery_clock_does_not_extrapolate_or_add_margin():
    workers = [Progress(40, 3.0, 50.0, 0.001), Progress(40, 3.0, 50.0, 0.001)]
    assert scaling_clock(workers, margin=False) == 41


def test_clock_passes_refusals_and_ps_versions():
    idle = [Progress(7, 1.0, 0.0, 0.0)]
    assert scaling_clock(idle) == 8
    assert scaling_clock(idle, floor=12) == 13
    assert scaling_clock(idle, ps_versions=[9, 3]) == 9
    assert scaling_clock([]) == 0
