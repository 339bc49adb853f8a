"""Teacher decomposition replays the teacher exactly; the seed sets are disjoint."""

from __future__ import annotations

import pytest
from support import small_config

from dl2ray import seeds
from dl2ray.learn.teacher import decompose
from dl2ray.policy.encoding import Encoding
from dl2ray.schedulers.base import make_scheduler
from dl2ray.world import build_simulator


@pytest.mark.parametrize("teacher", ["drf", "fifo", "srtf"])
def test_replay_reproduces_teacher_counts(testbed, teacher):
    # One window holds every job: with more than J jobs the windows are filled one after
    # the other (Fig. 17), an order the teacher did not use, and the replay may fall short.
    enc = Encoding.from_config(small_config(policy={"window": 40}))
    sim, sched = build_simulator(testbed), make_scheduler(teacher, testbed)
    view = sim.reset(seeds.training(1)[0])
    stops = 0
    for _ in range(40):
        if sim.done:
            break
        alloc = sched.decide(view)
        d = decompose(view, alloc, enc)
        want = {j: tuple(t) for j, t in alloc.tasks.items() if t.workers or t.ps}
        got = {j: tuple(t) for j, t in d.decision.allocation.tasks.items() if t.workers or t.ps}
        assert got == want and d.short == 0
        for s in d.decision.steps:
            assert s.mask[s.action]
        stops += sum(s.action == enc.stop for s in d.decision.steps)
        view = sim.step(alloc).view
    assert stops > 0  # the stop action is labelled


def test_stop_is_labelled_when_teacher_leaves_room(testbed):
    from dl2ray.view import Allocation, Tasks

    enc = Encoding.from_config(testbed)
    view = build_simulator(testbed).reset(0)
    target = Allocation({view.jobs[0].job_id: Tasks(2, 1)})
    steps = decompose(view, target, enc).decision.steps
    assert [s.action for s in steps] == [enc.action(2, 0), enc.action(0, 0), enc.stop]


def test_seed_sets_are_disjoint():
    sets = [set(seeds.TRAINING), set(seeds.VALIDATION), set(seeds.TEST)]
    assert not (sets[0] & sets[1]) and not (sets[0] & sets[2]) and not (sets[1] & sets[2])
    assert seeds.which(seeds.validation(1)[0]) == "validation" and seeds.which(0) == "none"
