"""moto's server mode on 127.0.0.1 for tests (real boto3 over HTTP), with injectable AWS faults, and EKS and EC2
made as strict as the real services where moto is lenient.

`MotoServer.inject(...)` makes the next N requests whose method and path match answer with an AWS error
(throttling by default), the way a busy AWS API does, so the product's retry and classification run for real.
`operations` logs each request by its IAM name (`eks:DescribeNodegroup`, from botocore's routes or, for ECR's JSON
protocol, its X-Amz-Target), which tests count
and compare with the driver's IAM policy.

What moto accepts and EKS does not (tests/support/eks_rules.py holds the rules and their sources): a node group
without a node role or subnets, or on subnets EC2 does not have; a launch template with fields EKS forbids; a
capacity block without its reservation; a 31st node group. What EKS accepts and then fails (CREATE_FAILED with its
health issue): an EFA launch template over subnets in more than one Availability Zone, and an instance type
`short_of(...)` marks as out of capacity. moto has no placement groups: `EksRules` answers those EC2 calls; nor
capacity reservations (`ec2_rules.reserve(...)` makes one). ECR
names a pushed image by the digest of its manifest, as the real registry does (moto hashes its layers).

Node groups go through CREATING and DELETING as EKS's do (tests/support/nodegroup_phases.py), one DescribeNodegroup
per phase unless the test sets `phases.describes` or calls `advance(...)`.

The account's limits (tests/support/account_limits.py): where EC2 offers each instance type (`offerings(...)`), the
EC2 vCPU quotas (`quota(...)`), and node groups failing as EC2 fails their launches past either. IAM's policy
simulator, which moto lacks, is answered from the principal's policies in moto's IAM (tests/support/iam_simulator.py).
"""
import functools
import hashlib
import io
import json
import logging
import re
from dataclasses import dataclass
from urllib.parse import parse_qs

import botocore.session
import httpx
from moto.ecr import models as ecr_models
from moto.server import DomainDispatcherApplication, MotoRequestHandler, ThreadedMotoServer, create_backend_app
from werkzeug.serving import make_server

from tests.support.account_limits import AccountLimits
from tests.support.ec2_rules import Ec2Rules
from tests.support.eks_rules import EksRules, cluster_vpc
from tests.support.iam_simulator import simulate_principal_policy
from tests.support.nodegroup_phases import NodegroupPhases

EKS_CLUSTER_CREATE = {"name", "roleArn", "resourcesVpcConfig"}


def _ecr_manifest_digest(image) -> None:
    """ECR names an image by the sha256 of its manifest's bytes, as every registry does (the OCI distribution spec:
    a manifest's digest is that of its content), so a team knows the digest it pushes; moto 5.2 hashes the layers'
    digests instead (moto/ecr/models.py, Image._create_digest)."""
    image._image_digest = "sha256:" + hashlib.sha256(image.image_manifest.encode()).hexdigest()


ecr_models.Image._create_digest = _ecr_manifest_digest


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
        self.operations: list[str] = []  # "<service>:<Operation>" of each signed request, in order (IAM's names)
        self.access_keys: list[str] = []  # the access key id that signed each request
        self.short: set[str] = set()  # instance types with no capacity (EC2's InsufficientInstanceCapacity)
        self.rules = EksRules()
        self.ec2_rules = Ec2Rules()
        self.phases = NodegroupPhases()
        self.limits = AccountLimits()

    def short_of(self, instance_type: str) -> None:
        """EC2 has no capacity of this instance type: a node group of it fails as EKS reports that."""
        self.short.add(instance_type)

    def advance(self, nodegroup: str, *, cluster: str, region: str = "us-west-2") -> None:
        """End the node group's CREATING or DELETING phase now."""
        self.phases.advance((region, cluster, nodegroup))

    def report(self, nodegroup: str, *, cluster: str, status: str, issues: list[dict],
               region: str = "us-west-2") -> None:
        """EKS reports the node group in `status` with these health issues (e.g. a launch failure while CREATING)."""
        self.phases.report((region, cluster, nodegroup), status=status, issues=issues)

    def offerings(self, zones: dict[str, list[str]]) -> None:
        """EC2 offers each of these instance types in exactly these Availability Zones (others: moto's AWS data)."""
        self.limits.replaced.update(zones)

    def quota(self, code: str, vcpus: float) -> None:
        """The account's EC2 vCPU quota `code` (Service Quotas, e.g. L-417A185B) is `vcpus`."""
        self.limits.quotas[code] = float(vcpus)

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
        self.operations.clear()
        self.access_keys.clear()
        self.short.clear()
        self.rules.reset()
        self.ec2_rules.reset()
        self.phases.reset()
        self.limits.reset()
        httpx.post(f"{self.url}/moto-api/reset", timeout=10).raise_for_status()

    def _middleware(self, app):
        def wsgi(environ, start_response):
            method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")
            self.hits.append((method, path))
            body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
            environ["wsgi.input"] = io.BytesIO(body)
            auth = environ.get("HTTP_AUTHORIZATION", "")
            if m := re.search(r"Credential=([^/]+)/\d+/([\w-]+)/(\w+)/", auth):
                key, region, service = m.groups()
                self.access_keys.append(key)
            else:
                region, service = "us-west-2", ""
            params = parse_qs(body.decode()) if service in ("ec2", "sts", "iam") else {}
            target = environ.get("HTTP_X_AMZ_TARGET", "")
            if service:
                self.operations.append(f"{service}:{operation_of(service, method, path, params, target=target)}")
            if service == "ec2":
                action = params.get("Action", [""])[0]
                if answer := self.rules.ec2_answer(action, params, region=region) or \
                        self.limits.ec2_answer(action, params, region=region) or \
                        self.ec2_rules.answer(action, params, region=region):
                    return _respond(start_response, *answer)
            if service == "servicequotas" and (answer := self.limits.quota_answer(target, body, region=region)):
                return _respond(start_response, *answer)
            if service == "iam" and params.get("Action", [""])[0] == "SimulatePrincipalPolicy":
                return _respond(start_response, *simulate_principal_policy(params))
            for fault in self.faults:
                if fault.count > 0 and fault.method == method and fault.path.search(path):
                    fault.count -= 1
                    body = json.dumps({"message": "Rate exceeded" if "Throttl" in fault.code else fault.code})
                    start_response(f"{fault.status} Injected", [("Content-Type", "application/json"),
                                                               ("x-amzn-ErrorType", fault.code)])
                    return [body.encode()]
            if service == "eks" and method == "POST" and (m := NODEGROUPS_PATH.fullmatch(path)):
                request = json.loads(body or b"{}")
                if refusal := self.rules.nodegroup_refusal(m.group(1), request, region=region):
                    return _respond(start_response, *refusal)
                answered = {}
                answer = b"".join(app(environ, lambda status, headers, *_: answered.update(
                    status=status, headers=headers) or (lambda data: None)))
                if answered["status"].startswith("200"):
                    self.rules.nodegroup_created(m.group(1), request, region=region, short=self.short,
                                                 phases=self.phases, ec2_rules=self.ec2_rules,
                                                 limits=self.limits)
                    made = json.loads(answer)  # EKS answers with the group as it starts: CREATING
                    made["nodegroup"].update(status="CREATING", health={"issues": []})
                    answer = json.dumps(made).encode()
                start_response(answered["status"], [(k, v) for k, v in answered["headers"]
                                                    if k.lower() != "content-length"]
                               + [("Content-Length", str(len(answer)))])
                return [answer]
            if service == "eks" and (m := NODEGROUP_PATH.fullmatch(path)):
                return self._nodegroup_phase(app, environ, start_response, method, (region, *m.groups()))
            return app(environ, start_response)

        return wsgi

    def _nodegroup_phase(self, app, environ, start_response, method: str, key: tuple[str, str, str, str]):
        """DescribeNodegroup steps the group's phase; DeleteNodegroup starts DELETING; UpdateNodegroupConfig is
        refused while the group cannot take it."""
        region, cluster, name, action = key
        key = (region, cluster, name)
        if method == "GET" and not action:
            self.phases.described(key)
        elif method == "DELETE" and not action:
            kept = self.phases.deleting(key)
            answer = app(environ, start_response)
            self.phases.deleted(key, kept)
            return answer
        elif method == "POST" and action == "/update-config" and (refusal := self.phases.update_refusal(key)):
            return _respond(start_response, *refusal)
        return app(environ, start_response)

    def _server_entry(self) -> None:
        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request drowns the logs
        app = self._middleware(DomainDispatcherApplication(create_backend_app))
        self._server = make_server(self._ip_address, self._port, app, True, request_handler=MotoRequestHandler)
        self._server_ready_event.set()
        self._server.serve_forever()


NODEGROUPS_PATH = re.compile(r"/clusters/([^/]+)/node-groups")
NODEGROUP_PATH = re.compile(r"/clusters/([^/]+)/node-groups/([^/]+)(/update-config)?")


@functools.cache
def _rest_routes(service: str) -> list[tuple[str, re.Pattern, str]]:
    """(method, path pattern, operation) of each operation of a REST service, from botocore's model."""
    model = botocore.session.get_session().get_service_model(service)
    routes = []
    for name in model.operation_names:
        http = model.operation_model(name).http
        uri = re.sub(r"\{[^}]+\}", "[^/]+", http["requestUri"].split("?")[0])
        routes.append((http["method"], re.compile(uri), name))
    return routes


def operation_of(service: str, method: str, path: str, params: dict, *, target: str = "") -> str:
    """The API operation of a request: the Action of a query-protocol call (EC2, STS, IAM), the X-Amz-Target of a
    JSON-protocol one (Service Quotas), else the botocore route its method and path match (EKS)."""
    if "Action" in params:
        return params["Action"][0]
    if target:
        return target.rsplit(".", 1)[-1]
    return next((name for m, pattern, name in _rest_routes(service) if m == method and pattern.fullmatch(path)), "?")


def _respond(start_response, status: int, headers: list, body: bytes):
    start_response(f"{status} Emulated", headers)
    return [body]


def eks_cluster_create(*, url: str, name: str, region: str = "us-west-2", zones: tuple[str, ...] = ("a",),
                       public: bool = False) -> dict:
    """An EKS cluster in moto as a platform team has it before registering it: a VPC, one private subnet per zone
    letter in `zones`, and the cluster, whose DescribeCluster also reports its VPC and cluster security group
    (real EKS creates that group; moto reports neither). Returns the cluster with `subnet_ids` added."""
    import boto3

    ec2 = boto3.client("ec2", region_name=region, endpoint_url=url)
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnets = []
    for i, zone in enumerate(zones):
        subnet = ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.0.{i}.0/24", AvailabilityZone=f"{region}{zone}")
        subnets.append(subnet["Subnet"]["SubnetId"])
        if public:
            ec2.modify_subnet_attribute(SubnetId=subnets[-1], MapPublicIpOnLaunch={"Value": True})
    group = ec2.create_security_group(GroupName=f"eks-cluster-sg-{name}", Description="EKS cluster", VpcId=vpc)
    eks = boto3.client("eks", region_name=region, endpoint_url=url)
    cluster = eks.create_cluster(name=name, roleArn="arn:aws:iam::123456789012:role/eks",
                                 resourcesVpcConfig={"subnetIds": subnets})["cluster"]
    cluster_vpc(name, region=region, vpc_id=vpc, security_group_id=group["GroupId"])
    return {**cluster, "subnet_ids": subnets, "vpc_id": vpc, "cluster_security_group_id": group["GroupId"]}
