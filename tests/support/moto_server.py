"""moto's server mode on 127.0.0.1 for tests (real boto3 over HTTP), with injectable AWS faults.

`MotoServer.inject(...)` makes the next N requests whose method and path match answer with an AWS error
(throttling by default), the way a busy AWS API does, so the product's retry and classification run for real.
"""
import json
import logging
import re
from dataclasses import dataclass

import httpx
from moto.server import DomainDispatcherApplication, MotoRequestHandler, ThreadedMotoServer, create_backend_app
from werkzeug.serving import make_server

EKS_CLUSTER_CREATE = {"name", "roleArn", "resourcesVpcConfig"}


@dataclass
class AwsFault:
    method: str
    path: re.Pattern
    status: int
    code: str
    count: int


class MotoServer(ThreadedMotoServer):
    """ThreadedMotoServer on a free port whose WSGI app answers injected faults first."""

    def __init__(self):
        super().__init__(ip_address="127.0.0.1", port=0, verbose=False)
        self.faults: list[AwsFault] = []
        self.hits: list[tuple[str, str]] = []

    @property
    def url(self) -> str:
        host, port = self.get_host_and_port()
        return f"http://{host}:{port}"

    def inject(self, method: str, path: str, *, count: int = 1, status: int = 429,
               code: str = "ThrottlingException") -> None:
        """The next `count` matching requests fail with an AWS error (JSON protocol, as EKS answers)."""
        self.faults.append(AwsFault(method.upper(), re.compile(path), status, code, count))

    def reset(self) -> None:
        """Forget every AWS resource and fault (moto's own reset endpoint)."""
        self.faults.clear()
        self.hits.clear()
        httpx.post(f"{self.url}/moto-api/reset", timeout=10).raise_for_status()

    def _middleware(self, app):
        def wsgi(environ, start_response):
            method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")
            self.hits.append((method, path))
            for fault in self.faults:
                if fault.count > 0 and fault.method == method and fault.path.search(path):
                    fault.count -= 1
                    body = json.dumps({"message": "Rate exceeded" if "Throttl" in fault.code else fault.code})
                    start_response(f"{fault.status} Injected", [("Content-Type", "application/json"),
                                                               ("x-amzn-ErrorType", fault.code)])
                    return [body.encode()]
            return app(environ, start_response)

        return wsgi

    def _server_entry(self) -> None:
        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request drowns the logs
        app = self._middleware(DomainDispatcherApplication(create_backend_app))
        self._server = make_server(self._ip_address, self._port, app, True, request_handler=MotoRequestHandler)
        self._server_ready_event.set()
        self._server.serve_forever()


def eks_cluster_create(*, url: str, name: str, region: str = "us-west-2") -> dict:
    """Create an EKS cluster in moto (what a platform team would have before registering it)."""
    import boto3

    eks = boto3.client("eks", region_name=region, endpoint_url=url)
    return eks.create_cluster(name=name, roleArn="arn:aws:iam::123456789012:role/eks",
                              resourcesVpcConfig={"subnetIds": ["subnet-1", "subnet-2"]})["cluster"]
