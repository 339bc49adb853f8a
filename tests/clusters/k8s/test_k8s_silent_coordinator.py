"""A coordinator that does not answer the snapshot's status question: the reconciler tells a job that
has just ended (its pod exited between the pod list and the question) from a coordinator that is
silent while its pod is Ready. In-process fakes for the API and the coordinators: this is the rule
alone; tests/clusters/k8s/test_k8s_kubectl.py runs it against real jobs."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from clusters.k8s.api import ApiGiveUp
from clusters.k8s.config import K8sSettings
from clusters.k8s.reconciler import Reconciler
from clusters.k8s.world import JobState, World
from elastic_mxnet.protocol.messages import StatusReply

READY = {"phase": "Running", "podIP": "10.0.0.7", "conditions": [{"type": "Ready", "status": "True"}]}
DONE = {"phase": "Succeeded", "podIP": "10.0.0.7", "conditions": [{"type": "Ready", "status": "False"}]}


def pod(status: dict) -> dict:
    return {"metadata": {"name": "j-coordinator", "labels": {}}, "status": status}


class Api:
    def __init__(self, later: dict | None, fail: bool = False) -> None:
        self.later, self.fail, self.reads = later, fail, 0

    def pods(self, job: str | None = None) -> list[dict]:
        self.reads += 1
        if self.fail:
            raise ApiGiveUp("list", "pods", 503, "unavailable")
        return [] if self.later is None else [pod(self.later)]


class Coordinators:
    def __init__(self, answers: list[StatusReply | None]) -> None:
        self.answers, self.asked = answers, 0

    def status(self, address: str) -> StatusReply | None:
        self.asked += 1
        return self.answers.pop(0)


def reply() -> StatusReply:
    return StatusReply(state="running", members=[], plan_id=0, version=0, samples_per_s=0.0,
                       epochs_done=0.0, last_suspension_ms=None, events=[])


def reconciler(api: Api, coords: Coordinators) -> tuple[Reconciler, JobState]:
    settings = K8sSettings()
    r = Reconciler(api, settings, None, "pack", coords, ThreadPoolExecutor(1), None)  # type: ignore[arg-type]
    r.world = World.empty(settings.pods.coordinator_port)
    return r, JobState(obj={}, name="j", coordinator=pod(READY))


def test_a_coordinator_that_exited_after_the_pod_list_ends_the_job_quietly():
    api, coords = Api(later=DONE), Coordinators([None])
    r, js = reconciler(api, coords)
    assert r._ended_silently(js) is True
    assert coords.asked == 1 and api.reads == 1


def test_a_ready_coordinator_that_answers_the_second_question_is_scaled_as_usual():
    api, coords = Api(later=READY), Coordinators([reply()])
    r, js = reconciler(api, coords)
    assert r._ended_silently(js) is False
    assert js.coord is not None and api.reads == 0


def test_a_ready_coordinator_silent_twice_stays_an_error_for_converge():
    for api in (Api(later=READY), Api(later=None), Api(later=DONE, fail=True)):
        r, js = reconciler(api, Coordinators([None]))
        assert r._ended_silently(js) is False
        assert js.coord is None  # _converge raises "does not answer"


def test_a_job_that_answered_or_has_no_coordinator_is_not_asked_again():
    coords = Coordinators([])
    r, js = reconciler(Api(later=DONE), coords)
    js.coord = reply()
    assert r._ended_silently(js) is False
    js.coord, js.coordinator = None, None
    assert r._ended_silently(js) is False
    js.coordinator = pod({"phase": "Pending"})
    assert r._ended_silently(js) is False
    assert coords.asked == 0
