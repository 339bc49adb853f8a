"""The Kubernetes API, as the backend uses it: every call with retries; the one module that imports
``kubernetes``.

**API errors** (:class:`KubeApi`): 429, 5xx, timeouts and connection errors
are retried with capped exponential backoff (``Retry-After`` honoured); a 409
on create means the object exists (deterministic names: a create repeated
after a lost answer finds its own pod, never makes a second); a 404 on
delete means it is gone; other 4xx are given up and reported
(:class:`ApiGiveUp`). Reads return plain dicts (the JSON), never client models,
so nothing above this module sees a ``kubernetes`` type.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import kubernetes
import urllib3
from kubernetes.client.exceptions import ApiException

from clusters.k8s import objects as ko
from clusters.k8s import queues as kq
from clusters.k8s.config import ApiSettings, K8sSettings
from dl2ray.errors import UserError

log = logging.getLogger(__name__)


class ApiGiveUp(RuntimeError):
    """An API call the backend does not retry (4xx other than 404/409/429), or out of attempts."""

    def __init__(self, verb: str, what: str, status: int | None, reason: str) -> None:
        super().__init__(f"{verb} {what}: {status or 'no answer'} {reason}".strip())
        self.status = status


class Conflict(Exception):
    """409 from the API server."""


class NotFound(Exception):
    """404 from the API server."""


def _retryable(exc: Exception) -> tuple[bool, float | None]:
    """(retry?, server-suggested wait) for an exception of one API call."""
    if isinstance(exc, ApiException):
        if exc.status == 429 or (exc.status or 0) >= 500:
            after = (exc.headers or {}).get("Retry-After")
            try:
                return True, float(after) if after else None
            except ValueError:
                return True, None
        return False, None
    return isinstance(exc, urllib3.exceptions.HTTPError | OSError | TimeoutError), None


def kube_contexts(kubeconfig: str) -> list[str]:
    """The context names of a kubeconfig file; UserError naming the file when it cannot be read."""
    try:
        contexts, _ = kubernetes.config.list_kube_config_contexts(config_file=kubeconfig)
    except (kubernetes.config.ConfigException, OSError, ValueError) as exc:
        raise UserError(f"kubeconfig {kubeconfig}: {exc}") from None
    return [c["name"] for c in contexts or []]


class KubeApi:
    """Every API call of the backend, each with retries; reads return plain dicts (JSON), not models.

    ``calls`` counts HTTP requests by verb (``list``, ``get``, ``create``, ``patch``, ``delete``),
    retries included: the benchmark's reads/writes per slot.
    """

    def __init__(
        self,
        client: kubernetes.client.ApiClient,
        settings: ApiSettings,
        namespace: str,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.core = kubernetes.client.CoreV1Api(client)
        self.custom = kubernetes.client.CustomObjectsApi(client)
        self.settings, self.namespace, self.sleep = settings, namespace, sleep
        self.calls: Counter[str] = Counter()
        self.retries: Counter[str] = Counter()

    @classmethod
    def connect(cls, settings: K8sSettings, kubeconfig: str | None) -> KubeApi:
        """From a kubeconfig file, or the in-cluster service account when ``kubeconfig`` is None."""
        conf = kubernetes.client.Configuration()
        try:
            if kubeconfig is None:
                kubernetes.config.load_incluster_config(client_configuration=conf)
            else:
                kubernetes.config.load_kube_config(
                    config_file=kubeconfig, context=settings.context, client_configuration=conf
                )
        except kubernetes.config.ConfigException as exc:
            raise UserError(f"kubernetes.kubeconfig: {exc}") from None
        conf.retries = False  # we retry, with backoff and classification (urllib3 would retry blindly)
        return cls(kubernetes.client.ApiClient(conf), settings.api, settings.namespace)

    def _call(self, verb: str, what: str, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        s = self.settings
        wait = s.backoff_s
        for attempt in range(1, s.attempts + 1):
            self.calls[verb] += 1
            try:
                return fn(*args, _request_timeout=s.timeout_s, **kw)
            except ApiException as exc:
                if exc.status == 409:
                    raise Conflict(what) from None
                if exc.status == 404:
                    raise NotFound(what) from None
                retry, after = _retryable(exc)
                if not retry:
                    raise ApiGiveUp(verb, what, exc.status, exc.reason or "") from None
                error: Exception = exc
            except Exception as exc:
                retry, after = _retryable(exc)
                if not retry:
                    raise
                after, error = None, exc
            if attempt == s.attempts:
                raise ApiGiveUp(
                    verb,
                    what,
                    getattr(error, "status", None),
                    f"after {attempt} tries: {type(error).__name__}",
                ) from None
            self.retries[verb] += 1
            delay = min(after if after is not None else wait, s.backoff_max_s)
            log.info("%s %s: %s; retry %d in %.2f s", verb, what, type(error).__name__, attempt, delay)
            self.sleep(delay)
            wait = min(wait * 2, s.backoff_max_s)
        raise AssertionError("unreachable")

    @staticmethod
    def _json(resp: Any) -> Any:
        return json.loads(resp.data)

    # ---- reads ----

    def nodes(self) -> list[dict]:
        return self._json(self._call("list", "nodes", self.core.list_node, _preload_content=False))["items"]

    def all_pods(self) -> list[dict]:
        """Every pod of every namespace (for the requests on each node)."""
        resp = self._call("list", "pods", self.core.list_pod_for_all_namespaces, _preload_content=False)
        return self._json(resp)["items"]

    def pods(self, job: str | None = None) -> list[dict]:
        """Pods of the namespace managed by dl2ray (of ``job`` when given); filtered here too (the
        label selector is a hint a mock API server may ignore)."""
        sel = f"{ko.LABEL_JOB}={job}" if job else ko.LABEL_JOB
        resp = self._call(
            "list",
            "pods",
            self.core.list_namespaced_pod,
            self.namespace,
            label_selector=sel,
            _preload_content=False,
        )
        items = self._json(resp)["items"]
        return [
            p
            for p in items
            if (p["metadata"].get("labels") or {}).get(ko.LABEL_JOB)
            and (job is None or p["metadata"]["labels"][ko.LABEL_JOB] == job)
        ]

    def services(self) -> list[dict]:
        resp = self._call(
            "list",
            "services",
            self.core.list_namespaced_service,
            self.namespace,
            label_selector=ko.LABEL_JOB,
            _preload_content=False,
        )
        return [s for s in self._json(resp)["items"] if (s["metadata"].get("labels") or {}).get(ko.LABEL_JOB)]

    def jobs(self) -> list[dict]:
        return self._call(
            "list",
            "dl2jobs",
            self.custom.list_namespaced_custom_object,
            ko.GROUP,
            ko.VERSION,
            self.namespace,
            ko.PLURAL,
        )["items"]

    def job(self, name: str) -> dict | None:
        try:
            return self._call(
                "get",
                f"dl2job {name}",
                self.custom.get_namespaced_custom_object,
                ko.GROUP,
                ko.VERSION,
                self.namespace,
                ko.PLURAL,
                name,
            )
        except NotFound:
            return None

    def queues(self) -> list[dict]:
        """Every DL2Queue (cluster-scoped); [] where the DL2Queue CRD is not installed (404)."""
        try:
            return self._call("list", "dl2queues", self.custom.list_cluster_custom_object, ko.GROUP,
                              ko.VERSION, kq.PLURAL)["items"]
        except NotFound:
            return []

    # ---- writes ----

    def create(self, obj: dict) -> bool:
        """Create ``obj`` (a Pod, Service, Event, DL2Job or DL2Queue); False if it existed already (409)."""
        kind, name = obj["kind"], obj["metadata"]["name"]
        fn: Callable[..., Any]
        args: tuple
        if kind == "Pod":
            fn, args = self.core.create_namespaced_pod, (self.namespace, obj)
        elif kind == "Service":
            fn, args = self.core.create_namespaced_service, (self.namespace, obj)
        elif kind == "Event":
            fn, args = self.core.create_namespaced_event, (self.namespace, obj)
        elif kind == "DL2Queue":
            fn, args = self.custom.create_cluster_custom_object, (ko.GROUP, ko.VERSION, kq.PLURAL, obj)
        else:
            fn, args = (
                self.custom.create_namespaced_custom_object,
                (ko.GROUP, ko.VERSION, self.namespace, ko.PLURAL, obj),
            )
        try:
            self._call("create", f"{kind.lower()} {name}", fn, *args, _preload_content=False)
            return True
        except Conflict:
            return False

    def delete(self, kind: str, name: str) -> bool:
        """Delete a Pod, Service or DL2Job; False if it was gone already (404)."""
        body = kubernetes.client.V1DeleteOptions(propagation_policy="Background")
        try:
            if kind == "Pod":
                self._call(
                    "delete",
                    f"pod {name}",
                    self.core.delete_namespaced_pod,
                    name,
                    self.namespace,
                    body=body,
                    _preload_content=False,
                )
            elif kind == "Service":
                self._call(
                    "delete",
                    f"service {name}",
                    self.core.delete_namespaced_service,
                    name,
                    self.namespace,
                    _preload_content=False,
                )
            else:
                self._call(
                    "delete",
                    f"dl2job {name}",
                    self.custom.delete_namespaced_custom_object,
                    ko.GROUP,
                    ko.VERSION,
                    self.namespace,
                    ko.PLURAL,
                    name,
                )
            return True
        except NotFound:
            return False

    def patch_status(self, name: str, status: dict) -> None:
        """Merge ``status`` into the DL2Job's status subresource (idempotent: a retry writes the same)."""
        with contextlib.suppress(NotFound):  # deleted meanwhile: nothing to report on
            self._call(
                "patch",
                f"dl2job {name}/status",
                self.custom.patch_namespaced_custom_object_status,
                ko.GROUP,
                ko.VERSION,
                self.namespace,
                ko.PLURAL,
                name,
                {"status": status},
            )

    def patch_queue(self, name: str, body: dict, subresource: str | None = None) -> None:
        """Merge ``body`` into DL2Queue ``name`` (``subresource="status"``: its status)."""
        fn = (self.custom.patch_cluster_custom_object_status if subresource == "status"
              else self.custom.patch_cluster_custom_object)
        with contextlib.suppress(NotFound):  # deleted meanwhile: created again at the next slot
            self._call("patch", f"dl2queue {name}{'/' + subresource if subresource else ''}", fn, ko.GROUP,
                       ko.VERSION, kq.PLURAL, name, body)
