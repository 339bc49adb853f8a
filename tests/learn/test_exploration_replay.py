"""Job-aware exploration rules (each poor state → its correcting action with probability ε) and replay."""

from __future__ import annotations

import numpy as np
import pytest
from support import small_config

from dl2ray.learn.exploration import JobAwareExploration, correction, corrections
from dl2ray.learn.replay import ReplayBuffer
from dl2ray.learn.rollout import Batch, ExploringChooser
from dl2ray.policy.decision import run_decision
from dl2ray.policy.encoding import BUNDLE, PS, WORKER, Encoding
from dl2ray.view import ClusterView, JobView

ENC = Encoding(window=3, num_types=8)
ALL = np.ones(ENC.action_dim, bool)


@pytest.mark.parametrize(("w", "p", "expect"), [
    (1, 0, PS), (3, 0, PS),          # workers without PS
    (0, 1, WORKER), (0, 2, WORKER),  # PS without workers
    (5, 1, PS), (9, 2, PS),          # worker/PS ratio beyond θ = 4
    (1, 5, WORKER), (2, 9, WORKER),  # PS/worker ratio beyond θ
    (0, 0, None), (1, 1, None), (4, 1, None), (1, 4, None), (3, 2, None),
])
def test_poor_states_and_their_correction(w, p, expect):
    assert correction(w, p, ratio=4.0) == expect


def test_corrections_skip_masked_and_healthy_rows():
    mask = ALL.copy()
    mask[ENC.action(PS, 2)] = False  # row 2's correction (+PS) does not fit
    counts = [(1, 0), (1, 1), (2, 0)]
    assert corrections(counts, mask, ENC, 4.0) == [ENC.action(PS, 0)]


@pytest.mark.parametrize(("counts", "fix"), [
    ([(0, 0), (2, 0), (0, 0)], (PS, 1)),
    ([(0, 0), (0, 0), (0, 3)], (WORKER, 2)),
    ([(6, 1), (0, 0), (0, 0)], (PS, 0)),
    ([(1, 6), (0, 0), (0, 0)], (WORKER, 0)),
])
def test_eps_one_always_corrects_eps_zero_never(counts, fix):
    stop = ENC.stop
    rng = np.random.default_rng(0)
    assert JobAwareExploration(1.0, 4.0).apply(stop, counts, ALL, ENC, rng) == ENC.action(*fix)
    assert JobAwareExploration(0.0, 4.0).apply(stop, counts, ALL, ENC, rng) == stop


def test_healthy_window_is_never_changed():
    rng = np.random.default_rng(0)
    a = ENC.action(BUNDLE, 1)
    assert JobAwareExploration(1.0).apply(a, [(1, 1), (2, 2), (0, 0)], ALL, ENC, rng) == a


def test_correction_probability_is_eps():
    rng = np.random.default_rng(123)
    ex = JobAwareExploration(0.3, 4.0)
    n = 20_000
    hits = sum(ex.apply(ENC.stop, [(1, 0), (0, 0), (0, 0)], ALL, ENC, rng) != ENC.stop for _ in range(n))
    assert hits / n == pytest.approx(0.3, abs=0.015)


def test_several_poor_jobs_are_corrected_uniformly():
    rng = np.random.default_rng(5)
    ex = JobAwareExploration(1.0, 4.0)
    picks = [ex.apply(ENC.stop, [(1, 0), (0, 0), (0, 2)], ALL, ENC, rng) for _ in range(4000)]
    fa, fb = ENC.action(PS, 0), ENC.action(WORKER, 2)
    assert set(picks) == {fa, fb}
    assert picks.count(fa) / len(picks) == pytest.approx(0.5, abs=0.03)


class _Scripted:
    """A chooser that plays a fixed list of actions (then stop)."""

    def __init__(self, actions):
        self.actions = list(actions)

    def begin(self, slot):
        pass

    def choose(self, slot, mask):
        return self.actions.pop(0) if self.actions else ENC.stop

    def applied(self, row, delta):
        pass


def _view() -> ClusterView:
    cfg = small_config()
    cat = cfg.catalogue
    jobs = []
    for job_id in range(2):
        jt = cat.types[0]
        jobs.append(JobView(job_id, jt.name, 0, 0, 0, 100.0, 0.0, 0, 0, (), (), cat.worker_demand[0],
                            cat.ps_demand[0], jt.max_workers, jt.max_ps))
    cap = np.tile([[8.0, 2.0, 48.0]], (4, 1))
    return ClusterView(0, 1200.0, cap, cap, tuple(jobs), cat, "load_balancing")


def test_exploration_in_the_decision_loop():
    """+1 worker for job 0, then the policy says stop: with ε = 1 the stop becomes +1 PS for job 0."""
    chooser = ExploringChooser(_Scripted([ENC.action(WORKER, 0)]), JobAwareExploration(1.0, 4.0),
                               np.random.default_rng(0), ENC)
    dec = run_decision(_view(), ENC, chooser, record=True)
    assert [s.action for s in dec.steps] == [ENC.action(WORKER, 0), ENC.action(PS, 0), ENC.stop]
    assert chooser.explored == 1
    assert dec.allocation.tasks[0].workers == 1 and dec.allocation.tasks[0].ps == 1
    plain = ExploringChooser(_Scripted([ENC.action(WORKER, 0)]), None, None, ENC)
    assert [s.action for s in run_decision(_view(), ENC, plain, record=True).steps] == [0, ENC.stop]


# -- replay ---------------------------------------------------------------------------------------


def _batch(start: int, n: int, d: int = 4, a: int = 3) -> Batch:
    ids = np.arange(start, start + n)
    return Batch(np.repeat(ids[:, None], d, 1).astype(np.float32), np.ones((n, a), bool), ids % a,
                 ids.astype(np.float32), np.zeros((n, d), np.float32), np.zeros(n, bool),
                 ids.astype(np.float32))


def test_ring_buffer_evicts_oldest():
    buf = ReplayBuffer(10, 4, 3)
    for k in range(3):
        buf.add(_batch(6 * k, 6))  # ids 0..17
    assert len(buf) == 10
    assert sorted(buf._data.rewards.tolist()) == list(range(8, 18))
    buf.add(_batch(100, 25))  # more than capacity: only the newest 10 stay
    assert sorted(buf._data.rewards.tolist()) == list(range(115, 125))


def test_sample_shapes_and_seeded_determinism():
    buf = ReplayBuffer(50, 4, 3)
    buf.add(_batch(0, 40))
    s1 = buf.sample(16, np.random.default_rng(9))
    s2 = buf.sample(16, np.random.default_rng(9))
    assert s1.batch.states.shape == (16, 4) and s1.batch.masks.shape == (16, 3) and s1.weights is None
    assert len(set(s1.indices.tolist())) == 16  # uniform: distinct when the buffer is large enough
    np.testing.assert_array_equal(s1.indices, s2.indices)
    np.testing.assert_array_equal(s1.batch.rewards, s1.indices.astype(np.float32))
    assert buf.sample(64, np.random.default_rng(0)).batch.actions.shape == (64,)


def test_prioritised_sampling_favours_high_priority_and_weights_it_down():
    buf = ReplayBuffer(100, 4, 3, prioritized=True, alpha=1.0, beta=0.5)
    buf.add(_batch(0, 100))
    buf.update_priorities(np.arange(100), np.full(100, 0.1))
    buf.update_priorities(np.array([7]), np.array([50.0]))
    p = buf.probabilities()
    assert p[7] == pytest.approx((50 + 1e-3) / (50 + 1e-3 + 99 * (0.1 + 1e-3)))
    s = buf.sample(2000, np.random.default_rng(1))
    assert np.mean(s.indices == 7) == pytest.approx(p[7], abs=0.03)
    assert s.weights is not None and s.weights.max() == pytest.approx(1.0)
    assert np.all(s.weights[s.indices == 7] < s.weights[s.indices != 7].min())
    buf.add(_batch(200, 1))  # overwrites slot 0 with the largest priority seen
    after = buf.probabilities()
    assert after[0] == pytest.approx(after[7])
