"""A Kubernetes API over real HTTP for tests: kmock's KubernetesEmulator, extended where it differs from a real
API server, plus a tiny stand-in for the KubeRay operator.

Extensions (kept here, never in the product code):
- metadata a real server adds: uid, resourceVersion, generation (bumped on spec changes), creationTimestamp;
- PUT (replace) with optimistic concurrency: a stale resourceVersion gets 409, and `status` is kept;
- bearer-token auth (401 without the right token, or without the EKS token prefix);
- injected faults: the next N requests matching a method and path get a status (409/429/500/410...);
- a stall: a RayService create is stored, then its answer held back (to kill a worker mid-provision);
- a hold: the next N requests matching a method and path wait before they are handled (a slow call in flight);
- a cluster-scoped object written with a namespace is stored without it, as a real server stores it;
- a list filtered by an equality labelSelector (`k=v,k2=v2`), as the API server filters it (kmock ignores it);
- a pod's log (`pods/<name>/log`) as text from `pod_logs`, as the API server streams the container's log;
- objects found by their key, not by scanning every object (kmock does), and kmock's log of past requests kept to
  those in flight (it matches each request against every earlier one), so a request costs the same at 10,000
  objects and after 100,000 requests (`hits` is the record tests assert on);
- KubeRay's CRD at the version a test names (`kuberay_version`, default 1.5.1, the oldest KubeRay Tandem's
  RayService is whole on; the files are in tests/support/kuberay_crds): a RayService written (create, replace, patch)
  is pruned and defaulted as the API server does for that CRD's structural schema (tests.support.structural_pruning),
  with its `Warning: 299` headers, then validated by the CRD's schema, and refused with the API server's 422 and its
  words when invalid (tests.support.crd_validation);
- "KubeRay": for each RayService, its head and worker pods (replicas x numOfHosts per group, KubeRay's labels
  beside the template's), placed by the scheduler's fit rules (tests.support.scheduler) against `nodes` (a fixed
  fleet), else the Node objects written through the API (a test seeding a cluster) beside, for an EKS cluster
  (`eks`, tests.support.eks_nodes), the nodes of the managed node groups moto's EKS has for it, as EKS makes them
  (sized, labelled and tainted as each group says, less what its DaemonSets take; a group not ACTIVE has none);
  or, on a cluster with neither, nodes an autoscaler brings for that RayService (one of the instance type each
  worker pod selects, and an untainted CPU node for the head). A pod that fits nowhere stays
  Pending with the scheduler's own PodScheduled message. The RayService reads as Ready with its Serve application
  RUNNING `ready_after` seconds after its spec last changed and every pod was placed (or DEPLOY_FAILED when
  `fail_apps` is set, with Serve's recorded failure). A change to `rayClusterConfig` follows the RayService's
  `upgradeStrategy` as KubeRay does: NewCluster (the default) runs a second Ray cluster beside the first and
  switches once all its pods run (the old one serving meanwhile, `UpgradeInProgress` True), None leaves the running
  cluster alone. Pods and nodes are served for GET (one, or a list with a labelSelector).

Runnable as a process of its own, as the scale bench runs it (so its CPU is not the bench's):

    python -m tests.support.k8s_emulator --token T [--port P] [--ready-after S] [--kuberay-version 1.5.1]

prints the URL it serves once it listens, then serves until stopped.
"""
import argparse
import asyncio
import copy
import functools
import hashlib
import itertools
import json
import logging
import re
import threading
import time
import uuid
from collections import Counter
from datetime import UTC, datetime

import aiohttp.web
import attrs
import kmock
import yaml
from kmock._internal.dicts import patch_dict  # what kmock stores for a PATCH (merge or JSON patch)
from kubernetes.utils import parse_quantity

from deployments.catalog import INSTANCE_TYPES
from deployments.manifests import EFA_HUGEPAGES
from tests.support import ray_rules
from tests.support.eks_nodes import EksNodes
from tests.support.scheduler import Node, cpu_node, eks_node, release, schedule
from tests.support.serve_examples import kuberay_deploy_failed
from tests.support.crd_validation import invalid_status, validate
from tests.support.structural_pruning import admit, crd_schema, merge_patch

RAYSERVICES = kmock.resource("ray.io", "v1", "rayservices")
DEFAULT_KUBERAY_VERSION = "1.5.1"  # the first release that keeps workerGroupSpecs[].resources and authOptions
NAMESPACE_PATH = re.compile(r"^/api/v1/namespaces(?:/([^/]+))?/?$")
POD_PATH = re.compile(r"^/api/v1(?:/namespaces/([^/]+))?/pods(?:/([^/]+))?/?$")
NODE_PATH = re.compile(r"^/api/v1/nodes(?:/([^/]+))?/?$")
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
POD_LOG_PATH = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)/log$")


# (group/version/plural, kind, namespaced) of what deploy/ renders, beside Namespace (served by the emulator).
CONTROL_PLANE_KINDS = [
    ("v1/configmaps", "ConfigMap", True), ("v1/serviceaccounts", "ServiceAccount", True),
    ("v1/services", "Service", True), ("apps/v1/deployments", "Deployment", True), ("batch/v1/jobs", "Job", True),
    ("policy/v1/poddisruptionbudgets", "PodDisruptionBudget", True),
    ("autoscaling/v2/horizontalpodautoscalers", "HorizontalPodAutoscaler", True),
    ("networking.k8s.io/v1/networkpolicies", "NetworkPolicy", True),
    ("networking.k8s.io/v1/ingresses", "Ingress", True),
    ("rbac.authorization.k8s.io/v1/clusterroles", "ClusterRole", False),
    ("rbac.authorization.k8s.io/v1/clusterrolebindings", "ClusterRoleBinding", False),
    ("admissionregistration.k8s.io/v1/validatingadmissionpolicies", "ValidatingAdmissionPolicy", False),
    ("admissionregistration.k8s.io/v1/validatingadmissionpolicybindings", "ValidatingAdmissionPolicyBinding", False),
]


@attrs.define
class Fault:
    method: str
    path: re.Pattern
    status: int
    count: int = 1
    headers: dict = attrs.field(factory=dict)


@attrs.define
class Hold:
    method: str
    path: re.Pattern
    seconds: float
    count: int = 1
    started: threading.Event = attrs.field(factory=threading.Event)  # a matching request arrived and waits
    done: threading.Event = attrs.field(factory=threading.Event)  # its wait is over; it is handled now


@attrs.define(kw_only=True)
class KubeRayEmulator(kmock.KubernetesEmulator):
    """KubernetesEmulator + real-server metadata, PUT, auth, faults, stalls and a stand-in KubeRay."""

    base_url: str = ""  # set once served (EmulatorThread)
    kuberay_version: str = DEFAULT_KUBERAY_VERSION  # whose CRD admits what is written (tests/support/kuberay_crds)
    nodes: list[Node] | None = None  # a fixed fleet every pod competes for; None: the API's, EKS's or autoscaled
    eks: EksNodes | None = None  # the EKS cluster (in moto) this is the API server of: its node groups' nodes
    _ray_pods: dict = attrs.field(factory=dict)  # (namespace, rayservice) -> RayPods of its serving Ray cluster
    _pending: dict = attrs.field(factory=dict)  # (namespace, rayservice) -> RayPods of a NewCluster upgrade
    _api_node_use: dict = attrs.field(factory=dict)  # node name -> what placed pods use of a node in the API
    ready_after: float = 0.3
    fail_apps: bool = False
    # The images a registry holds (None: every image exists). A container whose image is not there waits in
    # ImagePullBackOff with containerd's NotFound, as a node pulling a tag that was never pushed does.
    registry: set[str] | None = None
    # What goes wrong in the containers of a pool's pods ("head", "prefill", "decode"): see `ContainerFault`.
    container_faults: dict[str, "ContainerFault"] = attrs.field(factory=dict)
    previous_logs: dict[tuple[str, str], str] = attrs.field(factory=dict)  # (namespace, pod) → its last run's log
    # Mutating admission webhooks (a policy engine's rewrites): each changes a RayService as it is stored.
    mutations: list = attrs.field(factory=list)
    _operated: dict = attrs.field(factory=dict)  # (namespace, rayservice) → the generation KubeRay last acted on
    operator_enabled: bool = True
    token: str | None = None
    token_prefix: str | None = None
    token_max_age: float | None = None  # EKS-style tokens signed longer ago than this are refused (expired)
    stall_rayservice_create: float = 0.0
    stalled: threading.Event = attrs.field(factory=threading.Event)
    faults: list[Fault] = attrs.field(factory=list)
    holds: list[Hold] = attrs.field(factory=list)
    hits: list[tuple[str, str]] = attrs.field(factory=list)
    namespaces: dict[str, dict] = attrs.field(factory=dict)
    pod_logs: dict[tuple[str, str], str] = attrs.field(factory=dict)  # (namespace, pod) → its log, as text
    authorizations: list[str] = attrs.field(factory=list)  # what clients sent, for auth assertions
    _versions: itertools.count = attrs.field(factory=lambda: itertools.count(1))
    _changed: dict = attrs.field(factory=dict)

    def install_kuberay(self) -> None:
        """Declare the resources a cluster with KubeRay serves (discovery answers for them)."""
        self.resources["v1/services"] = {"kind": "Service", "namespaced": True}
        self.resources["v1/serviceaccounts"] = {"kind": "ServiceAccount", "namespaced": True}
        self.resources["v1/secrets"] = {"kind": "Secret", "namespaced": True}
        self.resources["rbac.authorization.k8s.io/v1/rolebindings"] = {"kind": "RoleBinding", "namespaced": True}
        self.resources["networking.k8s.io/v1/networkpolicies"] = {"kind": "NetworkPolicy", "namespaced": True}
        self.resources["ray.io/v1/rayservices"] = {"kind": "RayService", "namespaced": True,
                                                   "subresources": ["status"]}

    def install_control_plane_kinds(self) -> None:
        """Declare the built-in kinds Tandem's own install (deploy/) uses, as a real API server serves them."""
        for path, kind, namespaced in CONTROL_PLANE_KINDS:
            self.resources[path] = {"kind": kind, "namespaced": namespaced}

    def inject(self, method: str, path: str, status: int, *, count: int = 1, headers: dict | None = None) -> None:
        """The next `count` requests with this method whose path matches the regex get `status`."""
        self.faults.append(Fault(method.upper(), re.compile(path), status, count, headers or {}))

    def hold(self, method: str, path: str, seconds: float, *, count: int = 1) -> Hold:
        """The next `count` requests with this method whose path matches the regex wait `seconds`, then are
        handled as usual (nothing is stored before the wait ends)."""
        held = Hold(method.upper(), re.compile(path), seconds, count)
        self.holds.append(held)
        return held

    def rayservices(self) -> list[dict]:
        """Every RayService that exists now."""
        return [obj.raw for (res, _, _), obj in list(self.objects.items()) if res == RAYSERVICES and not obj.deleted]

    def live_objects(self) -> list[tuple[str, str | None, str]]:
        """(resource, namespace, name) of everything that exists now, namespaces included."""
        found = [(f"{res.group}/{res.version}/{res.plural}".lstrip("/"), ns, name)
                 for (res, ns, name), obj in list(self.objects.items()) if not obj.deleted]
        return found + [("v1/namespaces", None, n) for n in self.namespaces]

    def _KubernetesEmulator__get_objs(self, request, strict: bool) -> list:
        """kmock's lookup scans every object for each request; a request naming one object finds it by key."""
        if request.name is not None and (strict or request.namespace is not None):
            obj = self._objects._objects.get((request.resource, request.namespace, request.name))
            return [] if obj is None else [obj]
        found = super()._KubernetesEmulator__get_objs(request, strict)
        if selector := request.params.get("labelSelector"):  # equality selectors (k=v,...), as a list filters by
            wanted = dict(term.split("=", 1) for term in selector.split(","))
            found = [o for o in found if o.deleted or all(
                ((o.raw.get("metadata") or {}).get("labels") or {}).get(k) == v for k, v in wanted.items())]
        return found

    # --- request handling -----------------------------------------------------------------------------
    async def __call__(self, raw_request):
        for held in self.holds:
            if held.count > 0 and held.method == raw_request.method and held.path.search(raw_request.path):
                held.count -= 1
                held.started.set()
                await asyncio.sleep(held.seconds)
                held.done.set()
                break
        # kmock parses /api/v1/namespaces[/name] as a namespace prefix, not as the Namespace resource;
        # namespaces are served here instead.
        if (match := POD_LOG_PATH.match(raw_request.path)) and raw_request.method == "GET":
            # pods/log answers the container's log as text/plain (the last tailLines lines), not the object
            if (refused := self._guard("GET", raw_request.path, raw_request.headers)) is not None:
                return refused
            previous = raw_request.query.get("previous") == "true"
            logs = self.previous_logs if previous else self.pod_logs
            if (log := logs.get((match[1], match[2]))) is None:
                if previous:  # the kubelet's answer when the container has not restarted
                    return self._status(400, "BadRequest", f'previous terminated container "ray" in pod '
                                                           f'"{match[2]}" not found')
                return self._status(404, "NotFound", f'pods "{match[2]}" not found')
            tail = int(raw_request.query.get("tailLines", 0) or 0)
            return aiohttp.web.Response(text="".join(log.splitlines(keepends=True)[-tail:] if tail else log))
        if match := NAMESPACE_PATH.match(raw_request.path):
            body = await raw_request.read()
            return self._namespace(raw_request.method, match.group(1), raw_request.headers,
                                   json.loads(body) if body else None,
                                   dry_run=raw_request.query.get("dryRun") == "All")
        if raw_request.method == "GET" and \
                (match := POD_PATH.match(raw_request.path) or NODE_PATH.match(raw_request.path)) is not None:
            return self._read_pods_or_nodes(raw_request, match)
        return await super().__call__(raw_request)

    def pods(self, namespace: str | None = None) -> list[dict]:
        """Every pod the stand-in KubeRay made (in `namespace`)."""
        clusters = list(self._ray_pods.items()) + list(self._pending.items())
        return [p for (ns, _), made in clusters if namespace in (None, ns) for p in made.pods]

    def _read_pods_or_nodes(self, raw_request, match):
        """Pods and nodes: GET one, or list (with an equality labelSelector), as the API serves them: the stand-in
        KubeRay's pods and the scheduler's nodes, beside any a test wrote through the API (kmock keeps those, and
        serves every other method and subresource of them)."""
        if (refused := self._guard(raw_request.method, raw_request.path, raw_request.headers)) is not None:
            return refused
        is_pods = match.re is POD_PATH
        plural = "pods" if is_pods else "nodes"
        namespace, name = (match.group(1), match.group(2)) if is_pods else (None, match.group(1))
        stored = [o.raw for (res, ns, _), o in list(self.objects.items())
                  if res.plural == plural and res.group == "" and not o.deleted and namespace in (None, ns)]
        found = (self.pods(namespace) if is_pods else [n.as_object() for n in self._all_nodes()]) + stored
        kind = "Pod" if is_pods else "Node"
        if name is not None:
            one = next((o for o in found if o["metadata"]["name"] == name), None)
            if one is None:
                return self._status(404, "NotFound", f'{kind.lower()}s "{name}" not found')
            return aiohttp.web.json_response(one)
        wanted = dict(term.split("=", 1) for term in
                      filter(None, raw_request.query.get("labelSelector", "").split(",")))
        items = [o for o in found if all(o["metadata"].get("labels", {}).get(k) == v for k, v in wanted.items())]
        return aiohttp.web.json_response({"apiVersion": "v1", "kind": f"{kind}List",
                                          "metadata": {"resourceVersion": str(next(self._versions))},
                                          "items": items})

    def _all_nodes(self) -> list[Node]:
        """The scheduler's nodes that are not Node objects in the API already."""
        if self.nodes is not None:
            return list(self.nodes)
        if self.eks is not None:
            return self.eks.nodes()
        if self._api_nodes():
            return []
        return [n for made in list(self._ray_pods.values()) + list(self._pending.values()) for n in made.fleet]

    def _api_nodes(self) -> list[Node]:
        """Nodes a test wrote through the API (as a cluster's kubelets register them), as the scheduler sees them;
        what pods use on each is kept across passes by node name."""
        found = []
        for (res, _, name), obj in list(self.objects.items()):
            if res.plural != "nodes" or res.group != "" or obj.deleted:
                continue
            raw = obj.raw
            allocatable = {k: parse_quantity(v) for k, v in ((raw.get("status") or {}).get("allocatable") or {}).items()}
            found.append(Node(name=name, labels=dict(raw.get("metadata", {}).get("labels") or {}),
                              taints=list((raw.get("spec") or {}).get("taints") or []), allocatable=allocatable,
                              unschedulable=bool((raw.get("spec") or {}).get("unschedulable")),
                              used=self._api_node_use.setdefault(name, Counter())))
        return found

    def _fleet(self, made: "RayPods") -> list[Node]:
        """Where a Ray cluster's pods may go: the declared fleet; else the nodes in the API and, on EKS, those of
        its node groups; else the nodes autoscaled for its RayService."""
        if self.nodes is not None:
            return self.nodes
        if self.eks is not None:
            return self._api_nodes() + self.eks.nodes()
        return self._api_nodes() or made.fleet

    def _guard(self, method: str, path: str, headers):
        self.hits.append((method, path))
        self.authorizations.append(headers.get("Authorization", ""))
        if (denied := self._auth(headers)) is not None:
            return denied
        return self._fault(method, path)

    def _namespace(self, method: str, name: str | None, headers, data, *, dry_run: bool = False):
        if (refused := self._guard(method, f"/api/v1/namespaces{'/' + name if name else ''}", headers)) is not None:
            return refused
        if method == "POST" and name is None:
            name = data["metadata"]["name"]
            if name in self.namespaces:
                return self._status(409, "AlreadyExists", f'namespaces "{name}" already exists')
            data["metadata"].update(uid=str(uuid.uuid4()), resourceVersion=str(next(self._versions)))
            if not dry_run:  # ?dryRun=All: validated and answered as a create would be, not stored
                self.namespaces[name] = data
            return aiohttp.web.json_response(data, status=201)
        if name is None or name not in self.namespaces:
            return self._status(404, "NotFound", f'namespaces "{name}" not found')
        if method == "GET":
            return aiohttp.web.json_response(self.namespaces[name])
        if method == "PATCH":
            meta = self.namespaces[name]["metadata"]
            for key in ("labels", "annotations"):
                meta[key] = {**meta.get(key, {}), **(data.get("metadata", {}).get(key) or {})}
            return aiohttp.web.json_response(self.namespaces[name])
        if method == "DELETE":
            # A real namespace deletion cascades to everything inside it.
            for key, obj in list(self.objects.items()):
                if key[1] == name and not obj.deleted:
                    obj.delete()
            for clusters in (self._ray_pods, self._pending):
                for key in [k for k in clusters if k[0] == name]:
                    clusters.pop(key).release()
            return aiohttp.web.json_response(self.namespaces.pop(name))
        return self._status(405, "MethodNotAllowed", method)

    async def _handle(self, request):
        try:
            return await self._serve(request)
        finally:
            self._requests.remove(request)  # kmock would match every later request against it

    async def _serve(self, request):
        if (refused := self._guard(request.method.value, request.url.path, request.headers)) is not None:
            return refused
        if request.resource == RAYSERVICES and request.action in (kmock.action.FETCH, kmock.action.LIST):
            async with self._lock:  # a read of one RayService brings that one up to date (a list: all of them)
                self._operate(only=(request.namespace, request.name) if request.action == kmock.action.FETCH
                              else None)
        if request.method == kmock.method.PUT and request.name:
            return await self._replace(request)
        creating = request.action == kmock.action.CREATE and isinstance(request.data, dict)
        warnings, refused = self._admit(request) if creating or request.action == kmock.action.UPDATE else ([], None)
        if refused is not None:
            return refused
        if creating:
            meta = request.data.setdefault("metadata", {})
            if self._cluster_scoped(request.resource):
                meta.pop("namespace", None)  # a real server drops it from a cluster-scoped object
            meta.update(uid=str(uuid.uuid4()), resourceVersion=str(next(self._versions)), generation=1,
                        creationTimestamp=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        elif request.action == kmock.action.UPDATE and isinstance(request.data, dict):
            self._bump(request)
        response = await super()._handle(request)
        if request.resource == RAYSERVICES and request.action == kmock.action.DELETE:
            for clusters in (self._ray_pods, self._pending):  # KubeRay deletes its RayClusters, and their pods
                if (made := clusters.pop((request.namespace, request.name), None)) is not None:
                    made.release()
        for warning in warnings:
            response.headers.add("Warning", f"299 - {json.dumps(warning)}")
        if creating and request.resource == RAYSERVICES and response.status == 200:
            meta = request.data["metadata"]
            self._changed[(request.namespace or meta.get("namespace"), meta["name"])] = time.monotonic()
            if self.stall_rayservice_create:
                self.stalled.set()
                await asyncio.sleep(self.stall_rayservice_create)
        return response

    def _cluster_scoped(self, resource) -> bool:
        """Whether the resource is declared cluster-scoped (kmock's discovery info)."""
        if resource is None:
            return False
        declared = self.resources.get(f"{resource.group}/{resource.version}/{resource.plural}".lstrip("/"))
        return getattr(declared, "namespaced", None) is False

    def _auth(self, headers):
        if self.token is None and self.token_prefix is None:
            return None
        given = headers.get("Authorization", "")
        ok = given == f"Bearer {self.token}" if self.token is not None else \
            given.startswith(f"Bearer {self.token_prefix}")
        if ok and self.token_max_age is not None and self._signed_age(given) > self.token_max_age:
            ok = False  # as EKS refuses a presigned token past its lifetime
        return None if ok else self._status(401, "Unauthorized", "Unauthorized")

    @staticmethod
    def _signed_age(authorization: str) -> float:
        """Seconds since an EKS token (a presigned STS URL, base64) was signed: its X-Amz-Date."""
        import base64
        from urllib.parse import parse_qs, urlsplit

        token = authorization.removeprefix("Bearer k8s-aws-v1.")
        url = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        signed = datetime.strptime(parse_qs(urlsplit(url).query)["X-Amz-Date"][0], "%Y%m%dT%H%M%SZ")
        return (datetime.now(UTC) - signed.replace(tzinfo=UTC)).total_seconds()

    def _fault(self, method: str, path: str):
        for fault in self.faults:
            if fault.count > 0 and fault.method == method and fault.path.search(path):
                fault.count -= 1
                return self._status(fault.status, "Injected", f"injected {fault.status}", fault.headers)
        return None

    @staticmethod
    def _status(code: int, reason: str, message: str, headers: dict | None = None):
        body = {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure", "code": code,
                "reason": reason, "message": message}
        return aiohttp.web.json_response(body, status=code, headers=headers or {})

    def _admit(self, request) -> tuple[list[str], aiohttp.web.Response | None]:
        """A RayService write (create, replace, patch) as the API server admits it against this KubeRay version's
        CRD: changed by the mutating webhooks (`mutations`), pruned, defaulted, then validated
        (tests.support.crd_validation). Returns the field-validation warnings
        it answers with (a real server sends them in `Warning` headers, and the official client ignores them), and
        the 422 it answers instead when the object is invalid. A patch is admitted as the object it makes (the
        stored one with the patch applied), and what is stored is that object."""
        if request.resource != RAYSERVICES or not isinstance(request.data, dict | list):
            return [], None
        if isinstance(request.data, dict) and request.method != kmock.method.PATCH:
            for mutate in self.mutations:  # mutating admission runs before the schema's pruning and validation
                mutate(request.data)
        schema = crd_schema(self.kuberay_version)
        stored = self._objects._objects.get((request.resource, request.namespace, request.name))
        current = None if stored is None or stored.deleted else stored.raw
        if request.method == kmock.method.PATCH:
            if current is None:
                return [], None  # nothing to patch: kmock answers 404
            merged = copy.deepcopy(dict(patch_dict(current, request.data)))
            warnings = admit(merged, schema)
            if isinstance(request.data, dict):  # store what the API server would: the admitted object
                request.data.clear()
                request.data.update(merge_patch(current, merged))
        else:
            merged = request.data
            warnings = admit(merged, schema)
        if errors := validate(merged, schema, old=current):
            name = request.name or (merged.get("metadata") or {}).get("name", "")
            body = invalid_status(kind="RayService", group=RAYSERVICES.group, name=name, errors=errors)
            return warnings, aiohttp.web.json_response(body, status=422)
        return warnings, None

    def _bump(self, request) -> None:
        """A PATCH: new resourceVersion; a new generation when it touches the spec (not the status)."""
        key = (request.resource, request.namespace, request.name)
        if key not in self.objects or self.objects[key].deleted:
            return
        meta = request.data.setdefault("metadata", {})
        meta["resourceVersion"] = str(next(self._versions))
        if request.subresource != "status" and "spec" in request.data:
            meta["generation"] = self.objects[key].raw.get("metadata", {}).get("generation", 1) + 1

    async def _replace(self, request):
        """PUT as a real API server does it: whole-object replace, 409 on a stale resourceVersion."""
        key = (request.resource, request.namespace, request.name)
        async with self._lock:
            if key not in self.objects or self.objects[key].deleted:
                return self._status(404, "NotFound", f"{request.name} not found")
            current = self.objects[key].raw
            warnings, refused = self._admit(request)
            new = dict(request.data)
            given = new.get("metadata", {}).get("resourceVersion")
            if given is not None and given != current["metadata"].get("resourceVersion"):
                return self._status(409, "Conflict", "the object has been modified; please apply your changes "
                                                     "to the latest version and try again")
            if refused is not None:  # validation runs on an update the resourceVersion lets through
                return refused
            meta = {**new.get("metadata", {})}
            for k in ("uid", "creationTimestamp"):
                meta[k] = current["metadata"].get(k)
            meta["resourceVersion"] = str(next(self._versions))
            spec_changed = new.get("spec") != current.get("spec")
            meta["generation"] = current["metadata"].get("generation", 1) + (1 if spec_changed else 0)
            new["metadata"] = meta
            if "status" in current:
                new["status"] = current["status"]  # the status subresource is not written by a PUT
            self.objects[key].delete()
            self.objects[key].create(new)
            if spec_changed and request.resource == RAYSERVICES:
                self._changed[(request.namespace, request.name)] = time.monotonic()
            response = aiohttp.web.json_response(new)
            for warning in warnings:
                response.headers.add("Warning", f"299 - {json.dumps(warning)}")
            return response

    def _ray_cluster(self, key: tuple, rs: dict) -> tuple["RayPods", bool]:
        """The Ray cluster serving a RayService, as KubeRay's upgradeStrategy decides it, and whether an upgrade is
        pending. A change to `rayClusterConfig` under NewCluster (KubeRay's default) starts a second cluster beside
        the first and switches once all its pods run: on a fleet without room for both, never. Under None, KubeRay
        leaves the running cluster as it is. A serve config change is applied to the running cluster."""
        made = self._ray_pods.get(key)
        if made is None:
            made = self._ray_pods[key] = RayPods.of(rs)
        if made.cluster == _cluster_key(rs):
            if (old := self._pending.pop(key, None)) is not None:
                old.release()
            made.scale(rs)
            return made, False
        strategy = ((rs.get("spec") or {}).get("upgradeStrategy") or {}).get("type") or "NewCluster"
        if strategy != "NewCluster":
            return made, False
        pending = self._pending.get(key)
        if pending is None or pending.cluster != _cluster_key(rs):
            if pending is not None:
                pending.release()
            pending = self._pending[key] = RayPods.of(rs, fleet=made.fleet)
        placed_at = pending.place(self._fleet(pending))
        if placed_at is not None and time.monotonic() - placed_at >= self.ready_after:
            made.release()
            self._ray_pods[key] = self._pending.pop(key)
            return self._ray_pods[key], False
        return made, True

    def _operate(self, *, only: tuple | None = None) -> None:
        """The stand-in KubeRay: write each RayService's status (or only that of `(namespace, name)`) from how
        long ago its spec changed."""
        if not self.operator_enabled:
            return
        if only is not None:
            found = self._objects._objects.get((RAYSERVICES, *only))
            candidates = [] if found is None else [(only, found)]
        else:
            candidates = [((ns, name), obj) for (res, ns, name), obj in list(self.objects.items()) if res == RAYSERVICES]
        for (ns, name), obj in candidates:
            if obj.deleted:
                continue
            raw = obj.raw
            generation = raw.get("metadata", {}).get("generation", 1)
            apps = _app_names(raw.get("spec", {}).get("serveConfigV2") or "{}")
            made, upgrading = self._ray_cluster((ns, name), raw)
            placed_at = made.place(self._fleet(made))
            started = self._kubelet(made)
            if self._operated.get((ns, name)) != generation:
                # KubeRay writes a change's status at its next reconcile, not within the write: until then a read
                # shows the status of the spec before (observedGeneration behind), which readers must not take for
                # the new spec's.
                self._operated[(ns, name)] = generation
                continue
            # While a NewCluster upgrade waits, the old Ray cluster serves what it served.
            since = max(0 if upgrading else self._changed.get((ns, name), 0), placed_at or 0)
            # Ray's part: every Ray pod up, Serve places each stage's replicas on what the worker pods advertise
            unplaced = _unplaced(raw, made) if placed_at is not None and started else {}
            ready = placed_at is not None and started and not unplaced and \
                time.monotonic() - since >= self.ready_after
            app_status = ("DEPLOY_FAILED" if self.fail_apps else "RUNNING") if ready else "DEPLOYING"
            now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            serving = ready and not self.fail_apps
            status = {
                "observedGeneration": generation,
                "conditions": [{"type": "Ready", "status": "True" if serving else "False",
                                "reason": "RayServiceReady" if serving else "Initializing",
                                "message": "" if serving else "waiting for Serve", "lastTransitionTime": now},
                               {"type": "UpgradeInProgress", "status": "True" if upgrading else "False",
                                "reason": "PendingClusterExists" if upgrading else "NoPendingCluster",
                                "message": "", "lastTransitionTime": now}],
                "activeServiceStatus": {"applicationStatuses": {
                    # a failure is what Serve said for a bad engine setting (recorded), as KubeRay copies it
                    a: kuberay_deploy_failed(model_id=a) if app_status == "DEPLOY_FAILED" else
                    {"status": app_status, "message": "", **({"serveDeploymentStatuses": unplaced[a]}
                                                             if unplaced.get(a) else {})} for a in apps}},
                "numServeEndpoints": 1 if serving else 0,
            }
            if raw.get("status") != status:
                obj.patch({"status": None})
                obj.patch({"status": status})


    def _kubelet(self, made: "RayPods") -> bool:
        """Each placed pod's containers as its node's kubelet reports them: running and ready, or waiting for an
        image the registry does not hold, or failing as `container_faults` says for its pool; whether all run."""
        all_up = True
        for pod in made.pods:
            if pod["metadata"]["name"] not in made.placed:
                all_up = False
                continue
            pool = pod["metadata"]["labels"].get("tandem.dev/pool", "")
            statuses = [self._container_status(pod, c, self.container_faults.get(pool))
                        for c in pod["spec"].get("containers", [])]
            up = all(c["ready"] for c in statuses)
            all_up = all_up and up
            status = pod["status"]
            pulling = any(c["state"].get("waiting", {}).get("reason") == "ImagePullBackOff" for c in statuses)
            status["phase"] = "Pending" if pulling else "Running"  # a container that never started keeps it Pending
            status["containerStatuses"] = statuses
            status["conditions"] = [c for c in status["conditions"] if c["type"] != "Ready"] + [
                {"type": "Ready", "status": "True" if up else "False", "lastProbeTime": None,
                 "lastTransitionTime": _now()}]
            fault = self.container_faults.get(pool)
            if fault is not None and fault.log:
                self.previous_logs[(pod["metadata"]["namespace"], pod["metadata"]["name"])] = fault.log
        return all_up

    def _container_status(self, pod: dict, container: dict, fault: "ContainerFault | None") -> dict:
        image, name = container.get("image", ""), container.get("name", "")
        base = {"name": name, "image": image, "imageID": "", "restartCount": 0, "started": False, "ready": False}
        if self.registry is not None and image not in self.registry:
            # containerd's answer for a reference the registry does not have, as the kubelet keeps it once it
            # backs off (seen with public.ecr.aws in aquasecurity/starboard#1161; the "Back-off pulling image"
            # prefix is the kubelet's own, pkg/kubelet/images/image_manager.go).
            error = (f'rpc error: code = NotFound desc = failed to pull and unpack image "{image}": failed to '
                     f'resolve reference "{image}": {image}: not found')
            return {**base, "state": {"waiting": {"reason": "ImagePullBackOff",
                                                  "message": f'Back-off pulling image "{image}": ErrImagePull: '
                                                             f'{error}'}}}
        if fault is not None and fault.waiting:
            reason, message = fault.waiting
            return {**base, "state": {"waiting": {"reason": reason, "message": message}}}
        if fault is not None:
            ended = {"exitCode": fault.exit_code, "reason": fault.reason, "startedAt": _now(), "finishedAt": _now(),
                     "containerID": f"containerd://{uuid.uuid4().hex}"}
            uid = pod["metadata"]["uid"]
            return {**base, "restartCount": fault.restarts, "lastState": {"terminated": ended},
                    "state": {"waiting": {"reason": "CrashLoopBackOff", "message": (
                        f"back-off 2m40s restarting failed container={name} pod={pod['metadata']['name']}_"
                        f"{pod['metadata']['namespace']}({uid})")}}}
        return {**base, "imageID": f"{image}@sha256:{'0' * 64}", "started": True, "ready": True,
                "state": {"running": {"startedAt": _now()}}}


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@attrs.define(frozen=True)
class ContainerFault:
    """A pool's containers fail as a kubelet reports it: killed for memory (`oom`), or ending with `exit_code`
    after writing `log` (a crash loop), either way restarted `restarts` times and backing off (CrashLoopBackOff); or
    never started, waiting with any reason and message the kubelet gives (`waiting`)."""

    reason: str = "Error"
    exit_code: int = 1
    log: str = ""
    restarts: int = 4
    waiting: tuple[str, str] | None = None  # (reason, message)

    @classmethod
    def oom(cls) -> "ContainerFault":
        return cls(reason="OOMKilled", exit_code=137, restarts=2)

    @classmethod
    def crash(cls, log: str, *, exit_code: int = 1) -> "ContainerFault":
        return cls(reason="Error", exit_code=exit_code, log=log)


@attrs.define
class RayPods:
    """The pods of one Ray cluster of a RayService (one rayClusterConfig), and the nodes they may go to."""

    cluster: str  # the rayClusterConfig these pods run
    pods: list[dict]
    fleet: list[Node]  # the node groups made for this RayService (used when the cluster has no fixed fleet)
    placed: dict = attrs.field(factory=dict)  # pod name -> Node
    placed_at: float | None = None  # when the last pod was placed

    @classmethod
    def of(cls, rs: dict, *, fleet: list[Node] | None = None) -> "RayPods":
        made = cls(cluster=_cluster_key(rs), pods=[], fleet=[])
        made.scale(rs)
        made.fleet = fleet if fleet is not None else _node_groups_for(made.name(rs), made.pods)
        return made

    def name(self, rs: dict) -> str:
        """KubeRay names each RayCluster of a RayService apart (an upgrade runs two side by side)."""
        return f"{rs['metadata']['name']}-raycluster-{hashlib.sha256(self.cluster.encode()).hexdigest()[:5]}"

    def scale(self, rs: dict) -> None:
        """As many pods of each group as the RayService asks for (replicas × numOfHosts): KubeRay scales a worker
        group in place, adding pods (Pending until placed) or removing the last ones (their nodes freed)."""
        cluster, ns, name = rs.get("spec", {}).get("rayClusterConfig") or {}, rs["metadata"].get("namespace"), \
            self.name(rs)
        groups = [("headgroup", "head", 1, cluster.get("headGroupSpec") or {})] + [
            (g.get("groupName", "workers"), "worker", g.get("replicas", 1) * g.get("numOfHosts", 1), g)
            for g in cluster.get("workerGroupSpecs") or []]
        for group, node_type, count, spec in groups:
            mine = [p for p in self.pods if p["metadata"]["labels"]["ray.io/group"] == group]
            for pod in mine[count:]:
                if (node := self.placed.pop(pod["metadata"]["name"], None)) is not None:
                    release(node, pod["spec"])
                self.pods.remove(pod)
            template = spec.get("template") or {}
            for i in range(len(mine), count):
                pod_name = f"{name}-{'head' if node_type == 'head' else group + '-worker'}-{i}"
                labels = {**(template.get("metadata") or {}).get("labels", {}), "ray.io/cluster": name,
                          "ray.io/group": group, "ray.io/node-type": node_type, "ray.io/is-ray-node": "yes"}
                self.pods.append({"apiVersion": "v1", "kind": "Pod",
                                  "metadata": {"name": pod_name, "namespace": ns, "labels": labels,
                                               "uid": str(uuid.uuid4())},
                                  "spec": copy.deepcopy(template.get("spec") or {}),
                                  "status": {"phase": "Pending", "conditions": []}})

    def place(self, nodes: list[Node]) -> float | None:
        """Schedule every pod not placed yet on `nodes`; when all are, the time the last one was."""
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        for pod in self.pods:
            if pod["metadata"]["name"] in self.placed:
                continue
            node, message = schedule(pod["spec"], nodes)
            if node is None:
                pod["status"] = {"phase": "Pending", "qosClass": "Guaranteed", "conditions": [
                    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
                     "lastProbeTime": None, "lastTransitionTime": now}]}
                continue
            self.placed[pod["metadata"]["name"]] = node
            pod["spec"]["nodeName"] = node.name
            pod["status"] = {"phase": "Running", "qosClass": "Guaranteed", "conditions": [
                {"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": now},
                {"type": "Ready", "status": "True", "lastProbeTime": None, "lastTransitionTime": now}]}
            if len(self.placed) == len(self.pods):
                self.placed_at = time.monotonic()
        return self.placed_at if len(self.placed) == len(self.pods) else None

    def release(self) -> None:
        """The pods are gone: what they held on their nodes is free again."""
        for pod in self.pods:
            if (node := self.placed.pop(pod["metadata"]["name"], None)) is not None:
                release(node, pod["spec"])


def _node_groups_for(name: str, pods: list[dict]) -> list[Node]:
    """The nodes an autoscaler brings a RayService on a cluster of no known nodes (the kubernetes target's): for
    each worker pod, one of the instance type its nodeSelector names, as EKS would run it (tainted as Tandem taints
    GPU and EFA node groups, with the hugepages Tandem's EFA node groups reserve); and an untainted CPU node for the
    head. A pod pinned otherwise (by node group name, as the eks target pins them) gets no node here: the eks target's
    nodes are its node groups' (`KubeRayEmulator.eks`)."""
    nodes = [cpu_node(f"{name}-head-node")]
    for pod in pods:
        selector = pod["spec"].get("nodeSelector") or {}
        itype = selector.get(INSTANCE_TYPE_LABEL)
        if pod["metadata"]["labels"]["ray.io/node-type"] == "worker" and itype in INSTANCE_TYPES:
            nodes.append(eks_node(f"{pod['metadata']['name']}-node", itype, labels=selector,
                                  hugepages_2mi=EFA_HUGEPAGES if INSTANCE_TYPES[itype].has_efa else ""))
    return nodes


def _unplaced(rs: dict, made: "RayPods") -> dict[str, dict]:
    """Ray Serve's status of each PD stage whose replicas Ray cannot place on the Ray cluster's worker pods, by
    application (tests.support.ray_rules plays Ray: the bundles Ray Serve LLM asks for each replica, what each worker
    pod advertises on its node's GPU, Ray's strategies, Serve's own message). Empty once every replica is placed."""
    spec = rs.get("spec") or {}
    # the worker groups of the Ray cluster these pods belong to (the serving one, while a NewCluster upgrade waits)
    groups = {g.get("groupName"): g for g in json.loads(made.cluster).get("workerGroupSpecs") or []}
    free = []
    for pod in made.pods:
        labels = pod["metadata"]["labels"]
        node = made.placed.get(pod["metadata"]["name"])
        if labels.get("ray.io/node-type") != "worker" or node is None or labels.get("ray.io/group") not in groups:
            continue
        instance = INSTANCE_TYPES.get(node.labels.get(INSTANCE_TYPE_LABEL, ""))
        free.append(ray_rules.pod_resources(groups[labels["ray.io/group"]],
                                            gpu_name=instance.gpu_product if instance else None))
    out: dict[str, dict] = {}
    for app in yaml.safe_load(spec.get("serveConfigV2") or "{}").get("applications") or []:
        for stage in ("prefill", "decode"):
            config = (app.get("args") or {}).get(f"{stage}_config")
            if not config:
                continue
            bundles, strategy = ray_rules.replica_bundles(config)
            autoscaling = (config.get("deployment_config") or {}).get("autoscaling_config") or {}
            left = 0
            for _ in range(autoscaling.get("min_replicas", 1)):
                where = ray_rules.place(bundles, strategy, free)
                if where is None:
                    left += 1
                    continue
                for bundle, i in zip(bundles, where):
                    for key, amount in bundle.items():
                        free[i][key] = free[i].get(key, 0) - amount
            if left:
                deployment = f"{stage.capitalize()}:{config['model_loading_config']['model_id']}"
                out.setdefault(app["name"], {})[deployment] = {
                    "status": "UPDATING", "message": ray_rules.pending_allocation_message(
                        deployment=deployment, app=app["name"], replicas=left, required=bundles, available={})}
    return out


def _cluster_key(rs: dict) -> str:
    """What makes a Ray cluster another one: its rayClusterConfig without the worker groups' sizes, which KubeRay
    leaves out of its own hash (ray-operator's generateHashWithoutReplicasAndWorkersToDelete) and scales in place."""
    cluster = copy.deepcopy((rs.get("spec") or {}).get("rayClusterConfig") or {})
    for group in cluster.get("workerGroupSpecs") or []:
        for size in ("replicas", "minReplicas", "maxReplicas"):
            group.pop(size, None)
    return json.dumps(cluster, sort_keys=True)


@functools.lru_cache(maxsize=4096)
def _app_names(serve_config: str) -> tuple[str, ...]:
    """The Serve applications a RayService's config names (parsed once per config: every fetch operates on
    every RayService, and a bench holds hundreds)."""
    return tuple(a["name"] for a in yaml.safe_load(serve_config).get("applications", []))


class EmulatorThread:
    """Serves a kmock handler over HTTP on 127.0.0.1 from a thread with its own event loop."""

    def __init__(self, handler: kmock.RawHandler):
        self.handler = handler
        self.url = ""
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="k8s-emulator", daemon=True)

    def _run(self) -> None:
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # one line per request drowns the logs
        self._loop = asyncio.new_event_loop()
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with self.handler, kmock.Server(self.handler) as server:
            self.url = f"http://127.0.0.1:{server.port}"
            if hasattr(self.handler, "base_url"):
                self.handler.base_url = self.url
            self._ready.set()
            await self._stop.wait()

    def __enter__(self) -> "EmulatorThread":
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the Kubernetes emulator did not start")
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


def main() -> None:
    parser = argparse.ArgumentParser(description="Serve the Kubernetes emulator (with KubeRay) until stopped.")
    parser.add_argument("--token", required=True, help="the bearer token clients must send")
    parser.add_argument("--port", type=int, default=0, help="0: any free port")
    parser.add_argument("--ready-after", type=float, default=0.3)
    parser.add_argument("--kuberay-version", default=DEFAULT_KUBERAY_VERSION, help="whose RayService CRD prunes writes")
    args = parser.parse_args()
    handler = KubeRayEmulator(token=args.token, ready_after=args.ready_after, kuberay_version=args.kuberay_version)
    handler.install_kuberay()

    async def serve() -> None:
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
        async with handler, kmock.Server(handler, port=args.port or None) as server:
            handler.base_url = f"http://127.0.0.1:{server.port}"
            print(handler.base_url, flush=True)
            await asyncio.Event().wait()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass


def kubeconfig_text(*, url: str, token: str, context: str = "emulator") -> str:
    """A kubeconfig for the emulator, as the text a secret reference would hold."""
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": context,
        "clusters": [{"name": context, "cluster": {"server": url}}],
        "users": [{"name": "tandem", "user": {"token": token}}],
        "contexts": [{"name": context, "context": {"cluster": context, "user": "tandem"}}],
    })


if __name__ == "__main__":
    main()
