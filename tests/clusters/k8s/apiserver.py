"""What a real API server does and kmock's KubernetesEmulator does not, as far as kubectl and the tests
need it.

:class:`ApiServer` is a ``KubernetesEmulator`` (kmock's documented way to add
behaviour: subclass it) that adds:

* **metadata on create**: ``uid``, ``creationTimestamp``, ``resourceVersion``,
  ``generation`` and the namespace of the URL (only where the client did not
  send them), and the answer ``201 Created`` (kmock answers 200, and the
  official Python client's ``create_namespaced_custom_object`` decodes the
  body of a 201 only);
* **CustomResourceDefinitions**: creating one registers its served versions as
  resources (kind, singular, short names, categories, scope, subresources), so
  discovery shows them as an API server's does, and writes the CRD's status
  (``acceptedNames``, ``NamesAccepted`` and ``Established``);
* **errors** carry the API's ``reason`` for their code (``NotFound``,
  ``AlreadyExists``, …; kmock writes ``Object Not Found``, and kubectl before
  1.22 recognises a missing object by that reason only, so ``kubectl apply``
  could not create anything);
* **discovery** fixes: ``/api/v1`` answers ``groupVersion: v1`` (kmock writes
  ``/v1``, which kubectl rejects), ``singularName`` is the lower-case kind and
  ``verbs`` the full set when not declared;
* **lists** carry ``kind: <Kind>List`` and ``apiVersion`` (kubectl decodes by
  kind) and honour ``labelSelector`` (equality and existence) and
  ``fieldSelector`` (``path=value``, ``path==value``, ``path!=value`` on any
  dotted field path, e.g. ``involvedObject.uid``: what ``kubectl describe``
  uses to find an object's events);
* **server-side Table output** (``Accept: application/json;as=Table;v=v1;
  g=meta.k8s.io``) for custom resources: a ``Name`` column, then the CRD's
  ``additionalPrinterColumns`` evaluated as the API server does (types
  integer, number, boolean, string; ``date`` as a relative age such as ``5m3s``;
  priority > 0 only with ``kubectl get -o wide``), or ``Age`` when it declares
  none. Built-in kinds are answered as plain lists and kubectl prints them itself.

Not emulated: OpenAPI documents (``/openapi/v2``, ``/openapi/v3``; kubectl's
``--validate`` needs them, so the tests run ``kubectl apply --validate=false`` and
check schemas offline with kubernetes-validate), schema validation and pruning,
``resourceVersion`` conflicts, set-based label selectors (answered 400),
printer-column JSONPaths beyond ``.a.b[0].c`` (a CRD using them is refused with
422), and CRD deletion (its resource stays registered).
"""

from __future__ import annotations

import itertools
import re
import uuid
from datetime import UTC, datetime
from typing import Any

import attrs
from kmock import KubernetesEmulator, KubernetesError, Request, ResourceInfo, Response, action, resource

VERBS = {"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"}
CRD_RESOURCE = resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
TABLE = re.compile(r"as=Table;\s*v=v1;\s*g=meta\.k8s\.io")
_PATH = re.compile(r"^(\.[A-Za-z0-9_-]+(\[\d+\])?)+$")
REASONS = {
    400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 405: "MethodNotAllowed",
    409: "AlreadyExists", 410: "Gone", 422: "Invalid", 429: "TooManyRequests", 500: "InternalError",
    503: "ServiceUnavailable", 504: "Timeout",
}
"""metav1.StatusReason of each HTTP code the server answers with."""
NAME_COLUMN = {
    "name": "Name",
    "type": "string",
    "format": "name",
    "description": "Name must be unique within a namespace.",
    "priority": 0,
}


@attrs.frozen
class BadRequest(KubernetesError):
    status: int = 400
    reason: str = "BadRequest"


@attrs.frozen
class Invalid(KubernetesError):
    status: int = 422
    reason: str = "Invalid"


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def human_duration(seconds: float) -> str:
    """Kubernetes' ``duration.HumanDuration`` (apimachinery): how kubectl and the API server write ages."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    m, h = s // 60, s // 3600
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    d = h // 24
    if h < 24 * 8:
        return f"{d}d{h % 24}h" if h % 24 else f"{d}d"
    if h < 24 * 365 * 2:
        return f"{d}d"
    if h < 24 * 365 * 8:
        return f"{d // 365}y{d % 365}d" if d % 365 else f"{d // 365}y"
    return f"{d // 365}y"


def json_path(obj: Any, path: str) -> Any:
    """The value at a simple JSONPath (``.a.b[0].c``), or None where a step is missing."""
    for name, index in re.findall(r"\.([A-Za-z0-9_-]+)(?:\[(\d+)\])?", path):
        obj = obj.get(name) if isinstance(obj, dict) else None
        if index and obj is not None:
            obj = obj[int(index)] if isinstance(obj, list) and int(index) < len(obj) else None
    return obj


def field(obj: Any, dotted: str) -> str:
    """A field selector's view of a field: its value as a string, "" when missing."""
    value = json_path(obj, "." + dotted)
    if isinstance(value, bool):
        return str(value).lower()
    return "" if value is None else str(value)


def _requirements(selector: str) -> list[tuple[str, str, str]]:
    """``a=b,c!=d,e,!f`` → [(key, op, value)] with op one of ``=``, ``!=``, ``exists``, ``!exists``."""
    out = []
    for part in filter(None, (p.strip() for p in selector.split(","))):
        m = re.fullmatch(r"([^=!\s]+)\s*(==|=|!=)\s*(\S*)", part)
        if m:
            out.append((m[1], "!=" if m[2] == "!=" else "=", m[3]))
        elif re.fullmatch(r"!?[A-Za-z0-9._/-]+", part):
            out.append((part.lstrip("!"), "!exists" if part.startswith("!") else "exists", ""))
        else:
            raise BadRequest(message=f"selector {selector!r}: {part!r} is beyond the test API server")
    return out


def selected(obj: dict, labels: str | None, fields: str | None) -> bool:
    """Whether ``obj`` matches a labelSelector and a fieldSelector (either may be None)."""
    have = (obj.get("metadata") or {}).get("labels") or {}
    for key, op, value in _requirements(labels or ""):
        ok = {
            "=": have.get(key) == value,
            "!=": have.get(key) != value,
            "exists": key in have,
            "!exists": key not in have,
        }[op]
        if not ok:
            return False
    for key, op, value in _requirements(fields or ""):
        if op not in ("=", "!=") or (field(obj, key) == value) != (op == "="):
            return False
    return True


def cell(kind: str, value: Any) -> Any:
    """One Table cell of a printer column of type ``kind`` (apiextensions' ``cellForJSONValue``)."""
    if value is None:
        return None
    if kind == "date":
        try:
            t = datetime.strptime(str(value), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        except ValueError:
            return "<invalid>"
        return human_duration((datetime.now(UTC) - t).total_seconds())
    if kind == "integer" and isinstance(value, int | float) and not isinstance(value, bool):
        return int(value)
    if kind == "number" and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if kind == "boolean" and isinstance(value, bool):
        return value
    if kind == "string":
        return value if isinstance(value, str) else str(value)
    return None


@attrs.define(kw_only=True)
class ApiServer(KubernetesEmulator):
    """kmock's emulator plus the API-server behaviour in the module docstring."""

    _versions: itertools.count = attrs.field(factory=lambda: itertools.count(1), init=False)

    async def _render_error(self, exc: Exception) -> Any:
        if isinstance(exc, KubernetesError) and exc.status in REASONS:
            exc = attrs.evolve(exc, reason=REASONS[exc.status])
        return await super()._render_error(exc)

    async def _handle(self, request: Request) -> Any:
        creates = request.resource is not None and request.action == action.CREATE
        if creates and isinstance(request.data, dict):
            self._admit(request)
        return await super()._handle(request)

    def _admit(self, request: Request) -> None:
        obj = request.data
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", now_iso())
        meta.setdefault("generation", 1)
        meta["resourceVersion"] = str(next(self._versions))
        if request.namespace:
            meta.setdefault("namespace", request.namespace)
        if request.resource == CRD_RESOURCE:
            self.register_crd(obj)

    def register_crd(self, crd: dict) -> None:
        """Serve the CRD's versions as resources and write the status an API server writes; 422 on a
        printer column this server cannot evaluate."""
        spec = crd["spec"]
        names = spec["names"]
        for v in spec["versions"]:
            for i, col in enumerate(v.get("additionalPrinterColumns") or []):
                if not _PATH.match(col["jsonPath"]):
                    raise Invalid(
                        message=f"spec.versions[{v['name']}].additionalPrinterColumns[{i}].jsonPath: "
                        f"{col['jsonPath']!r} is beyond the test API server's JSONPath (.a.b[0].c)"
                    )
        for v in spec["versions"]:
            if not v.get("served", True):
                continue
            self.resources[resource(spec["group"], v["name"], names["plural"])] = ResourceInfo(
                kind=names["kind"],
                singular=names.get("singular") or names["kind"].lower(),
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                shortnames=names.get("shortNames") or [],
                categories=names.get("categories") or [],
                verbs=VERBS,
                subresources=set(v.get("subresources") or {}) & {"status", "scale"},
            )
        t = now_iso()
        crd["status"] = {
            "acceptedNames": names,
            "storedVersions": [v["name"] for v in spec["versions"] if v.get("storage")],
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
                 "message": "no conflicts found", "lastTransitionTime": t},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
                 "message": "the initial names have been accepted", "lastTransitionTime": t},
            ],
        }

    def _info(self, res: Any) -> ResourceInfo | None:
        for key, info in self.resources.items():
            if key == res:
                return info
        return None

    async def _serve_version(self, request: Request) -> Any:
        payload = await super()._serve_version(request)
        res = request.resource
        assert res is not None
        if res.group == "":
            payload["groupVersion"] = res.version
        for entry in payload["resources"]:
            base, _, sub = entry["name"].partition("/")
            info = self._info(resource(res.group, res.version, base))
            if info is None:
                continue
            kind = info.kind or base
            entry["singularName"] = "" if sub else (info.singular or kind.lower())
            if sub:  # short names and categories name the resource, not its subresources
                entry["shortNames"], entry["categories"] = [], []
            entry["verbs"] = sorted(info.verbs or ({"get", "patch", "update"} if sub else VERBS))
        return payload

    async def _serve_list(self, request: Request) -> Any:
        payload = await super()._serve_list(request)
        params = request.params
        labels, fields = params.get("labelSelector"), params.get("fieldSelector")
        items = [o for o in payload["items"] if selected(o, labels, fields)]
        if self._wants_table(request):
            return self._table(request, items)
        res = request.resource
        info = self._info(res)
        assert res is not None
        return {
            "apiVersion": f"{res.group}/{res.version}" if res.group else res.version,
            "kind": f"{(info.kind if info and info.kind else 'Object')}List",
            "metadata": {"resourceVersion": str(next(self._versions))},
            "items": items,
        }

    async def _serve_create(self, request: Request) -> Any:
        return Response(status=201, payload=await super()._serve_create(request))

    async def _serve_fetch(self, request: Request) -> Any:
        obj = await super()._serve_fetch(request)
        return self._table(request, [obj]) if self._wants_table(request) else obj

    def _wants_table(self, request: Request) -> bool:
        """A Table was asked for and this resource is a custom one (built-in kinds: kubectl prints them)."""
        accept = next((v for k, v in request.headers.items() if k.lower() == "accept"), "")
        return bool(TABLE.search(accept)) and self._crd(request.resource) is not None

    def _crd(self, res: Any) -> dict | None:
        """The stored CRD that defines ``res`` (None for built-in kinds)."""
        for (kind, _ns, _name), obj in self.objects.items():
            if kind != CRD_RESOURCE or obj.deleted:
                continue
            spec = obj.raw["spec"]
            if spec["group"] == res.group and spec["names"]["plural"] == res.plural:
                return obj.raw
        return None

    def _table(self, request: Request, items: list[dict]) -> dict:
        """``meta.k8s.io/v1`` Table of custom resources, as the API server converts them."""
        crd = self._crd(request.resource)
        assert crd is not None
        version = next(v for v in crd["spec"]["versions"] if v["name"] == request.resource.version)
        columns = version.get("additionalPrinterColumns") or [
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
        ]
        include = request.params.get("includeObject", "Metadata")
        rows = []
        for obj in items:
            cells = [cell(c["type"], json_path(obj, c["jsonPath"])) for c in columns]
            row: dict[str, Any] = {"cells": [obj["metadata"]["name"], *cells]}
            if include == "Object":
                row["object"] = obj
            elif include != "None":
                row["object"] = {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": obj["metadata"],
                }
            rows.append(row)
        return {
            "kind": "Table",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": str(next(self._versions))},
            "columnDefinitions": [NAME_COLUMN]
            + [
                {
                    "name": c["name"],
                    "type": c["type"],
                    "format": c.get("format", ""),
                    "description": c.get("description", ""),
                    "priority": c.get("priority", 0),
                }
                for c in columns
            ],
            "rows": rows,
        }
