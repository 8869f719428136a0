"""Domain errors a service raises; the API turns each into a 4xx with its message."""


class ActionError(Exception):
    status_code = 400
    code = "invalid"

    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.field = field


class NotAllowed(ActionError):
    status_code = 403
    code = "not_allowed"


class Conflict(ActionError):
    status_code = 409
    code = "conflict"


class StatusMoved(Conflict):
    """A status change made on a status that has changed since it was read (a reconcile pass's, after a pause)."""


class QuotaExceeded(ActionError):
    code = "quota_exceeded"


class RateLimited(ActionError):
    """Too many of an action too soon: 429, with Retry-After in seconds."""

    status_code = 429
    code = "rate_limited"

    def __init__(self, message: str, *, retry_after: int):
        super().__init__(message)
        self.retry_after = max(1, int(retry_after))
