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


class QuotaExceeded(ActionError):
    code = "quota_exceeded"
