"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}` with the right HTTP status."""
import orjson

from deployments.redaction import internal_redact


class GatewayError(Exception):
    """A request the gateway answers itself, with a status and an OpenAI-shaped body."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: list[tuple[bytes, bytes]] | None = None, raw: bytes | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or []
        self.raw = raw  # an upstream error body that is already OpenAI-shaped, passed on as is

    def body(self) -> bytes:
        return self.raw or error_body(self.message, self.type, self.param, self.code)


def _retry_after_seconds(seconds: int) -> list[tuple[bytes, bytes]]:
    return [(b"retry-after", str(seconds).encode())]


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type, "param": param, "code": code}})


def bad_request(message: str, *, param: str | None = None, code: str = "invalid_value") -> GatewayError:
    return GatewayError(400, message, param=param, code=code)


def unauthorized(message: str = "Invalid API key. Pass `Authorization: Bearer tdm_...` with a live key.") -> GatewayError:
    return GatewayError(401, message, type="authentication_error", code="invalid_api_key")


def forbidden(model: str) -> GatewayError:
    return GatewayError(403, f"This API key may not call the model `{model}`.", type="permission_error",
                        param="model", code="model_not_allowed")


def model_not_found(model: str) -> GatewayError:
    return GatewayError(404, f"The model `{model}` does not exist in your team.", param="model",
                        code="model_not_found")


def rate_limited(what: str, retry_after: int) -> GatewayError:
    return GatewayError(429, f"Rate limit reached for {what} per minute on this API key. Retry after {retry_after}s.",
                        type="rate_limit_error", code="rate_limit_exceeded",
                        headers=_retry_after_seconds(retry_after))


def too_many_failures(retry_after: int) -> GatewayError:
    return GatewayError(429, "Too many failed authentications from your address. Check your API key, then retry "
                             f"after {retry_after}s.", type="rate_limit_error", code="too_many_auth_failures",
                        headers=_retry_after_seconds(retry_after))


def store_unavailable() -> GatewayError:
    """The control plane's database cannot confirm the key or route (fail closed), or it is away for a miss."""
    return GatewayError(503, "The gateway cannot reach its key store to confirm this request right now; try again "
                             "shortly.", type="service_unavailable", code="store_unavailable",
                        headers=[(b"retry-after", b"2")])


def too_large(limit: int) -> GatewayError:
    return GatewayError(413, f"The request body is larger than {limit} bytes.", code="request_too_large")


def bad_gateway(message: str, code: str = "upstream_error") -> GatewayError:
    return GatewayError(502, message, type="upstream_error", code=code)


def unavailable(message: str, code: str = "deployment_not_running", *, retry_after: int | None = None) -> GatewayError:
    return GatewayError(503, message, type="service_unavailable", code=code,
                        headers=_retry_after_seconds(retry_after) if retry_after else None)


def deployment_paused(model: str, deployment_id: int, *, waking_in: int | None) -> GatewayError:
    """A paused deployment's answer: how to resume it, or (a request that woke it) when to come back."""
    if waking_in is not None:
        return GatewayError(503, f"The deployment serving `{model}` was paused; this request is waking it. It is "
                                 f"expected to serve again in about {waking_in}s: retry after that.",
                            type="service_unavailable", code="deployment_paused",
                            headers=_retry_after_seconds(waking_in))
    return GatewayError(503, f"The deployment serving `{model}` is paused. A member of its team can resume it in the "
                             f"portal or with POST /api/v1/deployments/{deployment_id}/resume/.",
                        type="service_unavailable", code="deployment_paused")


def deployment_over_budget(model: str, deployment_id: int) -> GatewayError:
    """A paused deployment that would wake on request, of a team past its monthly budget: not woken."""
    return GatewayError(503, f"The deployment serving `{model}` is paused, and its team has spent its monthly budget: "
                             "a request does not wake it. A platform admin can resume it in the portal or with "
                             f"POST /api/v1/deployments/{deployment_id}/resume/.",
                        type="service_unavailable", code="deployment_over_budget")


def gateway_timeout(seconds: float) -> GatewayError:
    return GatewayError(504, f"The deployment did not answer within {seconds:g}s.", type="timeout",
                        code="upstream_timeout")


def first_byte_timeout(seconds: float) -> GatewayError:
    """A stream whose deployment sent nothing within the bound (TANDEM_GATEWAY_FIRST_BYTE_TIMEOUT_S), twice."""
    return GatewayError(504, f"The deployment did not start its answer within {seconds:g}s.", type="timeout",
                        code="first_byte_timeout")


def upstream_error_event(message: str, code: str) -> bytes:
    """What a client gets when upstream breaks mid-stream: an SSE error event, then `[DONE]`."""
    return b"data: " + error_body(message, "upstream_error", None, code) + b"\n\ndata: [DONE]\n\n"


def _retry_after(value: str | None) -> list[tuple[bytes, bytes]]:
    """Upstream's Retry-After, passed on when it is a plain number of seconds (anything else is dropped)."""
    value = (value or "").strip()
    return [(b"retry-after", value.encode())] if value.isdigit() and len(value) <= 6 else []


def from_upstream(status: int, payload: bytes, retry_after: str | None = None) -> GatewayError:
    """An upstream error answer: the client's own mistakes keep their status, the rest become 502/503/504.

    401/403/404 from upstream mean the gateway and the deployment disagree (token, model name), not that the
    client erred, so they are 502s as well. A 429's or 503's Retry-After (seconds) is passed on: the OpenAI
    SDKs wait that long before their retry.
    """
    message, raw = "", None
    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError:
        data = None
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and "message" in err:
            message, raw = str(err["message"]), payload
        else:
            message = str(data.get("detail") or data.get("message") or "")
    if not message:
        message = payload[:200].decode(errors="replace").strip()
    if status in (400, 413, 422, 429):
        return GatewayError(400 if status == 422 else status, message or "The deployment refused the request.",
                            type="rate_limit_error" if status == 429 else "invalid_request_error", raw=raw,
                            headers=_retry_after(retry_after) if status == 429 else None)
    # Server-side failures can quote internal addresses (an engine's proxy, a Ray node): not for key holders.
    message = internal_redact(message)
    if status in (503, 504):
        return GatewayError(status, f"The deployment is unavailable ({status}): {message}"[:500],
                            type="service_unavailable" if status == 503 else "timeout", code="upstream_unavailable",
                            headers=_retry_after(retry_after) if status == 503 else None)
    return bad_gateway(f"The deployment answered {status}: {message}"[:500])
