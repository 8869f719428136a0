"""The Kubernetes side of the preflight: KubeRay (operator and the CRD's served fields), the NVIDIA and EFA device
plugins against the taints and labels of Tandem's GPU nodes, what those nodes advertise, metrics-server, the VPC
CNI's version (EKS), and whether each team's namespace can be created (a server-side dry run)."""
import json
import re
from collections.abc import Callable

import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from kubernetes.utils.quantity import parse_quantity
from packaging.version import InvalidVersion, Version

from deployments.catalog import INSTANCE_TYPES, RUNTIMES
from deployments.manifests import MANAGED_BY, POOL_LABEL, TEAM_LABEL, namespace_name, template
from deployments.models import Team
from workers.preflight.lines import FAIL, PASS, UNVERIFIED, CheckLine, Unreadable
from workers.preflight.scheduling import affinity_text, kube_taints, node_admits, taint_text, taint_tolerated
from workers.targets.eks import NODEGROUP_LABEL, nodegroup_taints
from workers.targets.kubernetes import TIMEOUT

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
HELM_NVIDIA = ("helm upgrade --install nvdp nvdp/nvidia-device-plugin --version 0.17.1 -n kube-system "
               "-f deploy/cluster/nvidia-device-plugin-values.yaml")
HEAD_NODES_FIX = ("aws eks create-nodegroup --cluster-name $CLUSTER_NAME --nodegroup-name system --instance-types "
                  "m5.2xlarge --disk-size 100 --scaling-config minSize=2,maxSize=4,desiredSize=2 --subnets $SUBNET_IDS "
                  "--node-role $SYSTEM_NODE_ROLE_ARN")
# Node disk a Ray head needs beyond what pods request (the scheduler does not count images): the runtime image, whose
# CUDA, PyTorch, vLLM and Ray make about 10 GB compressed (vllm-project/vllm#7609: vllm/vllm-openai alone is 9 GB),
# kept by containerd twice, as compressed layers and as the unpacked snapshot, plus Ray's logs and spill under
# /tmp/ray. EKS's default node disk (CreateNodegroup diskSize: 20 GiB) leaves about 17 GiB allocatable: the pull
# fills it ("no space left on device") and the node goes to DiskPressure, evicting what runs there.
HEAD_DISK_GIB = 40
GIB = 2**30
HELM_EFA = ("helm upgrade --install efa eks/aws-efa-k8s-device-plugin -n kube-system "
            "-f deploy/cluster/efa-device-plugin-values.yaml")
# The Amazon VPC CNI runs as the aws-node DaemonSet (amazon-vpc-cni-k8s, config/master/aws-k8s-cni.yaml; the
# vpc-cni add-on keeps the name), its aws-node container on the amazon-k8s-cni image, tagged v<version>[-eksbuild.N].
# Tandem's EFA node groups put EFA-only interfaces on every network card but the first
# (workers.targets.eks_launch_template.efa_interfaces), which it handles from 1.18.5 (EKS user guide, "EFA and
# EFA-only interfaces").
VPC_CNI_DAEMONSET, VPC_CNI_IMAGE, VPC_CNI_EFA_ONLY = "aws-node", "amazon-k8s-cni", Version("1.18.5")
VPC_CNI_FIX = ("aws eks update-addon --cluster-name $CLUSTER_NAME --addon-name vpc-cni --addon-version "
               "$(aws eks describe-addon-versions --addon-name vpc-cni --kubernetes-version $K8S_VERSION "
               "--query 'addons[0].addonVersions[0].addonVersion' --output text)")


def version_of(text: str) -> Version | None:
    """`v1.5.1` or an image `quay.io/kuberay/operator:v1.5.1` → 1.5.1; None when it names no version."""
    tag = text.rsplit(":", 1)[-1] if ":" in text else text
    try:
        return Version(tag.removeprefix("v").split("@")[0])
    except InvalidVersion:
        return None


def pod_request(spec: dict, resource: str):
    """What a pod requests of `resource` as the scheduler counts it: the larger of its containers' sum and its largest
    init container, plus its overhead (k8s.io/kubernetes pkg/api/v1/resource PodRequests)."""
    def asked(containers):
        return [parse_quantity(((c.get("resources") or {}).get("requests") or {}).get(resource, "0"))
                for c in containers or []]

    request = max([sum(asked(spec.get("containers")))] + asked(spec.get("initContainers")))
    return request + parse_quantity((spec.get("overhead") or {}).get(resource, "0"))


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


class KubernetesChecks:
    """The checks that read the Kubernetes API; `self.target` is the cluster's driver (its API client)."""

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
        prefix = self.target.config.nodegroup_prefix
        return [(name, {"node.kubernetes.io/instance-type": name, "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64", NODEGROUP_LABEL: f"{prefix}d1-prefill", POOL_LABEL: "prefill",
                        "eks.amazonaws.com/capacityType": "ON_DEMAND"},
                 kube_taints(nodegroup_taints(i)))
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
            refused = [taint_text(t) for t in taints if t.get("effect") in ("NoSchedule", "NoExecute")
                       and not taint_tolerated(t, pod.get("tolerations") or [])]
            if refused:
                problems.setdefault(f"does not tolerate {', '.join(refused)}", []).append(what)
            if not node_admits(pod, labels):
                problems.setdefault(f"its node affinity {affinity_text(pod)} excludes them", []).append(what)
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

    def ray_head(self) -> CheckLine:
        """The Ray head (k8s_templates/rayservice.yaml) runs on the cluster's own nodes, not on Tandem's GPU node
        groups: one node it tolerates must have its CPU and memory free (allocatable, less what the pods already
        there request; an m5.xlarge's 4 vCPU and 16 GiB leave about 3.9 CPU and 14.5 GiB allocatable) and
        HEAD_DISK_GIB of ephemeral storage free for the runtime image and Ray's logs."""
        head = template("rayservice.yaml")["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]
        requests = head["containers"][0]["resources"]["requests"]
        wants = {"cpu": parse_quantity(requests["cpu"]), "memory": parse_quantity(requests["memory"]),
                 "ephemeral-storage": parse_quantity(requests.get("ephemeral-storage", "0")) + HEAD_DISK_GIB * GIB}
        core = k8s.CoreV1Api(self.target.api)
        found = self._k8s("listing nodes", core.list_node) or {}
        used = self._requested_by_node()
        seen = []
        for n in found.get("items") or []:
            taints = [t for t in (n.get("spec") or {}).get("taints") or [] if t.get("effect") != "PreferNoSchedule"]
            if not all(taint_tolerated(t, head.get("tolerations") or []) for t in taints):
                continue
            name = n["metadata"]["name"]
            have = (n.get("status") or {}).get("allocatable") or {}
            free = {r: parse_quantity(have.get(r, "0")) - used.get(name, {}).get(r, 0) for r in wants}
            short = [r for r in wants if free[r] < wants[r]]
            text = (f"{name}{self._nodegroup_of(n)} has {float(free['cpu']):g} CPU, {free['memory'] / GIB:.1f} GiB "
                    f"and {free['ephemeral-storage'] / GIB:.1f} GiB of ephemeral storage free (allocatable less "
                    "what its pods request)")
            if not short:
                return CheckLine("ray-head", PASS, f"{text} for the Ray head's {requests['cpu']} CPU, "
                                 f"{requests['memory']} and {HEAD_DISK_GIB} GiB of disk (its image and logs).")
            seen.append((len(short), -free["ephemeral-storage"], f"{text}: short of {' and '.join(short)}"))
        evidence = "; ".join(t for *_, t in sorted(seen)[:3]) if seen else "the cluster has none"
        disk = any("ephemeral-storage" in t for *_, t in seen)
        return CheckLine("ray-head", FAIL, f"No node without Tandem's GPU taints can hold the Ray head "
                         f"({requests['cpu']} CPU, {requests['memory']} requested, and {HEAD_DISK_GIB} GiB of disk "
                         f"for the runtime image and its logs): {evidence}. Each deployment's head would stay "
                         "Pending" + (", or fill its node's disk pulling the image (DiskPressure evicts what "
                                      "runs there)" if disk else "") + ".",
                         f"{HEAD_NODES_FIX} (8 vCPU, 32 GiB and a 100 GiB disk: room for Ray heads and their image "
                         "beside the control plane; a node group's disk size cannot change, so create this one and "
                         "delete the old; docs/install.md, step 1)")

    @staticmethod
    def _nodegroup_of(node: dict) -> str:
        group = (node["metadata"].get("labels") or {}).get(NODEGROUP_LABEL)
        return f" (node group {group})" if group else ""

    def _requested_by_node(self) -> dict[str, dict]:
        """{node: what the pods bound to it and not finished request} (a pod asks for the larger of its containers'
        sum and its largest init container, as the scheduler counts it, plus its overhead)."""
        pods = self._k8s("listing pods", k8s.CoreV1Api(self.target.api).list_pod_for_all_namespaces) or {}
        used: dict[str, dict] = {}
        for pod in pods.get("items") or []:
            spec, phase = pod.get("spec") or {}, (pod.get("status") or {}).get("phase")
            if not spec.get("nodeName") or phase in ("Succeeded", "Failed"):
                continue
            total = used.setdefault(spec["nodeName"], {})
            for resource in ("cpu", "memory", "ephemeral-storage"):
                total[resource] = total.get(resource, 0) + pod_request(spec, resource)
        return used

    def vpc_cni(self) -> CheckLine:
        """The VPC CNI's version: EFA-only interfaces need 1.18.5 or newer."""
        ds = self._k8s(f"reading the {VPC_CNI_DAEMONSET} DaemonSet",
                       k8s.AppsV1Api(self.target.api).read_namespaced_daemon_set, VPC_CNI_DAEMONSET, "kube-system")
        images = [c.get("image", "") for c in ((ds or {}).get("spec", {}).get("template", {}).get("spec", {})
                                               .get("containers") or []) if VPC_CNI_IMAGE in c.get("image", "")]
        found = [re.search(r":v?(\d+\.\d+\.\d+)", image) for image in images]
        if not images or not all(found):
            what = f"kube-system/{VPC_CNI_DAEMONSET} runs {', '.join(images)}" if images else \
                f"No DaemonSet kube-system/{VPC_CNI_DAEMONSET} runs an {VPC_CNI_IMAGE} image"
            return CheckLine("vpc-cni", UNVERIFIED, f"{what}: its version is unknown, and Tandem's EFA node groups "
                             f"need the Amazon VPC CNI {VPC_CNI_EFA_ONLY} or newer (EFA-only interfaces).", VPC_CNI_FIX)
        version = min(Version(m[1]) for m in found)
        evidence = f"kube-system/{VPC_CNI_DAEMONSET} runs {', '.join(images)}"
        if version < VPC_CNI_EFA_ONLY:
            return CheckLine("vpc-cni", FAIL, f"{evidence}: Tandem's EFA node groups put EFA-only interfaces on every "
                             f"network card but the first, which the VPC CNI handles from {VPC_CNI_EFA_ONLY} on.",
                             VPC_CNI_FIX)
        return CheckLine("vpc-cni", PASS, f"{evidence} ({VPC_CNI_EFA_ONLY} or newer handles EFA-only interfaces).")

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
        prefix = self.target.config.namespace_prefix
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
