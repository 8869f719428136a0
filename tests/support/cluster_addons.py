"""What a real cluster holds once its add-ons are installed, as the API server would hold it, written into the
Kubernetes emulator through the real `kubernetes` client (objects, then their status, as the controllers write it).

Shapes, and where each comes from:
- the RayService CRD: KubeRay's own, per release (`tests/support/kuberay_crds/<version>/ray.io_rayservices.yaml`);
- the KubeRay operator Deployment: the kuberay-operator chart's labels (`app.kubernetes.io/name: kuberay-operator`)
  and image (`quay.io/kuberay/operator:v<version>`);
- the NVIDIA and EFA device plugin DaemonSets: their charts' pods, with or without the values in deploy/cluster
  (tests/support/eks_daemonsets.py says where each comes from);
- metrics-server's APIService: kubernetes-sigs/metrics-server components.yaml (`v1beta1.metrics.k8s.io`);
- the VPC CNI: the aws-node DaemonSet of aws/amazon-vpc-cni-k8s (config/master/aws-k8s-cni.yaml) on its
  amazon-k8s-cni image, tagged as EKS's vpc-cni add-on tags it (`v<version>-eksbuild.<n>`);
- a GPU node of a Tandem node group: the labels EKS puts on managed node group nodes, the taints of
  workers/targets/eks.py::nodegroup_taints, and allocatable from the device plugins;
- Tandem's runtime image in ECR: an image manifest of Docker's schema 2, which ECR names by the sha256 of its bytes.
"""
import copy
import functools
import hashlib
import json
from pathlib import Path

import boto3
import yaml
from kubernetes import client as k8s

from deployments.catalog import INSTANCE_TYPES
from tests.support.eks_daemonsets import EFA_PLUGIN, NVIDIA_PLUGIN, efa_device_plugin_pod, nvidia_device_plugin_pod
from tests.support.moto_server import eks_cluster_create
from tests.support.structural_pruning import KUBERAY_CRDS
from workers.targets.eks import nodegroup_taints

KINDS = {  # what the emulator serves beside KubeRay: (kind, namespaced, subresources)
    "apiextensions.k8s.io/v1/customresourcedefinitions": ("CustomResourceDefinition", False, []),
    "apps/v1/deployments": ("Deployment", True, ["status"]),
    "apps/v1/daemonsets": ("DaemonSet", True, ["status"]),
    "v1/nodes": ("Node", False, ["status"]),
    "v1/pods": ("Pod", True, ["status"]),
    "apiregistration.k8s.io/v1/apiservices": ("APIService", False, ["status"]),
}
REGION = "us-west-2"


def emulator_client(emulator, *, token: str = "k8s-aws-v1.seeding") -> k8s.ApiClient:
    """The real client against the emulator, as the cluster's administrator (any EKS-style token)."""
    configuration = k8s.Configuration()
    configuration.host = emulator.base_url
    configuration.api_key = {"authorization": f"Bearer {token}"}
    return k8s.ApiClient(configuration)


def install_kinds(emulator) -> None:
    """Declare the kinds a real cluster serves that the preflight reads."""
    for path, (kind, namespaced, subresources) in KINDS.items():
        emulator.resources[path] = {"kind": kind, "namespaced": namespaced, "subresources": subresources}


@functools.cache
def _crd(version: str) -> dict:
    return yaml.load((KUBERAY_CRDS / f"v{version}" / "ray.io_rayservices.yaml").read_text(), Loader=yaml.CSafeLoader)


def kuberay(api: k8s.ApiClient, *, version: str) -> None:
    """KubeRay `version`'s RayService CRD and its operator, running."""
    crd = copy.deepcopy(_crd(version))
    k8s.ApiextensionsV1Api(api).create_custom_resource_definition(crd)
    apps = k8s.AppsV1Api(api)
    labels = {"app.kubernetes.io/name": "kuberay-operator", "app.kubernetes.io/instance": "kuberay-operator"}
    apps.create_namespaced_deployment("kuberay-system", {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "kuberay-operator", "namespace": "kuberay-system", "labels": labels},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {"containers": [{"name": "kuberay-operator", "image": f"quay.io/kuberay/operator:v{version}"}]}}}})
    apps.patch_namespaced_deployment_status("kuberay-operator", "kuberay-system", {
        "status": {"replicas": 1, "readyReplicas": 1, "availableReplicas": 1}})


def _daemonset(api: k8s.ApiClient, *, name: str, image: str, pod: dict, ready: int) -> None:
    apps = k8s.AppsV1Api(api)
    labels = {"name": name}
    apps.create_namespaced_daemon_set("kube-system", {
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name, "namespace": "kube-system"},
        "spec": {"selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {**pod, "priorityClassName": "system-node-critical",
                     "containers": [{"name": name, "image": image}]}}}})
    apps.patch_namespaced_daemon_set_status(name, "kube-system", {"status": {
        "desiredNumberScheduled": ready, "currentNumberScheduled": ready, "numberReady": ready,
        "numberAvailable": ready, "numberMisscheduled": 0}})


def nvidia_device_plugin(api: k8s.ApiClient, *, documented: bool, ready: int = 0) -> None:
    """The chart as installed: with its defaults, or with deploy/cluster/nvidia-device-plugin-values.yaml."""
    _daemonset(api, name=NVIDIA_PLUGIN, image="nvcr.io/nvidia/k8s-device-plugin:v0.17.1",
               pod=nvidia_device_plugin_pod(documented=documented), ready=ready)


def efa_device_plugin(api: k8s.ApiClient, *, ready: int = 0) -> None:
    """AWS's chart with deploy/cluster/efa-device-plugin-values.yaml."""
    _daemonset(api, name=EFA_PLUGIN,
               image="602401143452.dkr.ecr.us-west-2.amazonaws.com/eks/aws-efa-k8s-device-plugin:v0.5.5",
               pod=efa_device_plugin_pod(), ready=ready)


def vpc_cni(api: k8s.ApiClient, *, version: str = "1.19.2") -> None:
    """EKS's vpc-cni add-on: the aws-node DaemonSet, its aws-node container on the amazon-k8s-cni image
    (aws/amazon-vpc-cni-k8s, config/master/aws-k8s-cni.yaml), tagged as the add-on tags it."""
    _daemonset(api, name="aws-node", ready=1, pod={"hostNetwork": True},
               image=f"602401143452.dkr.ecr.us-west-2.amazonaws.com/amazon-k8s-cni:v{version}-eksbuild.1")


def metrics_server(api: k8s.ApiClient) -> None:
    registration = k8s.ApiregistrationV1Api(api)
    registration.create_api_service({
        "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
        "metadata": {"name": "v1beta1.metrics.k8s.io", "labels": {"k8s-app": "metrics-server"}},
        "spec": {"group": "metrics.k8s.io", "version": "v1beta1", "groupPriorityMinimum": 100,
                 "versionPriority": 100, "insecureSkipTLSVerify": True,
                 "service": {"name": "metrics-server", "namespace": "kube-system"}}})
    registration.patch_api_service_status("v1beta1.metrics.k8s.io", {"status": {"conditions": [
        {"type": "Available", "status": "True", "reason": "Passed", "message": "all checks passed",
         "lastTransitionTime": "2026-12-04T00:00:00Z"}]}})


def gpu_node(api: k8s.ApiClient, *, name: str, instance_type: str, nodegroup: str, pool: str = "prefill",
             devices: bool = True) -> None:
    """A node of a Tandem node group; with `devices`, the device plugins have advertised its GPUs and EFA."""
    instance = INSTANCE_TYPES[instance_type]
    effects = {"NO_SCHEDULE": "NoSchedule"}
    core = k8s.CoreV1Api(api)
    core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {
        "node.kubernetes.io/instance-type": instance_type, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
        "topology.kubernetes.io/zone": "us-west-2a", "eks.amazonaws.com/nodegroup": nodegroup,
        "eks.amazonaws.com/capacityType": "ON_DEMAND", "tandem.dev/pool": pool}},
        "spec": {"taints": [{"key": t["key"], "value": t["value"], "effect": effects[t["effect"]]}
                            for t in nodegroup_taints(instance)]}})
    allocatable = {"cpu": str(instance.vcpus), "memory": f"{instance.memory_gib}Gi", "pods": "110"}
    if devices:
        allocatable["nvidia.com/gpu"] = str(instance.gpus)
        if instance.has_efa:
            allocatable["vpc.amazonaws.com/efa"] = str(instance.efa_interfaces)
    core.patch_node_status(name, {"status": {"allocatable": allocatable, "capacity": allocatable}})


def system_node(api: k8s.ApiClient, *, name: str, instance_type: str, allocatable: dict, disk_gib: int = 100,
                nodegroup: str = "system") -> None:
    """A node of the cluster's own (untainted) node group, where the control plane and the Ray heads run, with the
    allocatable the kubelet leaves of its instance (less than its size: system and kube reservations) and of its
    root disk of `disk_gib` (docs/install.md's system node group: 100; EKS's default: 20)."""
    core = k8s.CoreV1Api(api)
    core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {
        "node.kubernetes.io/instance-type": instance_type, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
        "topology.kubernetes.io/zone": "us-west-2a", "eks.amazonaws.com/nodegroup": nodegroup}}, "spec": {}})
    disk = disk_gib * 2**30
    # The kubelet's node allocatable (kubernetes.io/docs/tasks/administer-cluster/reserve-compute-resources): capacity
    # less kube-reserved (the EKS AMIs' kubelet config reserves 1Gi of ephemeral-storage) and the hard eviction
    # threshold (nodefs.available<10%).
    storage = {"capacity": {"ephemeral-storage": str(disk)},
               "allocatable": {"ephemeral-storage": str(int(disk * 0.9) - 2**30)}}
    core.patch_node_status(name, {"status": {"allocatable": {**storage["allocatable"], **allocatable},
                                             "capacity": {**storage["capacity"], **allocatable}}})


def pod_on(api: k8s.ApiClient, *, node: str, name: str, namespace: str = "kube-system", requests: dict) -> None:
    """A running pod bound to `node` with these requests (what a DaemonSet or another team's workload holds there)."""
    core = k8s.CoreV1Api(api)
    core.create_namespaced_pod(namespace, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                                           "spec": {"nodeName": node, "containers": [
                                               {"name": "main", "image": "registry.k8s.io/pause:3.10",
                                                "resources": {"requests": requests}}]}})
    core.patch_namespaced_pod_status(name, namespace, {"status": {"phase": "Running"}})


# Roughly what EKS's kubelet leaves allocatable on these types once its kube-reserved CPU and memory and the eviction
# threshold are taken: the CPU as the EKS AMI's formula gives it (tests/support/scheduler.py::_kubelet_allocatable),
# the memory a little under it; not read off a real node.
M5_XLARGE = {"cpu": "3920m", "memory": "15136204Ki", "pods": "58"}
M5_2XLARGE = {"cpu": "7910m", "memory": "31522380Ki", "pods": "58"}


def cluster_ready(api: k8s.ApiClient, *, kuberay_version: str = "1.5.1", system_disk_gib: int = 100) -> None:
    """Every add-on installed as docs/install.md says, a system node that holds a Ray head (with the guide's 100 GiB
    disk, unless told otherwise), and one running p5.48xlarge node of a Tandem node group."""
    system_node(api, name="ip-10-0-1-5.us-west-2.compute.internal", instance_type="m5.2xlarge",
                allocatable=M5_2XLARGE, disk_gib=system_disk_gib)
    kuberay(api, version=kuberay_version)
    nvidia_device_plugin(api, documented=True, ready=1)
    efa_device_plugin(api, ready=1)
    metrics_server(api)
    vpc_cni(api)
    gpu_node(api, name="ip-10-0-1-17.us-west-2.compute.internal", instance_type="p5.48xlarge",
             nodegroup="tandem-d1-prefill")


def aws_network(url: str, *, zones: tuple[str, ...]) -> dict:
    """The EKS cluster `gpu-prod` as a platform team has it (tests/support/moto_server.py::eks_cluster_create: a VPC,
    one private subnet per zone letter), and Tandem's EFA security group in its VPC as the eks target leaves it (all
    traffic in from and out to its own members)."""
    cluster = eks_cluster_create(url=url, name="gpu-prod", region=REGION, zones=zones)
    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=url)
    sg = ec2.create_security_group(GroupName="tandem-efa", Description="Tandem EFA: all traffic between members",
                                   VpcId=cluster["vpc_id"])["GroupId"]
    ec2.authorize_security_group_ingress(GroupId=sg, IpPermissions=[
        {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": sg}]}])
    ec2.authorize_security_group_egress(GroupId=sg, IpPermissions=[
        {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": sg}]}])
    return {"subnets": cluster["subnet_ids"], "security_group": sg}


def runtime_image_manifest(layer: str = "2") -> str:
    """An image manifest as `docker push` sends it (Docker's schema 2, one platform): ECR names the image by the
    sha256 of these bytes, so a test knows the digest before the push, as a team does once it has built."""
    return json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                       "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "size": 7023,
                                  "digest": "sha256:" + "1" * 64},
                       "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip",
                                   "size": 32654, "digest": "sha256:" + layer * 64}]})


def runtime_image_ref(manifest: str, *, repository: str = "tandem-runtime") -> str:
    """The reference pinned by digest that a cluster registers for an image of this manifest in REGION's ECR."""
    return f"123456789012.dkr.ecr.{REGION}.amazonaws.com/{repository}@sha256:" \
           f"{hashlib.sha256(manifest.encode()).hexdigest()}"


def runtime_image_push(url: str, manifest: str, *, repository: str = "tandem-runtime") -> None:
    """Tandem's runtime image pushed to REGION's ECR as docs/install.md, step 5 does (the repository made first)."""
    ecr = boto3.client("ecr", region_name=REGION, endpoint_url=url)
    try:
        ecr.create_repository(repositoryName=repository)
    except ecr.exceptions.RepositoryAlreadyExistsException:
        pass
    ecr.put_image(repositoryName=repository, imageManifest=manifest, imageTag="ray-2.60.0-vllm-0.29.0")

