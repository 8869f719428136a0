"""Request ids: accepted from X-Request-ID or created, returned, and stamped on every log line."""
import contextvars
import json
import logging
import re
import uuid

request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")
_VALID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def request_id_valid(value: str | None) -> bool:
    """Whether a caller's id is sane enough to keep and echo (never echo arbitrary text into logs)."""
    return bool(value) and _VALID.fullmatch(value) is not None


def new_or_given(value: str | None) -> str:
    """Keep a caller's id when it is sane, else make one."""
    return value if request_id_valid(value) else uuid.uuid4().hex


class RequestIdMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        rid = new_or_given(request.headers.get("X-Request-ID"))
        token = request_id_var.set(rid)
        request.request_id = rid
        try:
            response = self.get_response(request)
        finally:
            request_id_var.reset(token)
        response["X-Request-ID"] = rid
        return response


class RequestIdFilter(logging.Filter):
    def filter(self, record):
        record.request_id = request_id_var.get()
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record):
        payload = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", "-"),
        }
        if record.exc_info:
            payload["exc"] = self.formatException(record.exc_info)
        return json.dumps(payload)
