"""Validation of a custom resource by its CRD's `openAPIV3Schema`, as kube-apiserver does it, in the API server's words.

What kube-apiserver runs on every create, update and patch of a custom resource, after pruning and defaulting
(tests.support.structural_pruning), and how it answers (apiextensions-apiserver `pkg/registry/customresource/
strategy.go`, `pkg/apiserver/validation/validation.go`, `pkg/apiserver/schema/listtype/validation.go`,
`pkg/apiserver/schema/cel/validation.go`):

1. the OpenAPI schema (kube-openapi `pkg/validation/validate`): type (with `nullable`, and
   `x-kubernetes-int-or-string` as type integer,string), format (date-time), anyOf/allOf/oneOf/not, pattern,
   minLength/maxLength, minimum/maximum (exclusive too), multipleOf, minItems/maxItems, uniqueItems, enum,
   required, minProperties/maxProperties, recursively through properties, additionalProperties and items;
2. `x-kubernetes-list-type` set and map: no two items alike (by their `x-kubernetes-list-map-keys`);
3. `x-kubernetes-validations` (CEL, with cel-python), unless 1 or 2 found a type, required, enum or size error
   ("some validation rules were not checked ..."); a rule with `oldSelf` only where there is an old value.

Each failure is a `field.Error` of k8s.io/apimachinery (`pkg/util/validation/field/errors.go`): its type
(`FieldValueInvalid`, `FieldValueRequired`, ...), its field path (`spec.a.b[0].c`) and its body (`Invalid value:
"string": spec.a in body must be of type integer: "string"`), translated from kube-openapi's errors as
`kubeOpenAPIResultToFieldErrors` does; the whole answer is `errors.NewInvalid`'s 422 Status (`invalid_status`).

jsonschema (Draft 4, which OpenAPI 3.0's schema object extends) walks the object and applies the standard keywords,
the same semantics kube-openapi implements; only what Kubernetes adds is here: `nullable`, int-or-string, Go's
acceptance of 2.0 as an integer, the date-time format, list types, CEL (cel-python, as tests/deploy/test_admission.py
evaluates Tandem's admission policy), and the API server's wording. Not openapi-schema-validator: it would add only
`nullable` and OpenAPI's formats, both of which Kubernetes treats its own way, and is here only as moto's dependency;
not kubernetes-validate: it knows the built-in kinds, not a CRD's schema; and no library words its errors as the API
server does, which is what a user reads. Left out:
ObjectMeta's own rules (names, labels), `x-kubernetes-embedded-resource` checks (KubeRay's CRDs have none), CEL's
cost budget and Kubernetes' CEL library functions (KubeRay's rules use neither), and validation ratcheting (an
update that leaves an invalid field as it was is answered with a warning on Kubernetes ≥ 1.30).
"""
import json
import re
from dataclasses import dataclass

import celpy
import jsonschema
from jsonschema import Draft4Validator, ValidationError

CEL = celpy.Environment()
BLOCKING = {"FieldValueNotSupported", "FieldValueRequired", "FieldValueTooLong", "FieldValueTooMany",
            "FieldValueTypeInvalid"}  # strategy.go hasBlockingErr: CEL is not run over these
RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")
NOT_CHECKED = ("some validation rules were not checked because the object was invalid; correct the existing errors "
               "to complete validation")


@dataclass(frozen=True)
class FieldError:
    """One `field.Error`: what `Error()` prints is `<field>: <body>`; a Status cause carries the three apart."""

    type: str
    field: str
    body: str

    def __str__(self) -> str:
        return f"{self.field}: {self.body}"


def validate(obj: dict, schema: dict, *, old: dict | None = None) -> list[FieldError]:
    """What kube-apiserver finds wrong with `obj` (admitted: pruned and defaulted) against a CRD version's
    `openAPIV3Schema`; `old` is the stored object an update replaces (for CEL transition rules). [] when valid."""
    found = sorted(((error, e) for error in _VALIDATOR(schema).iter_errors(obj) for e in _field_errors(error)),
                   key=_order)
    errors = [e for _, e in found] + _list_types(obj, schema, "")
    if not _has_rules(schema):
        return errors  # no CEL validator at all (cel.NewValidator is nil), so nothing is said of one
    if any(e.type in BLOCKING for e in errors):
        return errors + [FieldError("FieldValueInvalid", "<nil>", f"Invalid value: null: {NOT_CHECKED}")]
    return errors + _cel(obj, schema, "", old)


def _has_rules(schema: dict) -> bool:
    """Whether any `x-kubernetes-validations` is in the schema (cel.NewValidator's hasXValidations)."""
    if not isinstance(schema, dict):
        return False
    return bool(schema.get("x-kubernetes-validations")) or any(
        _has_rules(sub) for sub in [schema.get("items"), schema.get("additionalProperties"),
                                    *(schema.get("properties") or {}).values()])


def invalid_status(*, kind: str, group: str, name: str, errors: list[FieldError]) -> dict:
    """The 422 answer (apimachinery `errors.NewInvalid`): `<Kind>.<group> "<name>" is invalid: <errors>`, the errors
    joined as an aggregate prints them (one alone, several in brackets, each once)."""
    messages = list(dict.fromkeys(str(e) for e in errors))
    joined = messages[0] if len(messages) == 1 else f"[{', '.join(messages)}]"
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": f'{kind}.{group} "{name}" is invalid: {joined}', "reason": "Invalid",
            "details": {"name": name, "group": group, "kind": kind,
                        "causes": [{"reason": e.type, "message": e.body, "field": e.field} for e in errors]},
            "code": 422}


# --- values printed as Go prints them -------------------------------------------------------------------------
def _quote(text: str) -> str:
    """Go's %q for the strings a manifest holds."""
    return json.dumps(text, ensure_ascii=False)


def _go_json(value) -> str:
    """Go's json.Marshal: sorted keys, no spaces, HTML characters escaped."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _number(value) -> str:
    """Go's %v of a JSON number (an integral float64 prints without a decimal point)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return str(int(value))
    return str(value)


def _value(value) -> str:
    """How `field.Error.ErrorBody` prints a bad value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return _number(value)
    if isinstance(value, str):
        return _quote(value)
    return _go_json(value)


def _json_type(value) -> str:
    """The JSON type kube-openapi names for a decoded value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return {str: "string", list: "array", dict: "object"}[type(value)]


def _path(parts) -> str:
    """kube-openapi's path of a value: properties joined with dots, array items as [i] (`spec.a[0].b`)."""
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def _invalid(path: str, value, detail: str) -> FieldError:
    return FieldError("FieldValueInvalid", path, f"Invalid value: {_value(value)}: {detail}")


def _type_invalid(path: str, value, detail: str) -> FieldError:
    return FieldError("FieldValueTypeInvalid", path, f"Invalid value: {_value(value)}: {detail}")


# --- the OpenAPI schema: jsonschema with Kubernetes' extensions ---------------------------------------------------
def _is_integer(checker, instance) -> bool:
    """kube-openapi's isFloatInt: a JSON number with no fraction is an integer."""
    return (isinstance(instance, int) and not isinstance(instance, bool)) or \
        (isinstance(instance, float) and instance.is_integer())


def _type_error(types: list[str], instance) -> ValidationError:
    error = ValidationError(f"must be of type {','.join(types)}")
    error.k8s_types = types
    return error


def _type(validator, types, instance, schema):
    """`type`, where `nullable: true` lets null through (kube-openapi typeValidator)."""
    types = [types] if isinstance(types, str) else list(types)
    if instance is None and schema.get("nullable"):
        return
    if not any(validator.is_type(instance, t) for t in types):
        yield _type_error(types, instance)


def _int_or_string(validator, enabled, instance, schema):
    """`x-kubernetes-int-or-string: true` is type [integer, string] (apiextensions ConvertJSONSchemaProps)."""
    if enabled and "type" not in schema and not (instance is None and schema.get("nullable")) and \
            not (validator.is_type(instance, "integer") or validator.is_type(instance, "string")):
        yield _type_error(["integer", "string"], instance)


def _required(validator, required, instance, schema):
    """One error per missing property, naming it (jsonschema's own says it only in prose)."""
    if not validator.is_type(instance, "object"):
        return
    for name in required:
        if name not in instance:
            error = ValidationError(f"{name!r} is a required property")
            error.k8s_missing = name
            yield error


def _format(validator, fmt, instance, schema):
    """The one format KubeRay's CRDs put on strings, date-time; int32/int64 only name an integer's width, which
    kube-openapi does not check."""
    if fmt == "date-time" and isinstance(instance, str) and not RFC3339.match(instance):
        yield ValidationError(f"{instance!r} is not a date-time")


_VALIDATOR = jsonschema.validators.extend(
    Draft4Validator,
    validators={"type": _type, "x-kubernetes-int-or-string": _int_or_string, "required": _required,
                "format": _format},
    type_checker=Draft4Validator.TYPE_CHECKER.redefine("integer", _is_integer),
)


# kube-openapi's SchemaValidator runs its validators in this order on each value (validate/schema.go); across the
# properties of an object its order is Go's map order, i.e. none: here, the order of the paths.
RANK = {k: rank for rank, keys in enumerate([
    ("type", "x-kubernetes-int-or-string"), ("anyOf", "allOf", "oneOf", "not"), ("maxLength", "minLength", "pattern"),
    ("format",), ("multipleOf", "maximum", "minimum"), ("minItems", "maxItems", "uniqueItems"), ("enum",),
    ("required", "minProperties", "maxProperties")]) for k in keys}


def _order(found: tuple[ValidationError, "FieldError"]):
    """By the path the error names (a composite's: the value's), then by kube-openapi's validator order."""
    error, field_error = found
    parts = [*error.absolute_path] + ([error.k8s_missing] if hasattr(error, "k8s_missing") else [])
    return [(0, p) if isinstance(p, int) else (1, p) for p in parts], RANK.get(error.validator, 8)


def _field_errors(error: ValidationError) -> list[FieldError]:
    """A jsonschema error as the API server's field errors (kube-openapi's message, translated as
    `kubeOpenAPIResultToFieldErrors` translates it)."""
    path, keyword, value, instance = _path(error.absolute_path), error.validator, error.validator_value, error.instance
    where = f"{path} in body"
    if hasattr(error, "k8s_types"):
        found = _json_type(instance)
        return [_type_invalid(path, found, f"{where} must be of type {','.join(error.k8s_types)}: {_quote(found)}")]
    if hasattr(error, "k8s_missing"):
        return [FieldError("FieldValueRequired", _path([*error.absolute_path, error.k8s_missing]), "Required value")]
    if keyword == "format":
        return [_type_invalid(path, instance, f"{where} must be of type {value}: {_quote(instance)}")]
    if keyword == "enum":
        allowed = ", ".join(_quote(v) if isinstance(v, str) else _quote(_go_json(v)) for v in value)
        return [FieldError("FieldValueNotSupported", path,
                           f"Unsupported value: {_value(instance)}: supported values: {allowed}")]
    if keyword == "maxLength":
        return [FieldError("FieldValueTooLong", path, f"Too long: may not be more than {value} bytes")]
    if keyword == "maxItems":
        return [FieldError("FieldValueTooMany", path,
                           f"Too many: {len(instance)}: must have at most {value} item{'' if value == 1 else 's'}")]
    if keyword == "maxProperties":
        return [FieldError("FieldValueTooMany", path,
                           f"Too many: {len(instance)}: must have at most {value} item{'' if value == 1 else 's'}")]
    if keyword in ("anyOf", "oneOf", "allOf", "not"):
        return _composite(error, path)
    detail = {
        "pattern": lambda: f"should match '{value}'",
        "minLength": lambda: f"should be at least {value} chars long",
        "minItems": lambda: f"should have at least {value} items",
        "uniqueItems": lambda: "shouldn't contain duplicates",
        "minProperties": lambda: f"should have at least {value} properties",
        "multipleOf": lambda: f"should be a multiple of {_number(value)}",
        "minimum": lambda: f"should be greater than {'' if error.schema.get('exclusiveMinimum') else 'or equal to '}"
                           f"{_number(value)}",
        "maximum": lambda: f"should be less than {'' if error.schema.get('exclusiveMaximum') else 'or equal to '}"
                           f"{_number(value)}",
    }.get(keyword)
    if detail is None:  # a keyword KubeRay's CRDs do not use: jsonschema's own words
        return [_invalid(path, instance, f"{where} {error.message}")]
    bad = len(instance) if keyword in ("minItems", "minProperties") else instance
    return [_invalid(path, bad, f"{where} {detail()}")]


def _composite(error: ValidationError, path: str) -> list[FieldError]:
    """anyOf/oneOf/allOf/not: kube-openapi's composite message (not a field error: printed at path `<nil>`), then
    the errors of the alternative that came closest (the one with fewest errors, the first of equals)."""
    message = {"anyOf": f"{_quote(path)} must validate at least one schema (anyOf)",
               "oneOf": f"{_quote(path)} must validate one and only one schema (oneOf). Found none valid",
               "allOf": f"{_quote(path)} must validate all the schemas (allOf)",
               "not": f"{_quote(path)} must not validate the schema (not)"}[error.validator]
    found = [FieldError("FieldValueInvalid", "<nil>", f'Invalid value: "": {message}')]
    branches: dict[int, list[ValidationError]] = {}
    for sub in error.context or []:
        branches.setdefault(sub.relative_schema_path[0], []).append(sub)
    if branches:
        closest = min(branches.values(), key=len)
        found += [e for sub in closest for e in _field_errors(sub)]
    return found


# --- list types and CEL: walks of the object beside its schema ----------------------------------------------------
def _children(value, schema: dict, path: str):
    """(child, its schema, its path, its key) for each property, map entry and array item of `value`."""
    if isinstance(value, dict):
        properties, additional = schema.get("properties") or {}, schema.get("additionalProperties")
        for key, child in value.items():
            sub = properties.get(key) if key in properties else additional if isinstance(additional, dict) else None
            if sub is not None:
                yield child, sub, f"{path}.{key}" if path else key, key
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, child in enumerate(value):
            yield child, schema["items"], f"{path}[{i}]", None


def _list_types(value, schema: dict, path: str) -> list[FieldError]:
    """`x-kubernetes-list-type` set (items unique) and map (items unique by their list-map keys): a Duplicate value
    at each later occurrence (structurallisttype.ValidateListSetsAndMaps)."""
    errors = []
    if isinstance(value, list) and schema.get("x-kubernetes-list-type") in ("set", "map"):
        keys = schema.get("x-kubernetes-list-map-keys") or []
        seen = set()
        for i, item in enumerate(value):
            key = item if schema["x-kubernetes-list-type"] == "set" else \
                {k: item[k] for k in keys if isinstance(item, dict) and k in item}
            marker = _go_json(key)
            if marker in seen:
                errors.append(FieldError("FieldValueDuplicate", f"{path}[{i}]", f"Duplicate value: {_value(key)}"))
            seen.add(marker)
    for child, sub, child_path, _ in _children(value, schema, path):
        errors += _list_types(child, sub, child_path)
    return errors


def _cel(value, schema: dict, path: str, old) -> list[FieldError]:
    """`x-kubernetes-validations` rules on every value present: a rule that is not true is its message at its path
    (the value shown unless it is an object or array); `oldSelf` rules only where the old object has the value."""
    if value is None:
        return []
    errors = []
    for rule in schema.get("x-kubernetes-validations") or []:
        if "oldSelf" in rule["rule"] and old is None:
            continue  # a transition rule: only on an update of a value that was there
        activation = {"self": celpy.json_to_cel(value)}
        if old is not None:
            activation["oldSelf"] = celpy.json_to_cel(old)
        try:
            ok = CEL.program(CEL.compile(rule["rule"])).evaluate(activation)
        except celpy.CELEvalError as e:
            errors.append(_invalid(path, schema.get("type", ""), f"{e} evaluating rule: {rule['rule']}"))
            continue
        if ok is not True and not (isinstance(ok, celpy.celtypes.BoolType) and ok):
            message = rule.get("message") or f"failed rule: {rule['rule']}"
            shown = value if schema.get("type") not in ("object", "array") else None
            errors.append(FieldError("FieldValueInvalid", path,
                                     f"Invalid value: {_value(shown)}: {message}" if shown is not None
                                     else f"Invalid value: {message}"))
    for child, sub, child_path, key in _children(value, schema, path):
        # Old values line up by key (objects and maps) only: list items are not correlated here.
        errors += _cel(child, sub, child_path, old.get(key) if key is not None and isinstance(old, dict) else None)
    return errors
