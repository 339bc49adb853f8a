"""JSON Schema (pydantic) → the structural OpenAPI v3.0 schema a CustomResourceDefinition takes: one source
of truth for the custom resources' specs (DL2Job's is :class:`~dl2ray.jobspec.JobSpec`, DL2Queue's
:class:`~dl2ray.tenancy.QueueSpec`)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

Obj = dict[str, Any]

_DROP = {"title", "additionalProperties", "$defs"}


def _nullable(node: dict[str, Any]) -> dict[str, Any]:
    """``node`` marked nullable; a ``default: null`` dropped (absent is null already, and a null default
    makes `kubectl apply` see a change in the CRD on every run)."""
    out = {k: v for k, v in node.items() if not (k == "default" and v is None)}
    out["nullable"] = True
    return out


def _openapi(node: Any, defs: dict[str, Any]) -> Any:
    """JSON Schema (pydantic, draft 2020-12) → the OpenAPI v3.0 subset a structural CRD schema takes:
    ``$ref`` inlined, ``anyOf [X, null]`` → ``X`` + ``nullable``, numeric ``exclusiveMinimum`` →
    ``minimum`` + ``exclusiveMinimum: true``, titles and ``additionalProperties`` dropped (unknown
    fields are pruned by the API server)."""
    if isinstance(node, list):
        return [_openapi(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = _openapi(defs[node["$ref"].rsplit("/", 1)[-1]], defs)
        extra = {k: _openapi(v, defs) for k, v in node.items() if k != "$ref" and k not in _DROP}
        return {**target, **extra}
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        nullable = len(options) < len(node["anyOf"])
        if len(options) == 1:
            rest = {k: v for k, v in node.items() if k != "anyOf"}
            merged = _openapi({**options[0], **rest}, defs)
            return _nullable(merged) if nullable else merged
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key == "properties":
            out[key] = {k: _openapi(v, defs) for k, v in value.items()}
        else:
            out[key] = _openapi(value, defs)
    if "const" in out:
        out["enum"] = [out.pop("const")]
    return out


def model_openapi(model: type[BaseModel]) -> Obj:
    """A pydantic model's validation schema as a structural CRD schema (:func:`_openapi`)."""
    raw = model.model_json_schema(mode="validation")
    out: Obj = _openapi(raw, raw.get("$defs", {}))
    return out


def custom_resource_definition(*, group: str, version: str, kind: str, plural: str, singular: str,
                               short_names: list[str], scope: str, description: str, spec: Obj, status: Obj,
                               columns: list[Obj], labels: dict[str, str],
                               categories: list[str] | None = None) -> Obj:
    """A ``CustomResourceDefinition`` of one served, stored version with a status subresource, printer
    ``columns`` and the ``spec``/``status`` schemas (DL2Job's and DL2Queue's)."""
    names: Obj = {"kind": kind, "plural": plural, "singular": singular, "shortNames": short_names,
                  "listKind": f"{kind}List"}
    if categories:
        names["categories"] = categories
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}", "labels": dict(labels)},
        "spec": {
            "group": group,
            "scope": scope,
            "names": names,
            "versions": [{
                "name": version, "served": True, "storage": True, "subresources": {"status": {}},
                "additionalPrinterColumns": columns,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "description": description,
                    "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                                   "metadata": {"type": "object"}, "spec": spec, "status": status},
                    "required": ["spec"],
                }},
            }],
        },
    }
