"""A client's request: its head, read once from the ASGI scope, and its body, read and checked before anything is
sent upstream (400 and 413 come from here)."""
import itertools
import secrets
from dataclasses import dataclass

import orjson

from controlplane.request_id import request_id_valid
from gateway.errors import bad_request, too_large

# The gateway's own request ids, the key of every record: 32 hex digits, a random per-process prefix and a count
# (unique across replicas without a uuid4 per request). A client's X-Request-ID is kept beside it, never as it.
_ID_PREFIX = secrets.token_hex(10)
_ID_COUNT = itertools.count()


def new_request_id() -> str:
    return f"{_ID_PREFIX}{next(_ID_COUNT):012x}"


@dataclass(frozen=True, slots=True)
class RequestHead:
    """What the gateway knows of a request before its body arrives, passed down the request path whole."""

    endpoint: str  # the OpenAI endpoint ("chat.completions", "completions", "embeddings"), or "" for other paths
    request_id: str  # the gateway's own: the record's key, sent upstream
    client_id: str  # the client's X-Request-ID when sane, else "": kept beside the record's, echoed back
    authorization: bytes | None
    content_length: int | None
    client: tuple | None  # the ASGI scope's (host, port): failed authentications are counted against it
    connection: object | None  # gateway.server's hook that says when the client left, where the server offers it

    @property
    def echo_id(self) -> bytes:
        """The X-Request-ID of the answer: the client's own when it sent a sane one."""
        return (self.client_id or self.request_id).encode()

    @classmethod
    def from_scope(cls, scope, endpoint: str) -> "RequestHead":
        authorization = given_id = content_length = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value
            elif name == b"x-request-id":
                given_id = value
            elif name == b"content-length":
                content_length = int(value) if value.isdigit() and len(value) < 19 else None
        client_id = given_id.decode("latin-1") if given_id else ""
        if client_id and not request_id_valid(client_id):
            client_id = ""  # never echo (or log) arbitrary text
        extensions = scope.get("extensions")
        return cls(endpoint=endpoint, request_id=new_request_id(), client_id=client_id, authorization=authorization,
                   content_length=content_length, client=scope.get("client"),
                   connection=extensions.get("tandem.connection") if extensions else None)


class ClientGone(Exception):
    """The client disconnected before its request body arrived."""


async def read_body(receive, content_length: int | None, limit: int) -> bytes:
    if content_length is not None and content_length > limit:
        raise too_large(limit)
    message = await receive()
    if message["type"] == "http.disconnect":
        raise ClientGone
    body = message.get("body", b"")
    if not message.get("more_body"):  # the usual case: one message holds the whole body
        if len(body) > limit:
            raise too_large(limit)
        return body
    parts, size = [body], len(body)
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        body = message.get("body", b"")
        size += len(body)
        if size > limit:
            raise too_large(limit)
        parts.append(body)
        if not message.get("more_body"):
            return b"".join(parts)


def _positive_int(data: dict, name: str) -> int | None:
    value = data.get(name)
    if value is not None and (type(value) is not int or value < 1):
        raise bad_request(f"`{name}` must be a positive integer.", param=name)
    return value


def parse_request(body: bytes, endpoint: str) -> dict:
    """The request as a dict, after the checks the gateway can make without knowing the deployment."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise bad_request("The request body is not valid JSON.", code="invalid_json") from None
    if type(data) is not dict:
        raise bad_request("The request body must be a JSON object.", code="invalid_json")
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("`model` is required: the name of a deployment of your team.", param="model",
                          code="missing_required_parameter")
    stream = data.get("stream")
    if stream is not None and type(stream) is not bool:
        raise bad_request("`stream` must be true or false.", param="stream")
    options = data.get("stream_options")
    if options is not None:
        if not stream:
            raise bad_request("`stream_options` is only allowed when `stream` is true.", param="stream_options")
        if type(options) is not dict:
            raise bad_request("`stream_options` must be an object.", param="stream_options")
    _positive_int(data, "max_tokens")
    _positive_int(data, "max_completion_tokens")
    _positive_int(data, "n")
    if endpoint == "chat.completions":
        messages = data.get("messages")
        if type(messages) is not list or not messages:
            raise bad_request("`messages` must be a non-empty list.", param="messages",
                              code="missing_required_parameter")
    elif endpoint == "completions":
        if data.get("prompt") is None:
            raise bad_request("`prompt` is required.", param="prompt", code="missing_required_parameter")
    elif endpoint == "embeddings":
        if data.get("input") is None:
            raise bad_request("`input` is required.", param="input", code="missing_required_parameter")
        if stream:
            raise bad_request("Embeddings cannot be streamed.", param="stream")
    return data


def check_against_deployment(data: dict, route) -> None:
    """Parameters that depend on the deployment: the output budget cannot exceed its context length."""
    limit = route.max_model_len
    if not limit:
        return
    for name in ("max_completion_tokens", "max_tokens"):
        value = data.get(name)
        if value is not None and value > limit:
            raise bad_request(f"`{name}` is {value}, above this deployment's context length of {limit} tokens.",
                              param=name)


# Fields of a request body that vLLM and Ray Serve LLM's prefill/decode orchestrator take as their own
# (vllm/entrypoints/openai/*/protocol.py, ray/llm/_internal/serve/engines/vllm/kv_transfer/, vllm 0.32, ray 2.60):
# `kv_transfer_params` says where the KV cache comes from or goes to (remote host, port, engine, blocks),
# `ec_transfer_params` the same for the encoder cache, and `request_id` names the request inside both engines (a
# connector such as MoRIIO derives its peers' addresses from it). vLLM copies `vllm_xargs` into the same extra
# arguments the engine reads the first two (and `kv_cache_report_mode`) from. Only the orchestrator may set them.
ENGINE_FIELDS = ("kv_transfer_params", "ec_transfer_params", "request_id")
ENGINE_EXTRA_ARGS = ("kv_transfer_params", "ec_transfer_params", "kv_cache_report_mode")


def strip_engine_fields(data: dict) -> bool:
    """Remove from the request what only the serving stack may set; True when something was removed."""
    removed = [data.pop(name) for name in ENGINE_FIELDS if name in data]
    xargs = data.get("vllm_xargs")
    if type(xargs) is dict:
        removed += [xargs.pop(name) for name in ENGINE_EXTRA_ARGS if name in xargs]
    return bool(removed)


def upstream_body(body: bytes, data: dict, *, stream: bool) -> tuple[bytes, bool]:
    """The bytes to send upstream and whether the client asked for the usage chunk itself.

    Fields only the serving stack may set are removed (`strip_engine_fields`). For a stream the gateway always
    asks for `include_usage` (that is how it bills); when the client did not, the body is re-encoded with it and
    the extra chunk is dropped on the way back. A body the gateway changes nothing in is sent as it came.
    """
    changed = strip_engine_fields(data)
    keep_usage_chunk = True
    if stream:
        options = data.get("stream_options") or {}
        if options.get("include_usage") is not True:
            data["stream_options"] = {**options, "include_usage": True}
            changed, keep_usage_chunk = True, False
    if not changed:
        return body, keep_usage_chunk
    try:
        return orjson.dumps(data), keep_usage_chunk
    except orjson.JSONEncodeError:  # orjson writes 255 levels of nesting, though it reads 1,024
        raise bad_request("The request body nests too deeply.", code="invalid_json") from None
