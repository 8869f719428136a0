"""A stand-in Ray dashboard over real HTTP: the Serve REST API (`/api/serve/applications/`) with Ray 2.60's
token authentication, and a Serve proxy answering `/v1/models`, for testing the `ray` driver.

PUT is declarative for the whole cluster, as in Ray: applications not listed are deleted, and a body with two
applications of one name or one route prefix is refused with 400 (Serve's own check). The proxy answers
`<route_prefix>/v1/models` with the model of the RUNNING application at that prefix, 404 elsewhere. A new or changed
application is DEPLOYING until `ready_after` seconds pass, then RUNNING (or DEPLOY_FAILED with `fail_apps`);
a removed one is DELETING for `ready_after` seconds, then gone. GET echoes each `deployed_app_config` with a
default Ray fills in (so drift detection must not count defaults as drift).
"""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.support.serve_examples import deploy_failed


# The token the tests' stand-in dashboards require (tests/workers/conftest.py's `dashboard`).
TEST_TOKEN = "ray-token-not-a-secret"


class RayDashboard:
    """The fake dashboard's state; `serve()` starts the HTTP server in a thread."""

    def __init__(self, *, token: str, ready_after: float = 0.2):
        self.token = token
        self.ready_after = ready_after
        self.fail_apps = False
        self.apps: dict[str, dict] = {}  # name -> {"config", "since", "deleting"}
        self.http_options: dict = {}
        self.requests: list[tuple[str, str]] = []
        self.faults: list[list] = []  # [method, status, count]
        self.get_delay = 0.0  # seconds each GET of the applications takes (to widen a read-then-write race)
        self._lock = threading.Lock()
        self.server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def inject(self, method: str, status: int, *, count: int = 1) -> None:
        """The next `count` dashboard requests with this method answer `status`."""
        self.faults.append([method.upper(), status, count])

    def status_of(self, name: str) -> str | None:
        with self._lock:
            app = self.apps.get(name)
            if app is None:
                return None
            done = time.monotonic() - app["since"] >= self.ready_after
            if app["deleting"]:
                if done:
                    del self.apps[name]
                    return None
                return "DELETING"
            if not done:
                return "DEPLOYING"
            return "DEPLOY_FAILED" if self.fail_apps else "RUNNING"

    @staticmethod
    def refusal(body: dict) -> str:
        """Why Serve refuses this PUT (duplicate names or route prefixes), or ""."""
        apps = body.get("applications", [])
        for key, what in (("name", "names"), ("route_prefix", "route prefixes")):
            values = [a.get(key, "/") for a in apps]
            if dup := sorted({v for v in values if values.count(v) > 1}):
                return f"Found duplicate applications for {what} {dup}."
        return ""

    def put(self, body: dict) -> None:
        now = time.monotonic()
        with self._lock:
            wanted = {a["name"]: a for a in body.get("applications", [])}
            for name, app in self.apps.items():
                if name not in wanted and not app["deleting"]:
                    app.update(deleting=True, since=now)
            for name, config in wanted.items():
                current = self.apps.get(name)
                if current is None or current["config"] != config or current["deleting"]:
                    self.apps[name] = {"config": config, "since": now, "deleting": False}
            self.http_options = body.get("http_options", self.http_options)

    def details(self) -> dict:
        apps = {}
        for name in list(self.apps):
            status = self.status_of(name)
            if status is None:
                continue
            config = {**self.apps[name]["config"], "runtime_env": self.apps[name]["config"].get("runtime_env", {})}
            apps[name] = {"name": name, "status": status, "message": "", "deployments": {},
                          "route_prefix": config.get("route_prefix"), "deployed_app_config": config}
            if status == "DEPLOY_FAILED":  # what Serve said for a bad engine setting, recorded
                model_id = config["args"]["prefill_config"]["model_loading_config"]["model_id"]
                apps[name].update(deploy_failed(model_id=model_id))
        return {"http_options": self.http_options, "proxy_location": "HeadOnly", "applications": apps}

    def models(self, prefix: str) -> list[str]:
        """Model ids the RUNNING application at this route prefix serves."""
        return [self.apps[n]["config"]["args"]["prefill_config"]["model_loading_config"]["model_id"]
                for n in list(self.apps) if self.status_of(n) == "RUNNING"
                and self.apps[n]["config"].get("route_prefix", "/").rstrip("/") == prefix]

    def serve(self) -> "RayDashboard":
        dashboard = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, code: int, body) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, method: str) -> None:
                dashboard.requests.append((method, self.path))
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                if self.path.endswith("/v1/models"):  # Serve's proxy: no dashboard token
                    if models := dashboard.models(self.path.removesuffix("/v1/models")):
                        return self._send(200, {"object": "list", "data": [{"id": m} for m in models]})
                    return self._send(404, {"detail": "Not Found"})
                if self.headers.get("Authorization") != f"Bearer {dashboard.token}":
                    return self._send(401, {"error": "InvalidAuthToken"})
                for fault in dashboard.faults:
                    if fault[2] > 0 and fault[0] == method:
                        fault[2] -= 1
                        return self._send(fault[1], {"error": f"injected {fault[1]}"})
                if self.path != "/api/serve/applications/":
                    return self._send(404, {"error": "not found"})
                if method == "GET":
                    details = dashboard.details()
                    time.sleep(dashboard.get_delay)
                    return self._send(200, details)
                if method == "PUT":
                    body = json.loads(raw)
                    if refusal := dashboard.refusal(body):
                        return self._send(400, {"error": refusal})
                    dashboard.put(body)
                    return self._send(200, {})
                if method == "DELETE":
                    dashboard.put({"applications": []})
                    return self._send(200, {})
                return self._send(405, {})

            def do_GET(self):
                self._handle("GET")

            def do_PUT(self):
                self._handle("PUT")

            def do_DELETE(self):
                self._handle("DELETE")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
