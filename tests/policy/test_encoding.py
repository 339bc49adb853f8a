"""State values and masks computed by hand on tiny views."""

from __future__ import annotations

import numpy as np
import pytest
from policy_tiny import CAT, L, job, view

from dl2ray.policy.encoding import FEATURES, Encoding, InfeasibleAction, SlotState, encode_window


def test_state_values_by_hand():
    enc = Encoding(window=3, num_types=L, slots_run_scale=10.0)
    v = view(job(7, "vgg-16", slots_run=4, done=25.0, est=100.0), job(8, "dssm", slots_run=30))
    s = SlotState(v, enc)
    s.begin(0)
    x = s.matrix()
    assert x.shape == (3, L + FEATURES) and s.state().shape == (3 * (L + 5),)
    assert x[0, CAT.index("vgg-16")] == 1 and x[0, :L].sum() == 1
    assert x[0, L] == pytest.approx(0.4)            # 4 slots / 10
    assert x[0, L + 1] == pytest.approx(0.75)       # 75 of 100 epochs remain
    assert x[1, L] == 1.0                           # 30 / 10 clipped
    assert np.all(x[2] == 0)                        # empty column
    # +1 bundle for vgg-16: worker (2, 1, 8) + PS (2, 0, 8) on 16 cpu / 4 gpu / 96 GB.
    row, delta = s.apply(enc.action(2, 0))
    assert row == 0
    # Scale: the largest capped share of any type: dssm at 16 workers + 16 PS, 64 of 16 cpu.
    share = max(4 / 16, 1 / 4, 16 / 96) / (64 / 16)
    np.testing.assert_allclose(x[0, L + 2:], [share, 1 / 12, 1 / 16], rtol=1e-6)
    np.testing.assert_allclose(delta, x[0, L + 2:], rtol=1e-6)


def test_mask_empty_columns_and_stop():
    enc = Encoding(window=4, num_types=L)
    _, mask = encode_window(view(job(1), job(2)), enc)
    J = 4
    for k in range(3):
        assert mask[k * J:k * J + 2].all() and not mask[k * J + 2:(k + 1) * J].any()
    assert mask[3 * J]


def test_mask_caps():
    enc = Encoding(window=2, num_types=L)
    s = SlotState(view(job(1, max_workers=1, max_ps=2)), enc)
    s.begin(0)
    s.mask()
    s.apply(enc.action(0, 0))                   # the one allowed worker
    m = s.mask()
    assert not m[0] and m[2] and not m[4]       # worker cap reached: no worker, no bundle; PS ok
    s.apply(enc.action(1, 0))
    s.apply(enc.action(1, 0))
    assert not s.mask()[:6].any()               # PS cap reached too
    with pytest.raises(InfeasibleAction):
        s.apply(enc.action(1, 0))


def test_mask_nothing_fits():
    enc = Encoding(window=2, num_types=L)
    # One node with 2 cpu, 1 gpu: a worker fits, a PS fits, not both.
    v = view(job(1), job(2, "dssm"), nodes=1, cpu=2, gpu=1)
    s = SlotState(v, enc)
    s.begin(0)
    m = s.mask()
    assert m[0] and m[2] and not m[4]           # resnet: worker ok, PS ok, bundle not
    assert m[1] and m[3] and not m[5]
    s.apply(enc.action(0, 0))
    assert not s.mask()[:6].any() and s.mask()[6]


def test_windows_of_j():
    enc = Encoding(window=2, num_types=L)
    v = view(job(1), job(2), job(3, "dssm"))
    s = SlotState(v, enc)
    assert s.num_windows == 2
    s.begin(1)
    assert [j.job_id for j in s.jobs] == [3]
    assert s.matrix()[0, CAT.index("dssm")] == 1 and not s.matrix()[1].any()
