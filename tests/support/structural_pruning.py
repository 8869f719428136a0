"""Structural pruning and defaulting of custom resources, as the Kubernetes API server does them.

A model of apiextensions-apiserver's `pkg/apiserver/schema/pruning/algorithm.go` (Prune) and
`pkg/apiserver/schema/defaulting/algorithm.go` (Default), driven by a CRD version's `openAPIV3Schema`:

- a key the schema does not declare (no `properties` entry, no `additionalProperties`) is dropped, and its path is
  reported the way the API server words its field-validation warning (`spec.a.b[0].c`);
- `x-kubernetes-preserve-unknown-fields: true` keeps unknown keys there, but what the schema does declare below it is
  still pruned;
- the resource root and every `x-kubernetes-embedded-resource` keep `apiVersion`, `kind` and `metadata`, whose keys
  are ObjectMeta's (the API server decodes it as ObjectMeta, dropping any other key);
- arrays are pruned item by item against `items`; scalars are left alone;
- a null where the schema allows none (no `nullable: true`) and gives no default is dropped
  (`defaulting/prunenulls.go`, PruneNonNullableNullsWithoutDefaults);
- `default:` fills an absent key, or a null one the schema does not allow, of an object that is present, never an
  absent object.

No maintained Python library does this (the API server's Go code is the reference), hence this module. The KubeRay
CRDs it is used with are in `kuberay_crds/<version>/` beside it (KubeRay's `ray-operator/config/crd/bases/` at each
release tag; its README says where from).
"""
import copy
from functools import cache
from pathlib import Path

import yaml

KUBERAY_CRDS = Path(__file__).resolve().parent / "kuberay_crds"
PRESERVE = "x-kubernetes-preserve-unknown-fields"
EMBEDDED = "x-kubernetes-embedded-resource"
META_FIELDS = ("apiVersion", "kind", "metadata")
OBJECT_META = {"name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation",
               "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "labels", "annotations",
               "ownerReferences", "finalizers", "managedFields"}  # k8s.io/apimachinery ObjectMeta's JSON fields


@cache
def crd_schema(version: str, plural: str = "rayservices", group: str = "ray.io", served: str = "v1") -> dict:
    """The `openAPIV3Schema` of `<plural>.<group>` at API version `served`, from KubeRay `version`'s CRD file
    (e.g. "1.5.1")."""
    path = KUBERAY_CRDS / f"v{version.removeprefix('v')}" / f"{group}_{plural}.yaml"
    if not path.exists():
        known = sorted(p.name for p in KUBERAY_CRDS.glob("v*")) if KUBERAY_CRDS.exists() else []
        raise FileNotFoundError(f"No CRD for KubeRay {version} at {path} (have: {', '.join(known) or 'none'})")
    crd = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # 9,000 lines
    return next(v for v in crd["spec"]["versions"] if v["name"] == served)["schema"]["openAPIV3Schema"]


def prune(obj: dict, schema: dict) -> list[str]:
    """Drop from `obj` (a whole resource, changed in place) what `schema` does not declare; the dropped paths."""
    pruned: list[str] = []
    _prune(obj, {**schema, EMBEDDED: True}, "", pruned)
    return pruned


def _prune(value, schema: dict | None, path: str, pruned: list[str]) -> None:
    if isinstance(value, list):
        for i, item in enumerate(value):
            _prune(item, (schema or {}).get("items"), f"{path}[{i}]", pruned)
        return
    if not isinstance(value, dict):
        return
    schema = schema or {}
    preserve = schema.get(PRESERVE) is True
    properties = schema.get("properties") or {}
    additional = schema.get("additionalProperties")
    for key in list(value):
        child = f"{path}.{key}" if path else key
        if schema.get(EMBEDDED) and key in META_FIELDS and isinstance(value[key], str | dict):
            if key == "metadata" and isinstance(value[key], dict):
                for field in [f for f in value[key] if f not in OBJECT_META]:
                    del value[key][field]
                    pruned.append(f"{child}.{field}")
            continue
        if key in properties:
            _prune(value[key], properties[key], child, pruned)
        elif isinstance(additional, dict):
            _prune(value[key], additional, child, pruned)
        elif additional is True or preserve:
            continue
        else:
            del value[key]
            pruned.append(child)


def default(value, schema: dict | None) -> None:
    """Fill absent keys that `schema` gives a `default`, in objects that are present (changed in place)."""
    if schema is None:
        return
    if isinstance(value, list):
        for item in value:
            default(item, schema.get("items"))
        return
    if not isinstance(value, dict):
        return
    for key, prop in (schema.get("properties") or {}).items():
        if "default" in prop and (key not in value or _null_not_allowed(value[key], prop)):
            value[key] = copy.deepcopy(prop["default"])
        if key in value:
            default(value[key], prop)
    additional = schema.get("additionalProperties")
    if isinstance(additional, dict):
        for key in value:
            if key not in (schema.get("properties") or {}):
                default(value[key], additional)


def _null_not_allowed(value, schema: dict | None) -> bool:
    return value is None and schema is not None and not schema.get("nullable")


def prune_nulls(value, schema: dict | None) -> None:
    """Drop the nulls `schema` neither allows nor defaults, from objects (changed in place)."""
    if isinstance(value, list):
        for item in value:
            prune_nulls(item, (schema or {}).get("items"))
        return
    if not isinstance(value, dict) or schema is None:
        return
    properties, additional = schema.get("properties") or {}, schema.get("additionalProperties")
    for key in list(value):
        sub = properties.get(key) if key in properties else additional if isinstance(additional, dict) else None
        if _null_not_allowed(value[key], sub) and "default" not in sub:
            del value[key]
        else:
            prune_nulls(value[key], sub)


def admit(obj: dict, schema: dict) -> list[str]:
    """What the API server does to a custom resource it is asked to store, before validating it: prune, drop the
    nulls the schema does not allow, then default. Returns its field-validation warnings
    (`unknown field "spec..."`), one per dropped field."""
    pruned = prune(obj, schema)
    prune_nulls(obj, schema)
    default(obj, schema)
    return [f'unknown field "{p}"' for p in pruned]


def merge_patch(old: dict, new: dict) -> dict:
    """The JSON merge patch (RFC 7386) that turns `old` into `new`: what changed, and None for each key removed."""
    diff: dict = {key: None for key in old if key not in new}
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(old.get(key), dict):
            if sub := merge_patch(old[key], value):
                diff[key] = sub
        elif key not in old or old[key] != value:
            diff[key] = value
    return diff
