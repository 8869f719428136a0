"""A hand-thin client over the REST API. Every operation it calls is named in OPERATIONS by method and path
template as /api/schema/ writes them; before its first call it reads the server's schema and stops (exit 9) if
any is missing, so a schema change that breaks the CLI breaks it loudly (and tests/tandemctl fails the build)."""
import httpx

from tandemctl.errors import BY_STATUS, FAILED, SCHEMA_DRIFT, CliError

OPERATIONS = {
    "deployments.list": ("get", "/api/v1/deployments/"),
    "deployments.create": ("post", "/api/v1/deployments/"),
    "deployments.read": ("get", "/api/v1/deployments/{id}/"),
    "deployments.update": ("patch", "/api/v1/deployments/{id}/"),
    "deployments.preview_create": ("post", "/api/v1/deployments/preview/"),
    "deployments.preview_update": ("post", "/api/v1/deployments/{id}/preview/"),
    "deployments.delete": ("delete", "/api/v1/deployments/{id}/"),
    "deployments.approve": ("post", "/api/v1/deployments/{id}/approve/"),
    "deployments.reject": ("post", "/api/v1/deployments/{id}/reject/"),
    "deployments.pause": ("post", "/api/v1/deployments/{id}/pause/"),
    "deployments.resume": ("post", "/api/v1/deployments/{id}/resume/"),
    "deployments.events": ("get", "/api/v1/deployments/{id}/events/"),
    "rollouts.list": ("get", "/api/v1/deployments/{id}/rollouts/"),
    "rollouts.pause": ("post", "/api/v1/deployments/{id}/rollouts/{rollout_id}/pause/"),
    "rollouts.resume": ("post", "/api/v1/deployments/{id}/rollouts/{rollout_id}/resume/"),
    "rollouts.abort": ("post", "/api/v1/deployments/{id}/rollouts/{rollout_id}/abort/"),
    "keys.list": ("get", "/api/v1/api-keys/"),
    "keys.create": ("post", "/api/v1/api-keys/"),
    "keys.revoke": ("delete", "/api/v1/api-keys/{id}/"),
    "keys.transfer": ("post", "/api/v1/api-keys/{id}/transfer/"),
    "plans.create": ("post", "/api/v1/plans/"),
    "clusters.read": ("get", "/api/v1/clusters/{name}/"),
    "clusters.update": ("patch", "/api/v1/clusters/{name}/"),
    "clusters.check": ("post", "/api/v1/clusters/{name}/check/"),
    "clusters.check_read": ("get", "/api/v1/clusters/{name}/check/"),
}
SCHEMA_PATH = "/api/schema/?format=json"


def operations_missing(schema: dict) -> list[str]:
    """The operations of OPERATIONS that `schema` (an OpenAPI document) does not have."""
    paths = schema.get("paths", {})
    return [f"{m.upper()} {p}" for m, p in OPERATIONS.values() if m not in paths.get(p, {})]


def _error_message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return f"HTTP {response.status_code}: {response.text[:300]}"
    if not isinstance(body, dict):
        return f"HTTP {response.status_code}: {body}"
    lines = [str(body.get("detail") or f"HTTP {response.status_code}")]
    for field, problems in (body.get("errors") or {}).items():
        for problem in problems if isinstance(problems, list) else [problems]:
            lines.append(f"  {field}: {problem}")
    return "\n".join(lines)


class Client:
    """Calls OPERATIONS by name; a 4xx or 5xx becomes a CliError with the exit code its status means."""

    def __init__(self, *, server: str, token: str | None, timeout: float = 30.0):
        signed = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=server, timeout=timeout,
                                 headers={**signed, "Accept": "application/json", "User-Agent": "tandemctl"})
        self._checked = False
        self._schema: dict | None = None

    def _request(self, method: str, path: str, **kwargs) -> httpx.Response:
        try:
            return self.http.request(method, path, **kwargs)
        except httpx.HTTPError as e:
            raise CliError(f"Cannot reach {self.http.base_url}: {e}", FAILED) from None

    def schema(self) -> dict:
        """The OpenAPI document the server serves (read once)."""
        if self._schema is None:
            response = self._request("GET", SCHEMA_PATH)
            if response.status_code != 200:
                raise CliError(_error_message(response), BY_STATUS.get(response.status_code, FAILED))
            self._schema = response.json()
        return self._schema

    def check_schema(self) -> None:
        """Stop with exit 9 when the server's schema lacks an operation this client uses."""
        if missing := operations_missing(self.schema()):
            raise CliError(f"The server at {self.http.base_url} does not offer {', '.join(missing)}: this "
                           "tandemctl and the server disagree on the API; use the tandemctl of the server's version.",
                           SCHEMA_DRIFT)
        self._checked = True

    def call(self, operation: str, *, body=None, params: dict | None = None, **path) -> dict | list | None:
        if not self._checked:
            self.check_schema()
        method, template = OPERATIONS[operation]
        response = self._request(method.upper(), template.format(**path), json=body,
                                 params={k: v for k, v in (params or {}).items() if v is not None})
        if response.status_code >= 400:
            raise CliError(_error_message(response), BY_STATUS.get(response.status_code, FAILED))
        return response.json() if response.content else None

    def every(self, operation: str, *, params: dict | None = None, **path) -> list:
        """All pages of a list operation."""
        items, offset = [], 0
        while True:
            page = self.call(operation, params={**(params or {}), "limit": 500, "offset": offset}, **path)
            items += page["results"]
            offset += len(page["results"])
            if not page.get("next") or not page["results"]:
                return items
