"""The kube-scheduler's fit rules as Tandem's pods meet them, and EKS nodes as the kubelet reports them.

A model of the default profile's filter plugins, in their order (kube-scheduler `pkg/scheduler/framework/plugins`):
NodeUnschedulable, TaintToleration ("node(s) had untolerated taint {key: value}", not resolvable by preemption),
NodeAffinity for `nodeSelector` ("node(s) didn't match Pod's node affinity/selector", not resolvable), and
NodeResourcesFit ("Insufficient <resource>" for each resource short on that node, resolvable by preemption). A node
stops at the first plugin that rejects it. A pod that fits nowhere gets the scheduler's FitError text: the reasons
counted over nodes, sorted, then what preemption found (`framework.FitError.Error`, `preemption.Evaluator`):

    0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available: 3 No
    preemption victims found for incoming pod.

Nodes: `eks_node` gives a node of an EC2 instance type with what its kubelet reports allocatable on EKS's AL2023 AMI
(awslabs/amazon-eks-ami nodeadm, `internal/kubelet/config.go`: kube-reserved CPU 6% of the first core, 1% of the
second, 0.5% of the next two, 0.25% of the rest; kube-reserved memory 11 MiB per pod slot + 255 MiB; eviction
threshold 100 MiB), its pod slots as EKS computes them for a managed node group (`max-pods-calculator.sh`: the
default network card's ENIs × (IPv4 addresses per ENI − 1) + 2, at most 110 up to 30 vCPUs and 250 above), the GPUs
of the NVIDIA device plugin, the EFA devices of the EFA device plugin, and hugepages the node's user data reserves
(which come out of its memory). The instance's vCPUs, memory, GPUs, ENIs and EFA interfaces are EC2's own
DescribeInstanceTypes answers, as moto records them (`moto/ec2/resources/instance_types.json`).
"""
import functools
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal

from kubernetes.utils import parse_quantity
from moto.utilities.utils import load_resource

from deployments.catalog import INSTANCE_TYPES

MI = 1024 ** 2
GI = 1024 ** 3
TANDEM_GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
TANDEM_EFA_TAINT = {"key": "vpc.amazonaws.com/efa", "value": "true", "effect": "NoSchedule"}
UNRESOLVABLE = ("node(s) had untolerated taint", "node(s) didn't match", "node(s) were unschedulable")


@dataclass
class Node:
    """A node as the scheduler sees it: labels, taints, allocatable, and what the pods placed on it use."""

    name: str
    labels: dict[str, str]
    taints: list[dict]
    allocatable: dict[str, Decimal]
    unschedulable: bool = False
    used: Counter = field(default_factory=Counter)

    def as_object(self) -> dict:
        """The Node as the API serves it."""
        return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.name, "labels": dict(self.labels)},
                "spec": {"taints": list(self.taints), **({"unschedulable": True} if self.unschedulable else {})},
                "status": {"allocatable": {k: _quantity_text(k, v) for k, v in self.allocatable.items()}}}


def _quantity_text(name: str, value: Decimal) -> str:
    if name == "cpu":
        return f"{int(value * 1000)}m"
    if name == "memory" or name.startswith("hugepages-"):
        return f"{int(value) // 1024}Ki"
    return str(int(value))


@dataclass(frozen=True)
class Instance:
    """What EC2 says of an instance type (DescribeInstanceTypes), and the pod slots EKS gives its nodes."""

    vcpus: int
    memory_mib: int
    gpus: int
    efa_interfaces: int  # the most EFA interfaces an instance can have (a launch template attaches them)
    arch: str  # as Kubernetes names it: amd64, arm64
    max_pods: int


@functools.cache
def _ec2_instance_types() -> dict:
    """moto's record of EC2's DescribeInstanceTypes (read as moto.ec2 reads it, without loading all of moto.ec2)."""
    return load_resource("ec2/resources/instance_types.json")


def instance(instance_type: str) -> Instance:
    """EC2's figures for `instance_type` (KeyError for a type EC2 does not have)."""
    info = _ec2_instance_types()[instance_type]
    network = info["NetworkInfo"]
    card = network.get("DefaultNetworkCardIndex", 0)
    enis = next((c["MaximumNetworkInterfaces"] for c in network.get("NetworkCards", [])
                 if c.get("NetworkCardIndex") == card), network["MaximumNetworkInterfaces"])
    vcpus = info["VCpuInfo"]["DefaultVCpus"]
    ceiling = 250 if vcpus > 30 else 110
    return Instance(vcpus=vcpus, memory_mib=info["MemoryInfo"]["SizeInMiB"],
                    gpus=sum(g["Count"] for g in (info.get("GpuInfo") or {}).get("Gpus", [])),
                    efa_interfaces=(network.get("EfaInfo") or {}).get("MaximumEfaInterfaces", 0),
                    arch={"x86_64": "amd64", "arm64": "arm64"}[info["ProcessorInfo"]["SupportedArchitectures"][0]],
                    max_pods=min(enis * (network["Ipv4AddressesPerInterface"] - 1) + 2, ceiling))


def kubelet_allocatable(shape: Instance, hugepages: Decimal = Decimal(0)) -> dict[str, Decimal]:
    """What the kubelet of an EKS AL2023 node of this shape reports allocatable (before any device plugin)."""
    cores = Decimal(shape.vcpus)
    reserved_cpu = (Decimal("0.06") + Decimal("0.01") * min(max(cores - 1, 0), 1)
                    + Decimal("0.005") * min(max(cores - 2, 0), 2) + Decimal("0.0025") * max(cores - 4, 0))
    memory = Decimal(shape.memory_mib * MI) - (11 * shape.max_pods + 255 + 100) * MI - hugepages
    allocatable = {"cpu": cores - reserved_cpu, "memory": memory, "pods": Decimal(shape.max_pods),
                   "ephemeral-storage": Decimal(18 * GI)}
    if hugepages:
        allocatable["hugepages-2Mi"] = hugepages
    return allocatable


def eks_node(name: str, instance_type: str, *, gpu_plugin: bool = True, efa_plugin: bool = True,
             hugepages_2mi: str = "", taints: list[dict] | None = None, labels: dict | None = None) -> Node:
    """A node of a managed node group of `instance_type`, tainted as Tandem's eks target taints GPU and EFA node
    groups unless `taints` says otherwise, with every EFA interface the instance can have. `gpu_plugin`/`efa_plugin`:
    whether the NVIDIA and EFA device plugins run on it (without them the node advertises no GPUs or EFA devices)."""
    shape = instance(instance_type)
    allocatable = kubelet_allocatable(shape, parse_quantity(hugepages_2mi) if hugepages_2mi else Decimal(0))
    efa = instance_type in INSTANCE_TYPES and INSTANCE_TYPES[instance_type].has_efa  # where Tandem uses EFA
    if shape.gpus and gpu_plugin:
        allocatable["nvidia.com/gpu"] = Decimal(shape.gpus)
    if efa and efa_plugin:
        allocatable["vpc.amazonaws.com/efa"] = Decimal(shape.efa_interfaces)
    if taints is None:
        taints = ([dict(TANDEM_GPU_TAINT)] if shape.gpus else []) + ([dict(TANDEM_EFA_TAINT)] if efa else [])
    return Node(name=name, labels={"node.kubernetes.io/instance-type": instance_type,
                                   "kubernetes.io/hostname": name, **(labels or {})},
                taints=taints, allocatable=allocatable)


def cpu_node(name: str, *, instance_type: str = "m6i.2xlarge") -> Node:
    """An untainted general-purpose node (where the Ray head goes)."""
    return Node(name=name, labels={"node.kubernetes.io/instance-type": instance_type, "kubernetes.io/hostname": name},
                taints=[], allocatable=kubelet_allocatable(instance(instance_type)))


def pod_requests(pod_spec: dict) -> Counter:
    """What a pod asks of a node: its containers' requests summed (limits where no request is given, as the API
    server defaults them), at least the largest init container's, and one pod slot."""
    def of(container: dict) -> Counter:
        resources = container.get("resources") or {}
        wanted = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        return Counter({k: parse_quantity(v) for k, v in wanted.items()})

    total: Counter = Counter()
    for c in pod_spec.get("containers", []):
        total.update(of(c))
    for c in pod_spec.get("initContainers", []):
        for k, v in of(c).items():
            total[k] = max(total[k], v)
    total["pods"] += 1
    return total


def _tolerated(taint: dict, tolerations: list[dict]) -> bool:
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        if t.get("operator", "Equal") == "Exists":
            if not t.get("key") or t["key"] == taint["key"]:
                return True
        elif t.get("key") == taint["key"] and t.get("value", "") == taint.get("value", ""):
            return True
    return False


def untolerated(taints: list[dict], pod_spec: dict) -> dict | None:
    """The first NoSchedule/NoExecute taint the pod does not tolerate (TaintToleration), or None."""
    return next((t for t in taints if t.get("effect") in ("NoSchedule", "NoExecute") and
                 not _tolerated(t, pod_spec.get("tolerations") or [])), None)


def _holds(expression: dict, labels: dict) -> bool:
    key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    if operator in ("Gt", "Lt") and key in labels and labels[key].lstrip("-").isdigit():
        return int(labels[key]) > int(values[0]) if operator == "Gt" else int(labels[key]) < int(values[0])
    return False


def selects(pod_spec: dict, labels: dict) -> bool:
    """Whether a node with these labels is one the pod may go to (NodeAffinity): its nodeSelector, and its required
    node affinity, whose terms are ORed and whose expressions are ANDed (an empty term matches nothing)."""
    if any(labels.get(k) != v for k, v in (pod_spec.get("nodeSelector") or {}).items()):
        return False
    terms = ((((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
              .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms"))
    return not terms or any(t.get("matchExpressions") and all(_holds(e, labels) for e in t["matchExpressions"])
                            for t in terms)


def node_reasons(node: Node, pod_spec: dict, wanted: Counter) -> list[str]:
    """Why `node` cannot take the pod (empty: it fits), as the first filter plugin that rejects it words it."""
    if node.unschedulable and not _tolerated({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
                                             pod_spec.get("tolerations") or []):
        return ["node(s) were unschedulable"]
    if (taint := untolerated(node.taints, pod_spec)) is not None:
        return [f"node(s) had untolerated taint {{{taint['key']}: {taint.get('value', '')}}}"]
    if not selects(pod_spec, node.labels):
        return ["node(s) didn't match Pod's node affinity/selector"]
    return [f"Insufficient {name}" for name, amount in sorted(wanted.items())
            if amount > node.allocatable.get(name, Decimal(0)) - node.used[name]]


def schedule(pod_spec: dict, nodes: list[Node]) -> tuple[Node | None, str]:
    """Place a pod: the first node it fits (its use recorded), or None and the scheduler's FitError message."""
    wanted = pod_requests(pod_spec)
    reasons: Counter = Counter()
    preemption: Counter = Counter()
    for node in nodes:
        found = node_reasons(node, pod_spec, wanted)
        if not found:
            node.used.update(wanted)
            return node, ""
        reasons.update(found)
        unresolvable = any(r.startswith(UNRESOLVABLE) for r in found)
        # Every pod here has the same (default) priority, so preemption finds no victim where it could help.
        preemption["Preemption is not helpful for scheduling" if unresolvable else
                   "No preemption victims found for incoming pod"] += 1
    total = len(nodes)
    histogram = ", ".join(sorted(f"{n} {r}" for r, n in reasons.items()))
    victims = ", ".join(sorted(f"{n} {r}" for r, n in preemption.items()))
    message = f"0/{total} nodes are available:" + (f" {histogram}." if histogram else "")
    if total:
        message += f" preemption: 0/{total} nodes are available: {victims}."
    return None, message


def release(node: Node, pod_spec: dict) -> None:
    """A pod placed on `node` is gone: its requests are free again."""
    node.used.subtract(pod_requests(pod_spec))
