"""A manifest's spec checked against the spec's schema as the server serves it (GET /api/schema/), for
`tandemctl validate`: the server's schema is the one source, so this module knows no field of the spec.

tandemctl installs with httpx and PyYAML only, so this is a small validator of the part of OpenAPI 3.0 that
schema uses (types, nullable, enum, bounds, lengths, arrays with their items, required, properties,
additionalProperties: false, oneOf, allOf and $ref), not a general one. A key the spec does not have is named as
the server names it."""
import difflib

from tandemctl.errors import SCHEMA_DRIFT, CliError

CREATE = ("/api/v1/deployments/", "post")
TYPES = {"integer": "a whole number", "number": "a number", "string": "a string", "boolean": "true or false",
         "object": "an object", "array": "a list"}


def _is(value, kind: str) -> bool:
    if kind in ("integer", "number", "boolean") and isinstance(value, bool):
        return kind == "boolean"
    return isinstance(value, {"integer": int, "number": (int, float), "string": str, "boolean": bool,
                              "object": dict, "array": list}[kind])


class SpecSchema:
    """The `spec` that POST /api/v1/deployments/ takes, in a served OpenAPI document."""

    def __init__(self, document: dict):
        self.schemas = document.get("components", {}).get("schemas", {})
        operation = document.get("paths", {}).get(CREATE[0], {}).get(CREATE[1], {})
        body = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
        self.root = self.resolve(self.resolve(body).get("properties", {}).get("spec", {}))
        if self.root.get("type") != "object":
            raise CliError("The server's schema does not describe the spec (it takes any object): this tandemctl "
                           "and the server disagree on the API; use the tandemctl of the server's version.",
                           SCHEMA_DRIFT)
        self.objects = dict(self._objects(self.root, "spec"))

    def resolve(self, node: dict) -> dict:
        """The node with its $ref and allOf references followed (its own keys kept: description, nullable)."""
        while "$ref" in node:
            node = {**self.schemas[node["$ref"].rsplit("/", 1)[1]], **{k: v for k, v in node.items() if k != "$ref"}}
        for branch in node.get("allOf", []):
            node = {**self.resolve(branch), **{k: v for k, v in node.items() if k != "allOf"}}
        return node

    def _objects(self, node: dict, path: str):
        """(path, property names) of every object in the spec, for saying where a misplaced key belongs."""
        if node.get("type") == "object":
            yield path, list(node.get("properties", {}))
            for key, inner in node.get("properties", {}).items():
                yield from self._objects(self.resolve(inner), f"{path}.{key}")
        for branch in node.get("oneOf", []):
            yield from self._objects(self.resolve(branch), path)

    def unknown(self, key: str, path: str) -> str:
        """Why `key` is not a field at `path`: where it belongs, else the field it is closest to."""
        homes = [where for where, keys in self.objects.items() if where != path and key in keys]
        if homes:
            return f"unknown field; it belongs under {' or '.join(homes)}"
        close = difflib.get_close_matches(key, self.objects.get(path, []), n=1)
        return f"unknown field; did you mean {close[0]}?" if close else "unknown field"

    def problems(self, value, node: dict | None = None, path: str = "spec") -> list[str]:
        """`path: why` for each place `value` breaks the schema (empty: it is valid)."""
        node = self.resolve(self.root if node is None else node)
        if value is None:
            return [] if node.get("nullable") else [f"{path}: must not be null"]
        if "oneOf" in node:
            found = [self.problems(value, branch, path) for branch in node["oneOf"]]
            if any(not f for f in found):
                return []
            kinds = [self.resolve(b).get("type") for b in node["oneOf"]]
            return next((f for f, kind in zip(found, kinds) if kind and _is(value, kind)), found[0])
        kind = node.get("type")
        if kind and not _is(value, kind):
            return [f"{path}: must be {TYPES[kind]}, got {value!r}"]
        if "enum" in node and value not in node["enum"]:
            return [f"{path}: must be one of {', '.join(str(c) for c in node['enum'] if c is not None)}; "
                    f"got {value!r}"]
        if "minimum" in node and value < node["minimum"] or "maximum" in node and value > node["maximum"]:
            return [f"{path}: must be between {node.get('minimum')} and {node.get('maximum')}, got {value}"]
        if isinstance(value, str) and not node.get("minLength", 0) <= len(value) <= node.get("maxLength", len(value)):
            return [f"{path}: must be {node.get('minLength', 0)} to {node.get('maxLength', 'any')} characters long"]
        if kind == "array":
            if not node.get("minItems", 0) <= len(value) <= node.get("maxItems", len(value)):
                return [f"{path}: must hold {node.get('minItems', 0)} to {node.get('maxItems', 'any')} items, "
                        f"got {len(value)}"]
            return [p for i, item in enumerate(value) for p in self.problems(item, node.get("items", {}),
                                                                              f"{path}[{i}]")]
        if kind != "object":
            return []
        properties, found = node.get("properties", {}), []
        found += [f"{path}.{key}: this field is required" for key in node.get("required", []) if key not in value]
        for key, inner in value.items():
            if key in properties:
                found += self.problems(inner, properties[key], f"{path}.{key}")
            elif node.get("additionalProperties") is False:
                found.append(f"{path}.{key}: {self.unknown(key, path)}")
        return found
