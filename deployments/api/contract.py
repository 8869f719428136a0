"""The API's contract in one place: the error body every 4xx carries, and which error statuses each operation can
answer, added to every operation of the OpenAPI schema by a drf-spectacular postprocessing hook (no per-view
boilerplate). A client generated from /api/schema/ therefore knows every status it can get."""

ERROR_SCHEMA = {
    "type": "object",
    "description": "Every API error: `detail` says what went wrong; `errors` names each field at fault; `code` is "
                   "stable for errors a client handles (e.g. `quota_exceeded`, `stale`).",
    "properties": {
        "detail": {"type": "string"},
        "code": {"type": "string"},
        "errors": {"type": "object", "additionalProperties": {}},
    },
    "required": ["detail"],
}

# Why each error status happens; which operations can answer it is decided in `_error_statuses`.
ERROR_MEANINGS = {
    "400": "The request is not valid (body, query or a rule of the service); `errors` names the fields.",
    "401": "No credential, or an invalid, expired or revoked access token.",
    "403": "Signed in, but not allowed to do this (role, team or platform admin).",
    "404": "No such object, or one you may not see (both answer the same).",
    "409": "The object changed since you read it, or the action does not apply in its current state.",
    "415": "The body is not JSON (`Content-Type: application/json`).",
    "429": "Too many requests: wait for `Retry-After` seconds.",
}
WRITES = {"post", "put", "patch", "delete"}


def _error_statuses(method: str, operation: dict) -> list[str]:
    codes = ["401", "403", "429"]
    params = operation.get("parameters", [])
    if "requestBody" in operation or method in WRITES or params:  # a value it cannot read or store
        codes.append("400")
    if any(p["in"] == "path" or p["name"] == "deployment" for p in params):  # names an object you may not see
        codes.append("404")
    if method in WRITES:
        codes.append("409")
    if "requestBody" in operation:
        codes.append("415")
    return codes


def _links(paths: dict) -> None:
    """OpenAPI links from each create (POST /x/ → 201) to the operations on what it made (/x/{key}/...), the key
    read from the created body: clients and schemathesis's stateful phase follow them."""
    for path, item in paths.items():
        created = item.get("post", {}).get("responses", {}).get("201")
        if created is None:
            continue
        for other, other_item in paths.items():
            rest = other[len(path):]
            if not (other.startswith(path) and rest.startswith("{")):
                continue
            key = rest[1:rest.index("}")]
            for method, operation in other_item.items():
                created.setdefault("links", {})[operation["operationId"]] = {
                    "operationId": operation["operationId"], "parameters": {key: f"$response.body#/{key}"}}


def error_responses_hook(result, generator, request, public):
    """drf-spectacular postprocessing hook: the Error component, and each operation's error statuses with it."""
    result.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR_SCHEMA
    ref = {"$ref": "#/components/schemas/Error"}
    retry_after = {"Retry-After": {"schema": {"type": "integer"}, "description": "Seconds to wait."}}
    for path_item in result.get("paths", {}).values():
        for method, operation in path_item.items():
            for param in operation.get("parameters", []):
                if param["in"] == "query" and param.get("schema", {}).get("type") == "string":
                    param["schema"].setdefault("minLength", 1)  # an empty value is refused (api/query.py)
            responses = operation.setdefault("responses", {})
            # An error is rendered as the success would be: JSON, or text where the client asked for text (CSV).
            content = {"application/json": {"schema": ref}}
            for ok in (r for code, r in responses.items() if code.startswith("2")):
                for media_type in ok.get("content", {}):
                    if "json" not in media_type:
                        content[media_type] = {"schema": {"type": "string"}}
            for code in _error_statuses(method, operation):
                response = {"description": ERROR_MEANINGS[code], "content": content}
                if code == "429":
                    response["headers"] = retry_after
                responses.setdefault(code, response)
    _links(result.get("paths", {}))
    return result
