"""The request-shaped spec as OpenAPI schema components, generated from the spec's dataclasses (deployments.spec)
so the contract and the parser cannot drift: every field with its type, bounds, fixed set, default, and whether
changing it needs an approver (`x-needs-approval`, from deployments.spec_diff), and no key the spec does not have
at any level (`additionalProperties: false`, as spec_parse refuses them).

OpenAPI 3.0's dialect, as the rest of /api/schema/: `nullable` rather than a "null" type.
"""
import typing
from dataclasses import MISSING, Field, is_dataclass

from deployments.spec import DeploymentSpec, request_fields, request_section
from deployments.spec_diff import Approval, field_approval

TYPES = {int: "integer", float: "number", str: "string", bool: "boolean"}
APPROVAL_TEXT = {
    Approval.ALWAYS: "Changing it on a running deployment needs an approver.",
    Approval.NEVER: "Changing it on a running deployment needs no approver.",
    Approval.OUTSIDE_APPROVED_RANGE: "Changing it on a running deployment needs an approver only when the new value "
                                     "lies outside the approved replicas_min..replicas_max.",
}


def _ref(cls) -> dict:
    return {"$ref": f"#/components/schemas/{cls.__name__}"}


def _value_schema(hint) -> dict:
    """The schema of a field's own type (a section: a reference to its component)."""
    if is_dataclass(hint):
        return {"allOf": [_ref(hint)]}  # OpenAPI 3.0 ignores siblings of a bare $ref (description, nullable)
    if typing.get_origin(hint) is tuple:  # tuple[int, ...]: a list of them
        return {"type": "array", "items": {"type": TYPES[typing.get_args(hint)[0]]}}
    return {"type": TYPES[hint]}


def _field_schema(cls, f: Field, stored_path: str) -> dict:
    """One property: type, nullable, fixed set, bounds, lengths, default, and (a value, not a section) when
    changing it needs an approver, said in `x-needs-approval` and in words."""
    hint = typing.get_type_hints(cls)[f.name]
    args = typing.get_args(hint) if typing.get_origin(hint) is not tuple else ()  # a tuple's are its items
    nullable = type(None) in args or f.default_factory is not MISSING  # a section: null is its defaults
    inner = next((t for t in args if t is not type(None)), hint)
    schema = _value_schema(inner)
    about = f.metadata
    if about["choices"]:
        schema["enum"] = list(about["choices"]) + ([None] if type(None) in args else [])
    if about["bounds"]:
        bounded = schema["items"] if schema.get("type") == "array" else schema
        bounded["minimum"], bounded["maximum"] = about["bounds"]
    if about["length"]:  # of a string: characters; of a list: items
        low, high = about["length"]
        unit = "Items" if schema.get("type") == "array" else "Length"
        schema[f"min{unit}"] = low
        if high is not None:
            schema[f"max{unit}"] = high
    if (nested := about["or_object"]) is not None:  # the runtime: its key, or the object that names it
        schema = {"oneOf": [schema, _ref(nested)]}
    if nullable:
        schema["nullable"] = True
    default = f.default if f.default is not MISSING else about["request_default"]
    if default is not MISSING:
        schema["default"] = list(default) if isinstance(default, tuple) else default
    description = about["doc"] + (f" Default: {about['default_text']}." if about["default_text"] else "")
    if not is_dataclass(inner):
        approval = field_approval(about["stored"] or stored_path)
        schema["x-needs-approval"] = approval.value
        description += " " + APPROVAL_TEXT[approval]
    schema["description"] = description
    return schema


def _required(f: Field) -> bool:
    """A request must give it: it has no default, not even one that follows from another field."""
    about = f.metadata
    return (f.default is MISSING and f.default_factory is MISSING and about["request_default"] is MISSING
            and not about["default_text"])


def _component(cls, stored_prefix: str) -> dict:
    """An object of the request shape: its properties, those it requires, and no other key."""
    properties, required = {}, []
    for key, entry in request_fields(cls).items():
        if isinstance(entry, type):  # a request object over fields stored flat (`model`)
            properties[key] = {"allOf": [_ref(entry)], "description": (entry.__doc__ or "").strip()}
            required.append(key)
            continue
        path = f"{stored_prefix}{entry.name}"
        properties[key] = _field_schema(cls, entry, path)
        if _required(entry):
            required.append(key)
    schema = {"type": "object", "description": (cls.__doc__ or "").strip(), "properties": properties,
              "additionalProperties": False}
    if required:
        schema["required"] = required
    return schema


def spec_schema_components() -> dict[str, dict]:
    """Every object of the request-shaped spec as a schema component by name; `DeploymentSpec` is the spec."""
    found: dict[str, dict] = {}

    def walk(cls, stored_prefix: str):
        found[cls.__name__] = _component(cls, stored_prefix)
        for key, entry in request_fields(cls).items():
            inner = request_section(cls, entry)
            if inner is not None and inner.__name__ not in found:
                # A section's fields are stored under its name; the request objects' (model, runtime) flat.
                walk(inner, "" if isinstance(entry, type) or entry.metadata["or_object"] else f"{key}.")

    walk(DeploymentSpec, "")
    return found
