"""The DaemonSets on the nodes of an EKS cluster set up as docs/install.md says, as pod specs: what each asks of a node
(its requests and a pod slot) and where it runs (its node affinity and tolerations, judged by the scheduler's rules).

Where each comes from:
- aws-node, the VPC CNI (EKS add-on; aws/amazon-vpc-cni-k8s `charts/aws-vpc-cni` v1.23.1, values.yaml and
  templates/daemonset.yaml): `resources.requests.cpu: 25m` for the aws-node container, and for the
  aws-eks-nodeagent container and the init container, whose own resources are `{}` and fall back to it; tolerates
  every taint; Linux amd64/arm64 nodes that are not Fargate;
- kube-proxy (EKS add-on, as an EKS 1.28 cluster runs it, image eks/kube-proxy:v1.28.1-minimal-eksbuild.1):
  `requests.cpu: 100m`, tolerates every taint, the same node affinity;
- eks-pod-identity-agent (EKS add-on; aws/eks-pod-identity-agent `charts/eks-pod-identity-agent` values.yaml):
  `resources: {}`, tolerates every taint, Linux amd64/arm64 cloud nodes;
- the NVIDIA device plugin (NVIDIA/k8s-device-plugin `deployments/helm/nvidia-device-plugin` values.yaml):
  `resources: {}`; its chart's node affinity wants Node Feature Discovery labels, which docs/install.md replaces
  with deploy/cluster/nvidia-device-plugin-values.yaml;
- the EFA device plugin (aws/eks-charts `stable/aws-efa-k8s-device-plugin` values.yaml): `requests: cpu 10m,
  memory 20Mi`, node affinity on its supported instance types (shortened here to the catalog's EFA types), the
  tolerations of deploy/cluster/efa-device-plugin-values.yaml beside CriticalAddonsOnly.
CoreDNS and metrics-server are Deployments, not DaemonSets: not here.
"""
import copy
import functools
from collections import Counter
from pathlib import Path

import yaml

from deployments.catalog import INSTANCE_TYPES
from tests.support.scheduler import pod_requests, selects, untolerated

VALUES = Path(__file__).resolve().parents[2] / "deploy" / "cluster"
EVERY_TAINT = [{"operator": "Exists"}]
LINUX_NOT_FARGATE = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchExpressions": [
        {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
        {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64", "arm64"]},
        {"key": "eks.amazonaws.com/compute-type", "operator": "NotIn", "values": ["fargate"]}]}]}}}
NVIDIA_CHART_DEFAULTS = {  # NVIDIA/k8s-device-plugin deployments/helm/nvidia-device-plugin/values.yaml
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "feature.node.kubernetes.io/pci-10de.present", "operator": "In",
                               "values": ["true"]}]},
        {"matchExpressions": [{"key": "feature.node.kubernetes.io/cpu-model.vendor_id", "operator": "In",
                               "values": ["NVIDIA"]}]},
        {"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]}]}}},
    "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"},
                    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
}
NVIDIA_PLUGIN = "nvdp-nvidia-device-plugin"
EFA_PLUGIN = "efa-aws-efa-k8s-device-plugin"


def _values(name: str) -> dict:
    return yaml.safe_load((VALUES / name).read_text())


def _requests(**amounts: str) -> dict:
    return {"resources": {"requests": amounts}} if amounts else {}


def nvidia_device_plugin_pod(*, documented: bool = True) -> dict:
    """The NVIDIA device plugin's pod: the chart's defaults, or with deploy/cluster/nvidia-device-plugin-values.yaml."""
    pod = copy.deepcopy(NVIDIA_CHART_DEFAULTS)
    if documented:
        pod.update(_values("nvidia-device-plugin-values.yaml"))
    return {**pod, "containers": [{"name": "nvidia-device-plugin-ctr"}]}


def efa_device_plugin_pod() -> dict:
    """AWS's EFA device plugin's pod with deploy/cluster/efa-device-plugin-values.yaml."""
    efa_types = sorted(n for n, i in INSTANCE_TYPES.items() if i.has_efa)
    return {"tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"},
                            *_values("efa-device-plugin-values.yaml")["tolerations"]],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "node.kubernetes.io/instance-type", "operator": "In",
                                       "values": efa_types}]}]}}},
            "containers": [{"name": "aws-efa-k8s-device-plugin", **_requests(cpu="10m", memory="20Mi")}]}


@functools.cache
def documented() -> dict[str, dict]:
    """Every DaemonSet's pod on a cluster installed as docs/install.md says, by DaemonSet name."""
    return {
        "aws-node": {"tolerations": EVERY_TAINT, "affinity": LINUX_NOT_FARGATE,
                     "initContainers": [{"name": "aws-vpc-cni-init", **_requests(cpu="25m")}],
                     "containers": [{"name": "aws-node", **_requests(cpu="25m")},
                                    {"name": "aws-eks-nodeagent", **_requests(cpu="25m")}]},
        "kube-proxy": {"tolerations": EVERY_TAINT, "affinity": LINUX_NOT_FARGATE,
                       "containers": [{"name": "kube-proxy", **_requests(cpu="100m")}]},
        "eks-pod-identity-agent": {"tolerations": EVERY_TAINT, "affinity": LINUX_NOT_FARGATE,
                                   "containers": [{"name": "eks-pod-identity-agent"}]},
        NVIDIA_PLUGIN: nvidia_device_plugin_pod(),
        EFA_PLUGIN: efa_device_plugin_pod(),
    }


def daemonsets_on(*, labels: dict, taints: list[dict], daemonsets: dict[str, dict] | None = None) -> dict[str, dict]:
    """The DaemonSets (name → pod spec) whose pods run on a node with these labels and taints: their node affinity
    matches it and they tolerate its taints (the DaemonSet controller's own check)."""
    return {name: pod for name, pod in (daemonsets if daemonsets is not None else documented()).items()
            if selects(pod, labels) and untolerated(taints, pod) is None}


def requested(pods: dict[str, dict]) -> Counter:
    """What these DaemonSets' pods take of a node, pod slots included (as the scheduler counts a node's use)."""
    return sum((pod_requests(pod) for pod in pods.values()), Counter())
