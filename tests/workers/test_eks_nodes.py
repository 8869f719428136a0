"""The nodes of the emulated EKS cluster are its managed node groups' (moto's, as the eks driver made them), as EKS
makes them: sized by the kubelet's allocatable for the instance type, labelled and tainted as each group says, less
what the DaemonSets on them take, and only while the group is ACTIVE or UPDATING (tests/support/eks_nodes.py).
Nothing is made to fit: a pod the cluster's nodes cannot take stays Pending with the scheduler's words."""
import boto3
import httpx
import pytest
from kubernetes import client as k8s

from deployments.lifecycle import Status
from deployments.models import Cluster, Deployment
from tests.factories import MODEL_SOURCES, RUNTIME_IMAGES, ClusterFactory, DeploymentFactory, TeamFactory
from tests.support.cluster_addons import emulator_client
from tests.support.eks_nodes import eks_emulated
from tests.support.scheduler import instance
from tests.workers.conftest import gpu_spec
from workers.pipeline import reconcile_pass
from workers.targets.eks import EksTarget

REGION = "us-west-2"
NODE_ROLE = "arn:aws:iam::123456789012:role/nodes"


def _pool(itype, gpus, tp, nodes=1):
    return {"instance_type": itype, "nodes": nodes, "gpus_per_node": gpus, "tensor_parallel_size": tp}


def _cluster(aws, emulator, *, system: bool = True):
    made = eks_emulated(aws, emulator, name="gpu-prod", region=REGION, system=system)
    return ClusterFactory(name="eks-prod", kind=Cluster.Kind.EKS, config={
        "region": REGION, "cluster_name": "gpu-prod", "aws_endpoint_url": aws.url,
        "kubernetes_endpoint_url": emulator.base_url, "node_role_arn": NODE_ROLE,
        "subnet_ids": made["subnet_ids"], "model_sources": MODEL_SOURCES, "runtime_images": RUNTIME_IMAGES}), made


def _deployment(cluster, **kwargs):
    spec = gpu_spec(prefill=_pool("p5.48xlarge", 8, 8), decode=_pool("g6e.xlarge", 1, 1, nodes=2))
    return DeploymentFactory(team=TeamFactory(slug="ml-research"), cluster=cluster, name="llama", spec=spec, **kwargs)


def _eks(aws):
    return boto3.client("eks", region_name=REGION, endpoint_url=aws.url)


def _nodes(emulator) -> dict[str, dict]:
    """The cluster's nodes as the API server lists them, by node group (a list each)."""
    listed = k8s.CoreV1Api(emulator_client(emulator)).list_node().to_dict()["items"]
    by_group: dict[str, list] = {}
    for node in listed:
        by_group.setdefault(node["metadata"]["labels"].get("eks.amazonaws.com/nodegroup"), []).append(node)
    return by_group


def _pools_ready(cluster, d) -> None:
    """Passes of the driver until its node groups are ACTIVE (EKS takes its time: tests/support/nodegroup_phases)."""
    for _ in range(6):
        if EksTarget(cluster).ensure_node_pools(d).ready:
            return
    raise AssertionError("the node groups never became ACTIVE")


def _moto_group(name: str):
    """moto's own record of a node group (to put it in a status EKS would)."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.eks.models import eks_backends

    return eks_backends[DEFAULT_ACCOUNT_ID][REGION].clusters["gpu-prod"].nodegroups[name]


def test_the_nodes_are_the_node_groups_as_eks_registers_them(aws, emulator, db):
    cluster, _ = _cluster(aws, emulator)
    d = _deployment(cluster)
    _pools_ready(cluster, d)
    nodes = _nodes(emulator)
    assert {group: len(found) for group, found in nodes.items()} == {
        "system": 2, f"tandem-d{d.pk}-prefill": 1, f"tandem-d{d.pk}-decode": 2}
    system = nodes["system"][0]
    assert system["spec"]["taints"] == [] and "nvidia.com/gpu" not in system["status"]["allocatable"]
    assert system["metadata"]["labels"]["node.kubernetes.io/instance-type"] == "m5.2xlarge"
    # A p5.48xlarge of the EFA pool: the kubelet's allocatable (192 vCPUs less 550m, 2 TiB less 11 MiB × 100 pod
    # slots + 255 MiB + the 100 MiB eviction threshold, and less the hugepages its user data reserves), its 8 GPUs,
    # one EFA device per EFA interface of its launch template, its pool's label and its group's taints.
    p5 = nodes[f"tandem-d{d.pk}-prefill"][0]
    assert p5["status"]["allocatable"] == {
        "cpu": "191450m", "memory": f"{(2097152 - 1455 - 5120) * 1024}Ki", "pods": "100",
        "ephemeral-storage": str(18 * 1024 ** 3), "hugepages-2Mi": "5242880Ki", "nvidia.com/gpu": "8",
        "vpc.amazonaws.com/efa": "32"}
    labels = p5["metadata"]["labels"]
    assert {k: labels[k] for k in ("tandem.dev/pool", "eks.amazonaws.com/capacityType", "topology.kubernetes.io/zone",
                                   "node.kubernetes.io/instance-type", "kubernetes.io/arch")} == {
        "tandem.dev/pool": "prefill", "eks.amazonaws.com/capacityType": "ON_DEMAND",
        "topology.kubernetes.io/zone": "us-west-2a", "node.kubernetes.io/instance-type": "p5.48xlarge",
        "kubernetes.io/arch": "amd64"}
    assert labels["kubernetes.io/hostname"] == p5["metadata"]["name"]
    assert [(t["key"], t["value"], t["effect"]) for t in p5["spec"]["taints"]] == [
        ("nvidia.com/gpu", "true", "NoSchedule"), ("vpc.amazonaws.com/efa", "true", "NoSchedule")]
    g6e = nodes[f"tandem-d{d.pk}-decode"][0]["status"]["allocatable"]
    assert (g6e["cpu"], g6e["memory"], g6e["pods"], g6e["nvidia.com/gpu"]) == ("3920m", "32537600Ki", "58", "1")
    assert "vpc.amazonaws.com/efa" not in g6e and "hugepages-2Mi" not in g6e


def test_pod_slots_are_what_eks_gives_each_instance_type():
    """ENIs × (IPv4 per ENI − 1) + 2 (amazon-eks-ami's eni-max-pods.txt: m5.2xlarge 58, g6e.xlarge 58, t3.medium 17,
    p5.48xlarge 100, g6e.12xlarge 292, p4d.24xlarge 737), at most 110 up to 30 vCPUs and 250 above."""
    assert {t: instance(t).max_pods for t in ("m5.2xlarge", "g6e.xlarge", "t3.medium", "p5.48xlarge",
                                              "g6e.12xlarge", "p4d.24xlarge")} == {
        "m5.2xlarge": 58, "g6e.xlarge": 58, "t3.medium": 17, "p5.48xlarge": 100, "g6e.12xlarge": 250,
        "p4d.24xlarge": 250}


def test_a_group_has_nodes_only_while_active_or_updating_and_as_many_as_it_desires(aws, emulator, db):
    cluster, _ = _cluster(aws, emulator)
    d = _deployment(cluster)
    _pools_ready(cluster, d)
    decode = _moto_group(f"tandem-d{d.pk}-decode")
    for status, count in [("CREATING", 0), ("UPDATING", 2), ("DEGRADED", 0), ("DELETING", 0), ("ACTIVE", 2)]:
        decode.status = status
        assert len(_nodes(emulator).get(f"tandem-d{d.pk}-decode", [])) == count, status
    _eks(aws).update_nodegroup_config(clusterName="gpu-prod", nodegroupName=f"tandem-d{d.pk}-decode",
                                      scalingConfig={"minSize": 3, "maxSize": 3, "desiredSize": 3})
    assert len(_nodes(emulator)[f"tandem-d{d.pk}-decode"]) == 3


def test_the_ray_head_waits_for_a_node_the_cluster_does_not_have_and_the_deployment_says_why(aws, emulator, db):
    """Without the system node group docs/install.md adds, every node is a tainted GPU node: no node for the head."""
    cluster, _ = _cluster(aws, emulator, system=False)
    d = _deployment(cluster, status=Status.APPROVED)
    for _ in range(4):
        reconcile_pass(d.pk)
    d = Deployment.objects.get(pk=d.pk)
    assert d.status == Status.PROVISIONING
    pods = {p["metadata"]["labels"]["tandem.dev/pool"]: p for p in emulator.pods("tandem-ml-research")}
    assert pods["head"]["status"]["phase"] == "Pending"
    assert pods["head"]["status"]["conditions"][0]["message"] == (
        "0/3 nodes are available: 3 node(s) had untolerated taint {nvidia.com/gpu: true}. preemption: 0/3 nodes "
        "are available: 3 Preemption is not helpful for scheduling.")
    assert {pods[pool]["status"]["phase"] for pool in ("prefill", "decode")} == {"Running"}
    serve = next(c for c in d.conditions if c["type"] == "ServeRunning")
    assert serve["status"] == "False" and serve["message"].startswith("head: Unschedulable: 0/3 nodes are available")


def _rayservice(name: str, *, pod: dict) -> dict:
    """A RayService of a head alone, with this pod spec (valid against KubeRay's CRD)."""
    return {"apiVersion": "ray.io/v1", "kind": "RayService", "metadata": {"name": name, "namespace": "default"},
            "spec": {"serveConfigV2": "applications: []", "rayClusterConfig": {
                "rayVersion": "2.60.0", "headGroupSpec": {"rayStartParams": {}, "template": {"spec": pod}}}}}


def _head(emulator, name: str) -> dict:
    httpx.get(f"{emulator.base_url}/apis/ray.io/v1/namespaces/default/rayservices/{name}",
              headers={"Authorization": "Bearer k8s-aws-v1.seeding"})  # a read brings the stand-in KubeRay's pods
    return next(p for p in emulator.pods("default") if p["metadata"]["name"].startswith(f"{name}-raycluster"))


def _node_group(aws, made, name: str, **kwargs) -> None:
    """A node group the platform team made beside Tandem's, ACTIVE (its CREATING ended)."""
    _eks(aws).create_nodegroup(clusterName="gpu-prod", nodegroupName=name, nodeRole=NODE_ROLE,
                               subnets=made["subnet_ids"], scalingConfig={"minSize": 1, "maxSize": 1, "desiredSize": 1},
                               **kwargs)
    aws.advance(name, cluster="gpu-prod")


def _create(emulator, rs: dict) -> None:
    k8s.CustomObjectsApi(emulator_client(emulator)).create_namespaced_custom_object(
        "ray.io", "v1", "default", "rayservices", rs)


def test_daemonsets_take_their_share_of_each_node_before_any_pod(aws, emulator, db):
    """An m5.xlarge's kubelet leaves 3920m allocatable; aws-node (its two containers at 25m each) and kube-proxy
    (100m) take 150m of it: a pod of 3800m fits the allocatable and not the node."""
    _, made = _cluster(aws, emulator, system=False)
    _node_group(aws, made, "small", instanceTypes=["m5.xlarge"])
    emulator.registry.add("rayproject/ray:2.60.0")
    pod = {"containers": [{"name": "ray-head", "image": "rayproject/ray:2.60.0",
                           "resources": {"requests": {"cpu": "3800m"}}}]}
    _create(emulator, _rayservice("big", pod=pod))
    assert _head(emulator, "big")["status"]["conditions"][0]["message"] == (
        "0/1 nodes are available: 1 Insufficient cpu. preemption: 0/1 nodes are available: 1 No preemption victims "
        "found for incoming pod.")
    pod["containers"][0]["resources"]["requests"]["cpu"] = "3770m"
    _create(emulator, _rayservice("fits", pod=pod))
    assert _head(emulator, "fits")["status"]["phase"] == "Running"


def test_a_gpu_group_the_nvidia_device_plugin_does_not_select_advertises_no_gpu(aws, emulator, db):
    """The device plugin runs, as docs/install.md installs it, on nodes labelled tandem.dev/pool only."""
    _, made = _cluster(aws, emulator)
    for name, labels in [("theirs", {}), ("ours", {"tandem.dev/pool": "decode"})]:
        _node_group(aws, made, name, instanceTypes=["g6e.xlarge"], labels=labels)
    nodes = _nodes(emulator)
    assert "nvidia.com/gpu" not in nodes["theirs"][0]["status"]["allocatable"]
    assert nodes["ours"][0]["status"]["allocatable"]["nvidia.com/gpu"] == "1"


@pytest.mark.parametrize("pinned", ["nodegroup", "instance-type"])
def test_a_pod_meets_its_node_groups_taints_whichever_way_it_is_pinned(aws, emulator, db, pinned):
    _, made = _cluster(aws, emulator)
    _node_group(aws, made, "dedicated", instanceTypes=["m6i.2xlarge"],
                taints=[{"key": "dedicated", "value": "ml", "effect": "NO_SCHEDULE"}])
    emulator.registry.add("rayproject/ray:2.60.0")
    selector = {"eks.amazonaws.com/nodegroup": "dedicated"} if pinned == "nodegroup" else \
        {"node.kubernetes.io/instance-type": "m6i.2xlarge"}
    pod = {"nodeSelector": selector, "containers": [{"name": "ray-head", "image": "rayproject/ray:2.60.0"}]}
    _create(emulator, _rayservice("pinned", pod=pod))
    assert _head(emulator, "pinned")["status"]["conditions"][0]["message"] == (
        "0/3 nodes are available: 1 node(s) had untolerated taint {dedicated: ml}, 2 node(s) didn't match Pod's node "
        "affinity/selector. preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling.")
    pod["tolerations"] = [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}]
    _create(emulator, _rayservice("tolerating", pod=pod))
    assert _head(emulator, "tolerating")["spec"]["nodeName"] == _nodes(emulator)["dedicated"][0]["metadata"]["name"]
