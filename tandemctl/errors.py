"""Exit codes a pipeline can rely on (README, "tandemctl"), and the error that carries one."""

OK = 0
FAILED = 1  # the deployment failed, or the server answered an error of its own (5xx)
USAGE = 2  # bad arguments or a file that is not a Tandem manifest
AUTH = 3  # no token, a config file others can read, 401 or 403
INVALID = 4  # the API refused the content (400): the spec, a name, a field
PENDING_APPROVAL = 5  # applied, and waiting for an admin's approval
TIMED_OUT = 6  # `wait` ran out of time
NOT_FOUND = 7  # no such deployment, key or team (404)
CONFLICT = 8  # it changed since it was read, or the action does not apply now (409)
SCHEMA_DRIFT = 9  # the server's /api/schema/ lacks an operation this client uses
CHANGES = 10  # `diff`: applying would change something (kubectl diff's 1; here 1 means failed)

BY_STATUS = {400: INVALID, 401: AUTH, 403: AUTH, 404: NOT_FOUND, 409: CONFLICT, 415: USAGE}


class CliError(Exception):
    """Stops the command: `message` goes to stderr and the process exits with `code`."""

    def __init__(self, message: str, code: int = FAILED):
        super().__init__(message)
        self.message, self.code = message, code
