"""The preflight: what a real cluster must have before a deployment on it can serve, each check a line with pass or
fail, the evidence read from the cluster (or AWS), and the fix.

It reads only, through the same clients the drivers use (the worker's Kubernetes credentials and AWS identity), so
what it sees is what a deployment will meet. Checks of the Kubernetes side run on `eks` and `kubernetes` clusters;
the AWS side (IAM, subnets, the EFA security group, the node-group quota) on `eks` only. docs/install.md is the list
of steps that make every check pass.

A check that cannot be decided here says so (`unverified`) rather than passing: e.g. IAM's policy simulator where
the AWS endpoint does not offer it.
"""
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass

import urllib3
from botocore.exceptions import BotoCoreError, ClientError
from botocore.parsers import ResponseParserError
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from packaging.version import InvalidVersion, Version

from deployments.catalog import INSTANCE_TYPES, RUNTIMES
from deployments.manifests import MANAGED_BY, POOL_LABEL, TEAM_LABEL, namespace_name, template
from deployments.models import ClusterCheck, Team
from deployments.services.cluster_checks import cluster_check_record
from workers import clients
from workers.targets.base import PermanentError, TransientError
from workers.targets.eks import NODEGROUP_LABEL, EksTarget, nodegroup_taints
from workers.targets.kubernetes import TIMEOUT, KubernetesTarget

PASS, FAIL, UNVERIFIED = "pass", "fail", "unverified"

# Fields of the RayService CRD Tandem's manifests rely on, where they sit in its schema (under spec), and the
# first KubeRay release that serves them. An older CRD prunes them without a word (see FACTS.md, 2026-12-04).
KUBERAY_FIELDS = {
    "workerGroupSpecs[].resources": (("rayClusterConfig", "workerGroupSpecs", "[]", "resources"), "1.5.0"),
    "authOptions": (("rayClusterConfig", "authOptions"), "1.5.1"),
}
KUBERAY_OPERATOR_SELECTOR = "app.kubernetes.io/name=kuberay-operator"  # the kuberay-operator chart's label
KUBERAY_CRD = "rayservices.ray.io"
METRICS_APISERVICE = "v1beta1.metrics.k8s.io"
# Each device plugin, found by its image, and the taints of the nodes it must run on.
DEVICE_PLUGINS = {
    "nvidia-device-plugin": {"image": "k8s-device-plugin", "resource": "nvidia.com/gpu", "efa_only": False},
    "efa-device-plugin": {"image": "aws-efa-k8s-device-plugin", "resource": "vpc.amazonaws.com/efa",
                          "efa_only": True},
}
NODEGROUP_QUOTA = 30  # EKS's default "managed node groups per cluster" (Service Quotas L-6D54EA21)
NODEGROUPS_PER_DEPLOYMENT = 2  # prefill and decode
# What the driver calls in AWS (deploy/iam/eks-driver-policy.json grants exactly these; tests/deploy/test_iam.py),
# simulated with the context the policy's conditions read.
DRIVER_ACTIONS = ("eks:DescribeCluster", "eks:ListNodegroups", "eks:CreateNodegroup", "eks:TagResource",
                  "eks:DescribeNodegroup", "eks:UpdateNodegroupConfig", "eks:DeleteNodegroup", "iam:PassRole",
                  "ec2:DescribeSubnets", "ec2:DescribeSecurityGroups", "iam:SimulatePrincipalPolicy")
DRIVER_CONTEXT = (("aws:RequestTag/tandem.dev/managed-by", "tandem"),
                  ("aws:ResourceTag/tandem.dev/managed-by", "tandem"),
                  ("iam:PassedToService", "eks.amazonaws.com"))
# What a GPU node needs: join the cluster (AmazonEKSWorkerNodePolicy), pull images (ECR read), its pods' IPs (CNI).
NODE_ACTIONS = ("ec2:DescribeInstances", "eks:DescribeCluster", "ecr:GetAuthorizationToken", "ecr:BatchGetImage",
                "ecr:GetDownloadUrlForLayer", "ec2:AssignPrivateIpAddresses")
HELM_NVIDIA = ("helm upgrade --install nvdp nvdp/nvidia-device-plugin --version 0.17.1 -n kube-system "
               "-f deploy/cluster/nvidia-device-plugin-values.yaml")
HELM_EFA = ("helm upgrade --install efa eks/aws-efa-k8s-device-plugin -n kube-system "
            "-f deploy/cluster/efa-device-plugin-values.yaml")


@dataclass(frozen=True)
class CheckLine:
    """One check's outcome: `status` pass, fail or unverified; what was seen; what to do about a failure."""

    name: str
    status: str
    evidence: str
    fix: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


class Unreadable(Exception):
    """A call the check needs was refused or failed: the check fails with this as its evidence."""


# --- pure rules: taints, tolerations, node affinity (Kubernetes' scheduling semantics) ----------------------
def taint_tolerated(taint: dict, tolerations: list[dict]) -> bool:
    """Whether one of `tolerations` tolerates `taint` (k8s.io/api/core/v1 Toleration.ToleratesTaint)."""
    for t in tolerations or []:
        if t.get("effect") and t["effect"] != taint["effect"]:
            continue
        operator = t.get("operator") or "Equal"
        if not t.get("key"):
            if operator == "Exists":
                return True
            continue
        if t["key"] != taint["key"]:
            continue
        if operator == "Exists" or (operator == "Equal" and (t.get("value") or "") == (taint.get("value") or "")):
            return True
    return False


def _expression_matches(expr: dict, labels: dict) -> bool:
    key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt") and key in labels and values:
        try:
            have, want = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    return False


def node_admits(pod_spec: dict, labels: dict) -> bool:
    """Whether a pod's nodeSelector and required node affinity admit a node with these labels (terms are ORed,
    the expressions in a term ANDed)."""
    if any(labels.get(k) != v for k, v in (pod_spec.get("nodeSelector") or {}).items()):
        return False
    required = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms")
    if not terms:
        return True
    return any(all(_expression_matches(e, labels) for e in term.get("matchExpressions") or []) for term in terms)


def _affinity_text(pod_spec: dict) -> str:
    required = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = [" and ".join(f"{e.get('key')} {e.get('operator')} {','.join(e.get('values') or [])}".strip()
                          for e in term.get("matchExpressions") or [])
             for term in required.get("nodeSelectorTerms") or []]
    selector = [f"{k}={v}" for k, v in (pod_spec.get("nodeSelector") or {}).items()]
    return " or ".join(f"({t})" for t in terms) + (f" nodeSelector {', '.join(selector)}" if selector else "")


def _kube_taints(eks_taints: list[dict]) -> list[dict]:
    """EKS's NO_SCHEDULE form as the node carries it (NoSchedule)."""
    effects = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute", "PREFER_NO_SCHEDULE": "PreferNoSchedule"}
    return [{"key": t["key"], "value": t.get("value", ""), "effect": effects[t["effect"]]} for t in eks_taints]


def _taint_text(taint: dict) -> str:
    return f"{taint['key']}={taint.get('value', '')}:{taint['effect']}"


def version_of(text: str) -> Version | None:
    """`v1.5.1` or an image `quay.io/kuberay/operator:v1.5.1` → 1.5.1; None when it names no version."""
    tag = text.rsplit(":", 1)[-1] if ":" in text else text
    try:
        return Version(tag.removeprefix("v").split("@")[0])
    except InvalidVersion:
        return None


def _schema_has(schema: dict, path: tuple[str, ...]) -> bool:
    node = schema
    for step in ("spec", *path):
        node = node.get("items") if step == "[]" else (node.get("properties") or {}).get(step)
        if not isinstance(node, dict):
            return False
    return True


def kuberay_needed(kind: str) -> Version:
    """The newest of the runtimes' minimum KubeRay and the releases that serve the fields Tandem sets."""
    floors = [r.kuberay_min for r in RUNTIMES.values() if kind in r.target_kinds and r.kuberay_min]
    return max(Version(v) for v in floors + [since for _, since in KUBERAY_FIELDS.values()])


# --- the checks ------------------------------------------------------------------------------------------------
class Preflight:
    """Runs every check that applies to a cluster's kind; each check is a method returning its CheckLine."""

    def __init__(self, target: KubernetesTarget):
        self.target = target
        self.cluster = target.cluster
        self.is_eks = isinstance(target, EksTarget)
        self._session = None

    # reading
    def _k8s(self, doing: str, fn: Callable, *args, **kwargs) -> dict | None:
        """A Kubernetes read as the raw JSON the API server sent (None: 404)."""
        try:
            response = fn(*args, _request_timeout=TIMEOUT, _preload_content=False, **kwargs)
        except ApiException as e:
            if e.status == 404:
                return None
            if e.status in (401, 403):
                raise Unreadable(f"Kubernetes refused {doing} ({e.status}): give the worker's identity the read "
                                 "rights of the tandem-driver ClusterRole (deploy/base/rbac.yaml).") from None
            raise Unreadable(f"Kubernetes answered {e.status} while {doing}.") from None
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise Unreadable(f"Cannot reach the Kubernetes API while {doing}: {type(e).__name__}.") from None
        return json.loads(response.data or b"{}")

    def _aws_client(self, service: str, *, attempts: int | None = None):
        if self._session is None:
            self._session = clients.aws_session(region=self.cluster.config["region"])
        return clients.aws_client(self._session, service, endpoint_url=self.cluster.config.get("aws_endpoint_url"),
                                  attempts=attempts)

    def _aws(self, doing: str, fn: Callable, **kwargs) -> dict:
        try:
            return fn(**kwargs)
        except ClientError as e:
            error = e.response.get("Error", {})
            raise Unreadable(f"AWS refused {doing}: {error.get('Code', '')}: {error.get('Message', '')}") from None
        except BotoCoreError as e:
            raise Unreadable(f"AWS failed {doing}: {e}") from None

    # running
    def run(self) -> list[CheckLine]:
        checks = [self.kuberay_operator, self.kuberay_crd, self.nvidia_device_plugin, self.efa_device_plugin,
                  self.allocatable, self.metrics_server, self.team_namespaces]
        if self.is_eks:
            checks += [self.driver_iam, self.node_role_iam, self.subnets, self.efa_security_group,
                       self.nodegroup_quota]
        lines = []
        for check in checks:
            name = check.__name__.replace("_", "-")
            try:
                lines.append(check())
            except (Unreadable, PermanentError, TransientError) as e:
                lines.append(CheckLine(name, FAIL, str(e), "Fix what the evidence names, then run the checks again."))
        return lines

    # KubeRay
    def _kuberay_needed(self) -> Version:
        return kuberay_needed(self.cluster.kind)

    def kuberay_operator(self) -> CheckLine:
        needed = self._kuberay_needed()
        found = self._k8s("listing the KubeRay operator's Deployment",
                          k8s.AppsV1Api(self.target.api).list_deployment_for_all_namespaces,
                          label_selector=KUBERAY_OPERATOR_SELECTOR)
        fix = (f"helm upgrade --install kuberay-operator kuberay/kuberay-operator --version {needed} "
               "-n kuberay-system --create-namespace")
        items = (found or {}).get("items") or []
        if not items:
            return CheckLine("kuberay-operator", FAIL, f"No Deployment labelled {KUBERAY_OPERATOR_SELECTOR}: the "
                             "KubeRay operator is not installed (nothing would act on a RayService).", fix)
        images = [c.get("image", "") for d in items for c in d["spec"]["template"]["spec"].get("containers", [])]
        versions = [v for v in map(version_of, images) if v is not None]
        ready = sum((d.get("status") or {}).get("readyReplicas") or 0 for d in items)
        evidence = f"{', '.join(images)}; {ready} ready replica(s)"
        if not versions or min(versions) < needed:
            return CheckLine("kuberay-operator", FAIL, f"{evidence}: Tandem needs KubeRay {needed} or newer.", fix)
        if ready < 1:
            return CheckLine("kuberay-operator", FAIL, f"{evidence}: the operator is not running.",
                             "kubectl -n kuberay-system describe deploy kuberay-operator, and fix what it shows.")
        return CheckLine("kuberay-operator", PASS, evidence)

    def kuberay_crd(self) -> CheckLine:
        crd = self._k8s(f"reading the CRD {KUBERAY_CRD}",
                        k8s.ApiextensionsV1Api(self.target.api).read_custom_resource_definition, KUBERAY_CRD)
        needed = self._kuberay_needed()
        fix = (f"kubectl apply --server-side --force-conflicts -k "
               f"'github.com/ray-project/kuberay/ray-operator/config/crd?ref=v{needed}' (helm upgrade does not "
               "update CRDs)")
        if crd is None:
            return CheckLine("kuberay-crd", FAIL, f"The CRD {KUBERAY_CRD} is missing.", fix)
        version = next((v for v in crd["spec"].get("versions", []) if v.get("name") == "v1" and v.get("served")),
                       None)
        if version is None:
            return CheckLine("kuberay-crd", FAIL, f"{KUBERAY_CRD} does not serve ray.io/v1.", fix)
        schema = (version.get("schema") or {}).get("openAPIV3Schema") or {}
        missing = [f"{field} (KubeRay {since})" for field, (path, since) in KUBERAY_FIELDS.items()
                   if not _schema_has(schema, path)]
        if missing:
            return CheckLine("kuberay-crd", FAIL, f"{KUBERAY_CRD} v1 lacks {', '.join(missing)}: the API server "
                             "drops these fields from every RayService without a word.", fix)
        return CheckLine("kuberay-crd", PASS, f"{KUBERAY_CRD} v1 serves {', '.join(KUBERAY_FIELDS)}.")

    # nodes and device plugins
    def _nodes(self) -> list[dict]:
        """The nodes Tandem's pools run on: labelled with a pool, or of an instance type the catalog knows."""
        found = self._k8s("listing nodes", k8s.CoreV1Api(self.target.api).list_node) or {}
        gpu_types = {name for name, i in INSTANCE_TYPES.items() if i.gpus}
        return [n for n in found.get("items") or []
                if POOL_LABEL in (n["metadata"].get("labels") or {})
                or (n["metadata"].get("labels") or {}).get("node.kubernetes.io/instance-type") in gpu_types]

    def _model_nodes(self) -> list[tuple[str, dict, list[dict]]]:
        """(what, labels, taints) of the nodes Tandem's node groups make, one per GPU instance type, as EKS labels
        and taints them (workers.targets.eks); real ones where they exist."""
        real = [(f"node {n['metadata']['name']}", n["metadata"].get("labels") or {}, n["spec"].get("taints") or [])
                for n in self._nodes()]
        if real or not self.is_eks:
            return real
        prefix = self.cluster.config.get("nodegroup_prefix", "tandem-")
        return [(name, {"node.kubernetes.io/instance-type": name, "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64", NODEGROUP_LABEL: f"{prefix}d1-prefill", POOL_LABEL: "prefill",
                        "eks.amazonaws.com/capacityType": "ON_DEMAND"},
                 _kube_taints(nodegroup_taints(i)))
                for name, i in INSTANCE_TYPES.items() if i.gpus]

    def _device_plugin(self, name: str) -> CheckLine:
        plugin = DEVICE_PLUGINS[name]
        fix = HELM_EFA if plugin["efa_only"] else HELM_NVIDIA
        found = self._k8s("listing DaemonSets", k8s.AppsV1Api(self.target.api).list_daemon_set_for_all_namespaces)
        sets = [d for d in (found or {}).get("items") or []
                if any(plugin["image"] in c.get("image", "") and not (
                    plugin["image"] == "k8s-device-plugin" and "aws-efa" in c.get("image", ""))
                       for c in d["spec"]["template"]["spec"].get("containers", []))]
        if not sets:
            return CheckLine(name, FAIL, f"No DaemonSet runs a {plugin['image']} image: no node advertises "
                             f"{plugin['resource']}, so pods asking for it never schedule.", fix)
        ds = sets[0]
        where = f"DaemonSet {ds['metadata'].get('namespace')}/{ds['metadata']['name']}"
        pod = ds["spec"]["template"]["spec"]
        nodes = [(what, labels, taints) for what, labels, taints in self._model_nodes()
                 if not plugin["efa_only"] or INSTANCE_TYPES.get(
                     labels.get("node.kubernetes.io/instance-type"), INSTANCE_TYPES["cpu"]).has_efa]
        problems: dict[str, list[str]] = {}  # what is wrong → the nodes (or instance types) it is wrong on
        for what, labels, taints in nodes:
            refused = [_taint_text(t) for t in taints if t.get("effect") in ("NoSchedule", "NoExecute")
                       and not taint_tolerated(t, pod.get("tolerations") or [])]
            if refused:
                problems.setdefault(f"does not tolerate {', '.join(refused)}", []).append(what)
            if not node_admits(pod, labels):
                problems.setdefault(f"its node affinity {_affinity_text(pod)} excludes them", []).append(what)
        if problems:
            shown = "; ".join(f"{problem} (on {', '.join(where_[:4])}{', …' if len(where_) > 4 else ''})"
                              for problem, where_ in problems.items())
            return CheckLine(name, FAIL, f"{where} never runs on Tandem's GPU nodes: {shown}.",
                             f"{fix} (tolerations for Tandem's taints, no node affinity that Tandem's nodes fail)")
        status = ds.get("status") or {}
        desired, ready = status.get("desiredNumberScheduled", 0), status.get("numberReady", 0)
        if ready < desired:
            return CheckLine(name, FAIL, f"{where}: {ready} of {desired} pods ready.",
                             f"kubectl -n {ds['metadata'].get('namespace')} describe ds {ds['metadata']['name']}")
        return CheckLine(name, PASS, f"{where} tolerates Tandem's taints and admits its nodes "
                                     f"({len(nodes)} checked); {ready} of {desired} pods ready.")

    def nvidia_device_plugin(self) -> CheckLine:
        return self._device_plugin("nvidia-device-plugin")

    def efa_device_plugin(self) -> CheckLine:
        return self._device_plugin("efa-device-plugin")

    def allocatable(self) -> CheckLine:
        nodes = self._nodes()
        if not nodes:
            return CheckLine("allocatable", UNVERIFIED, "No GPU node of Tandem's exists yet; checked once one does.")
        problems, seen = [], []
        for n in nodes:
            itype = (n["metadata"].get("labels") or {}).get("node.kubernetes.io/instance-type", "")
            instance = INSTANCE_TYPES.get(itype)
            if instance is None:
                continue
            have = (n.get("status") or {}).get("allocatable") or {}
            gpus, efa = int(have.get("nvidia.com/gpu", 0)), int(have.get("vpc.amazonaws.com/efa", 0))
            seen.append(f"{n['metadata']['name']} ({itype}): nvidia.com/gpu {gpus}"
                        + (f", vpc.amazonaws.com/efa {efa}" if instance.has_efa else ""))
            if gpus < instance.gpus:
                problems.append(f"{n['metadata']['name']} ({itype}) has nvidia.com/gpu {gpus}, not {instance.gpus}")
            if instance.has_efa and efa < instance.efa_interfaces:
                problems.append(f"{n['metadata']['name']} ({itype}) has vpc.amazonaws.com/efa {efa}, not "
                                f"{instance.efa_interfaces}")
        if problems:
            return CheckLine("allocatable", FAIL, "; ".join(problems) + ".",
                             "Make the device plugins run on these nodes (the checks above), and give EFA types a "
                             "launch template with one EFA interface per network card.")
        return CheckLine("allocatable", PASS, "; ".join(seen) + ".")

    def metrics_server(self) -> CheckLine:
        svc = self._k8s(f"reading the APIService {METRICS_APISERVICE}",
                        k8s.ApiregistrationV1Api(self.target.api).read_api_service, METRICS_APISERVICE)
        fix = ("kubectl apply -f https://github.com/kubernetes-sigs/metrics-server/releases/download/v0.7.2/"
               "components.yaml (on EKS: aws eks create-addon --addon-name metrics-server)")
        if svc is None:
            return CheckLine("metrics-server", FAIL, f"No APIService {METRICS_APISERVICE}: the gateway's "
                             "HorizontalPodAutoscaler has no CPU metrics and never scales.", fix)
        available = next((c for c in (svc.get("status") or {}).get("conditions") or []
                          if c.get("type") == "Available"), {})
        if available.get("status") != "True":
            return CheckLine("metrics-server", FAIL, f"APIService {METRICS_APISERVICE} is not available: "
                             f"{available.get('message') or available.get('reason') or 'no status'}.", fix)
        return CheckLine("metrics-server", PASS, f"APIService {METRICS_APISERVICE} is available.")

    def team_namespaces(self) -> CheckLine:
        core = k8s.CoreV1Api(self.target.api)
        prefix = self.cluster.config.get("namespace_prefix", "tandem-")
        exist, creatable, problems = 0, 0, []
        for slug in Team.objects.order_by("slug").values_list("slug", flat=True):
            name = namespace_name(prefix=prefix, team_slug=slug)
            current = self._k8s(f"reading namespace {name}", core.read_namespace, name)
            if current is not None:
                labels = current["metadata"].get("labels") or {}
                if all(labels.get(k) == v for k, v in {**MANAGED_BY, TEAM_LABEL: slug}.items()):
                    exist += 1
                else:
                    problems.append(f"{name} exists and is not Tandem's for team {slug}")
                continue
            body = template("namespace.yaml")
            body["metadata"] = {"name": name, "labels": {**MANAGED_BY, TEAM_LABEL: slug}}
            try:
                core.create_namespace(body, dry_run="All", _request_timeout=TIMEOUT)
                creatable += 1
            except ApiException as e:
                problems.append(f"creating {name} was refused ({e.status}: {e.reason})")
            except (urllib3.exceptions.HTTPError, OSError) as e:
                raise Unreadable(f"Cannot reach the Kubernetes API while creating {name}: {type(e).__name__}.") \
                    from None
        if problems:
            return CheckLine("team-namespaces", FAIL, "; ".join(problems) + ".",
                             "Remove or rename a namespace that is not Tandem's (or set the cluster's "
                             "namespace_prefix), and let the worker create namespaces (deploy/base/rbac.yaml).")
        return CheckLine("team-namespaces", PASS, f"{exist} team namespace(s) exist and are Tandem's; {creatable} "
                                                  "can be created (server-side dry run).")

    # AWS
    def _simulate(self, name: str, principal: str, actions: tuple[str, ...], context=(), resources=None) -> CheckLine:
        iam = self._aws_client("iam", attempts=1)
        kwargs = {"PolicySourceArn": principal, "ActionNames": list(actions)}
        if context:
            kwargs["ContextEntries"] = [{"ContextKeyName": k, "ContextKeyValues": [v], "ContextKeyType": "string"}
                                        for k, v in context]
        if resources:
            kwargs["ResourceArns"] = resources
        try:
            results = iam.simulate_principal_policy(**kwargs)["EvaluationResults"]
        except (ClientError, BotoCoreError, ResponseParserError) as e:
            reason = str(e).splitlines()[0][:200]
            return CheckLine(name, UNVERIFIED, f"IAM could not simulate {principal}'s policies "
                             f"(iam:SimulatePrincipalPolicy): {type(e).__name__}: {reason}",
                             "Allow the worker's role iam:SimulatePrincipalPolicy on itself and on the node role "
                             "(deploy/iam/eks-driver-policy.json), then run the checks again.")
        denied = sorted({r["EvalActionName"] for r in results if r.get("EvalDecision") != "allowed"})
        if denied:
            return CheckLine(name, FAIL, f"{principal} is not allowed {', '.join(denied)}.",
                             "Attach the policy docs/install.md names for this role.")
        return CheckLine(name, PASS, f"{principal} is allowed {', '.join(actions)}.")

    def driver_iam(self) -> CheckLine:
        caller = self._aws("reading the worker's identity (sts:GetCallerIdentity)",
                           self._aws_client("sts").get_caller_identity)["Arn"]
        principal = caller
        if ":assumed-role/" in caller:  # the session of a role: simulate the role
            account = caller.split(":")[4]
            principal = self.cluster.config.get("role_arn") or \
                f"arn:aws:iam::{account}:role/{caller.split(':assumed-role/')[1].split('/')[0]}"
        return self._simulate("driver-iam", principal, DRIVER_ACTIONS, DRIVER_CONTEXT)

    def node_role_iam(self) -> CheckLine:
        role = self.cluster.config.get("node_role_arn")
        if not role:
            return CheckLine("node-role-iam", FAIL, "The cluster has no node_role_arn: EKS refuses node groups "
                             "without a node role.", "Register the cluster with node_role_arn (docs/install.md, 2).")
        buckets = self._s3_sources()
        actions = NODE_ACTIONS + (("s3:GetObject", "s3:ListBucket") if buckets else ())
        line = self._simulate("node-role-iam", role, actions)
        if buckets and line.status != PASS:
            return CheckLine(line.name, line.status, f"{line.evidence} (model sources: {', '.join(buckets)})",
                             line.fix)
        return line

    def _s3_sources(self) -> list[str]:
        sources = self.cluster.config.get("model_sources") or {}
        uris = list(sources.get("s3") or []) + [u for t in (sources.get("teams") or {}).values()
                                                  for u in t.get("s3") or []]
        return sorted(set(uris))

    def subnets(self) -> CheckLine:
        ids = list(self.cluster.config.get("subnet_ids") or [])
        fix = "Register the cluster with subnet_ids: private subnets of one Availability Zone."
        if not ids:
            return CheckLine("subnets", FAIL, "The cluster has no subnet_ids.", fix)
        found = self._aws("describing the node subnets (ec2:DescribeSubnets)",
                          self._aws_client("ec2").describe_subnets, SubnetIds=ids)["Subnets"]
        zones: dict[str, list[str]] = {}
        for s in found:
            zones.setdefault(s["AvailabilityZone"], []).append(s["SubnetId"])
        evidence = "; ".join(f"{z}: {', '.join(sorted(s))}" for z, s in sorted(zones.items()))
        if len(zones) > 1:
            zone, subnets = max(zones.items(), key=lambda kv: len(kv[1]))
            return CheckLine("subnets", FAIL, f"The node subnets span {len(zones)} Availability Zones ({evidence}): "
                             "EFA does not cross zones, and KV between prefill and decode would.",
                             f"Keep the subnets of one zone, e.g. {zone}: subnet_ids {json.dumps(sorted(subnets))}.")
        return CheckLine("subnets", PASS, f"One Availability Zone: {evidence}.")

    def efa_security_group(self) -> CheckLine:
        info = self.target._active_cluster()
        vpc = info.get("resourcesVpcConfig") or {}
        ids = [g for g in [vpc.get("clusterSecurityGroupId"), *(vpc.get("securityGroupIds") or [])] if g]
        if not ids:
            return CheckLine("efa-security-group", FAIL, "The EKS cluster names no security group.",
                             "Give the cluster a security group that lets its members reach each other.")
        groups = self._aws("describing the cluster's security groups (ec2:DescribeSecurityGroups)",
                           self._aws_client("ec2").describe_security_groups, GroupIds=ids)["SecurityGroups"]

        def self_all(rules: list[dict], group: str) -> bool:
            return any(r.get("IpProtocol") == "-1" and any(p.get("GroupId") == group
                                                          for p in r.get("UserIdGroupPairs") or [])
                       for r in rules)

        good = [g["GroupId"] for g in groups if self_all(g.get("IpPermissions") or [], g["GroupId"])
                and self_all(g.get("IpPermissionsEgress") or [], g["GroupId"])]
        if good:
            return CheckLine("efa-security-group", PASS, f"{good[0]} lets all traffic in from and out to itself.")
        sg = ids[0]
        return CheckLine("efa-security-group", FAIL, f"None of {', '.join(ids)} allows all traffic in from and out "
                         "to itself: EFA traffic between the nodes is dropped.",
                         f"aws ec2 authorize-security-group-ingress --group-id {sg} --protocol -1 --source-group {sg}; "
                         f"aws ec2 authorize-security-group-egress --group-id {sg} "
                         f"--ip-permissions 'IpProtocol=-1,UserIdGroupPairs=[{{GroupId={sg}}}]'")

    def nodegroup_quota(self) -> CheckLine:
        eks, names, token = self.target.eks, [], None
        while True:
            page = self._aws("listing node groups (eks:ListNodegroups)", eks.list_nodegroups,
                             clusterName=self.target.eks_name, **({"nextToken": token} if token else {}))
            names += page.get("nodegroups") or []
            token = page.get("nextToken")
            if not token:
                break
        left = NODEGROUP_QUOTA - len(names)
        evidence = f"{len(names)} of {NODEGROUP_QUOTA} node groups used: room for {max(left, 0) // 2} deployment(s)."
        if left < NODEGROUPS_PER_DEPLOYMENT:
            return CheckLine("nodegroup-quota", FAIL, evidence, "Delete unused node groups, or ask AWS for more "
                             "(Service Quotas: Amazon EKS, Managed node groups per cluster).")
        return CheckLine("nodegroup-quota", PASS, evidence)


def cluster_preflight(cluster, *, api=None) -> list[CheckLine]:
    """Every check that applies to this cluster, in order (a Ray cluster has none: it is not Kubernetes)."""
    if cluster.kind == "ray":
        return []
    target = EksTarget(cluster, api=api) if cluster.kind == "eks" else KubernetesTarget(cluster, api=api)
    return Preflight(target).run()


def cluster_check_run(*, check_id: int) -> None:
    """Run a requested preflight and record it; a failure of the run itself is recorded as its error."""
    run = ClusterCheck.objects.select_related("cluster").get(pk=check_id)
    if run.status != ClusterCheck.Status.RUNNING:
        return  # a redelivered message: the run is recorded already
    try:
        lines = [line.to_dict() for line in cluster_preflight(run.cluster)]
    except (PermanentError, TransientError) as e:
        cluster_check_record(check_id=check_id, lines=[], error=str(e))
        return
    cluster_check_record(check_id=check_id, lines=lines)
