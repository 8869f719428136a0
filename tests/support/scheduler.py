"""The kube-scheduler's fit rules as Tandem's pods meet them, and EKS nodes as the kubelet reports them.

A model of the default profile's filter plugins, in their order (kube-scheduler `pkg/scheduler/framework/plugins`):
NodeUnschedulable, TaintToleration ("node(s) had untolerated taint {key: value}", not resolvable by preemption),
NodeAffinity for `nodeSelector` ("node(s) didn't match Pod's node affinity/selector", not resolvable), and
NodeResourcesFit ("Insufficient <resource>" for each resource short on that node, resolvable by preemption). A node
stops at the first plugin that rejects it. A pod that fits nowhere gets the scheduler's FitError text: the reasons
counted over nodes, sorted, then what preemption found (`framework.FitError.Error`, `preemption.Evaluator`):

    0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available: 3 No
    preemption victims found for incoming pod.

Nodes: `eks_node` gives a node of a catalog instance type with what its kubelet reports allocatable on EKS's
AL2023 AMI (kube-reserved CPU 6% of the first core, 1% of the second, 0.5% of the next two, 0.25% of the rest;
kube-reserved memory 11 MiB per pod slot + 255 MiB; eviction threshold 100 MiB; max pods 110 below 30 vCPUs,
else 250), the GPUs of the NVIDIA device plugin, the EFA devices of the EFA device plugin, and hugepages the node's
user data reserves (which come out of its memory).
"""
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal

from kubernetes.utils import parse_quantity

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


def _kubelet_allocatable(vcpus: int, memory_gib: int, hugepages: Decimal) -> dict[str, Decimal]:
    max_pods = 110 if vcpus < 30 else 250
    cores = Decimal(vcpus)
    reserved_cpu = (Decimal("0.06") + Decimal("0.01") * min(max(cores - 1, 0), 1)
                    + Decimal("0.005") * min(max(cores - 2, 0), 2) + Decimal("0.0025") * max(cores - 4, 0))
    memory = Decimal(memory_gib * GI) - (11 * max_pods + 255 + 100) * MI - hugepages
    allocatable = {"cpu": cores - reserved_cpu, "memory": memory, "pods": Decimal(max_pods),
                   "ephemeral-storage": Decimal(18 * GI)}
    if hugepages:
        allocatable["hugepages-2Mi"] = hugepages
    return allocatable


def eks_node(name: str, instance_type: str, *, gpu_plugin: bool = True, efa_plugin: bool = True,
             hugepages_2mi: str = "", taints: list[dict] | None = None, labels: dict | None = None) -> Node:
    """A node of a managed node group of `instance_type` (catalog figures), tainted as Tandem's eks target taints
    GPU and EFA node groups unless `taints` says otherwise. `gpu_plugin`/`efa_plugin`: whether the NVIDIA and EFA
    device plugins run on it (without them the node advertises no GPUs or EFA devices)."""
    it = INSTANCE_TYPES[instance_type]
    allocatable = _kubelet_allocatable(it.vcpus, it.memory_gib,
                                       parse_quantity(hugepages_2mi) if hugepages_2mi else Decimal(0))
    if it.gpus and gpu_plugin:
        allocatable["nvidia.com/gpu"] = Decimal(it.gpus)
    if it.has_efa and efa_plugin:
        allocatable["vpc.amazonaws.com/efa"] = Decimal(it.efa_interfaces)
    if taints is None:
        taints = ([dict(TANDEM_GPU_TAINT)] if it.gpus else []) + ([dict(TANDEM_EFA_TAINT)] if it.has_efa else [])
    return Node(name=name, labels={"node.kubernetes.io/instance-type": instance_type,
                                   "kubernetes.io/hostname": name, **(labels or {})},
                taints=taints, allocatable=allocatable)


def cpu_node(name: str, *, instance_type: str = "m6i.2xlarge", vcpus: int = 8, memory_gib: int = 32) -> Node:
    """An untainted general-purpose node (where the Ray head goes)."""
    return Node(name=name, labels={"node.kubernetes.io/instance-type": instance_type, "kubernetes.io/hostname": name},
                taints=[], allocatable=_kubelet_allocatable(vcpus, memory_gib, Decimal(0)))


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


def node_reasons(node: Node, pod_spec: dict, wanted: Counter) -> list[str]:
    """Why `node` cannot take the pod (empty: it fits), as the first filter plugin that rejects it words it."""
    if node.unschedulable and not _tolerated({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
                                             pod_spec.get("tolerations") or []):
        return ["node(s) were unschedulable"]
    for taint in node.taints:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and \
                not _tolerated(taint, pod_spec.get("tolerations") or []):
            return [f"node(s) had untolerated taint {{{taint['key']}: {taint.get('value', '')}}}"]
    if any(node.labels.get(k) != v for k, v in (pod_spec.get("nodeSelector") or {}).items()):
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
