"""The preflight against an emulated EKS cluster: the Kubernetes API emulator holding what a real cluster holds
once its add-ons are installed (tests/support/cluster_addons.py, from each add-on's published shapes), and moto's
EC2, EKS, IAM and STS through real boto3."""
import json

import boto3
import pytest
import yaml
from kubernetes import client as k8s

from deployments.errors import Conflict
from deployments.lifecycle import Status
from deployments.models import Cluster, ClusterCheck
from deployments.services.actions import deployment_approve
from deployments.services.cluster_checks import cluster_check_request
from deployments.services.clusters import cluster_update
from tests.factories import MODEL_SOURCES, ClusterFactory, DeploymentFactory, TeamFactory
from tests.support import cluster_addons
from tests.support.cluster_addons import REGION, aws_network
from tests.support.cluster_addons import emulator_client as _client
from tests.support.processes import ROOT
from tests.workers.conftest import gpu_spec
from workers.preflight import (DRIVER_ACTIONS, FAIL, HEAD_NODES_FIX, PASS, UNVERIFIED, cluster_preflight,
                               node_admits, taint_tolerated)
from workers.tasks import check_cluster

RUNTIME = "ray-2.60.0-vllm-0.29.0"  # the GPU runtime an eks cluster runs

@pytest.fixture
def eks(aws, emulator, db):
    """An EKS cluster registered with Tandem, its API served by the emulator (add-ons not yet installed)."""
    cluster_addons.install_kinds(emulator)
    emulator.install_kuberay()
    emulator.token, emulator.token_prefix = None, "k8s-aws-v1."

    def register(*, zones=("a",), runtime_images: dict | None = None) -> Cluster:
        """The cluster, with Tandem's runtime image built, pushed and registered (docs/install.md, step 5) unless
        `runtime_images` says otherwise."""
        network = aws_network(aws.url, zones=zones)
        if runtime_images is None:
            manifest = cluster_addons.runtime_image_manifest()
            cluster_addons.runtime_image_push(aws.url, manifest)
            runtime_images = {RUNTIME: cluster_addons.runtime_image_ref(manifest)}
        return ClusterFactory(name="eks-prod", kind=Cluster.Kind.EKS, config={
            "region": REGION, "cluster_name": "gpu-prod", "aws_endpoint_url": aws.url,
            "kubernetes_endpoint_url": emulator.base_url, "node_role_arn": "arn:aws:iam::123456789012:role/nodes",
            "subnet_ids": network["subnets"], "model_sources": MODEL_SOURCES, "runtime_images": runtime_images})
    return register


def _by_name(lines) -> dict:
    return {line.name: line for line in lines}


def _doctor(cluster, admin) -> ClusterCheck:
    """`tandemctl doctor`'s run: asked for by a platform admin, run by the worker's task, recorded."""
    run = cluster_check_request(actor=admin, cluster=cluster)
    check_cluster(run.pk)
    run.refresh_from_db()
    return run


def _pool(itype, gpus, nodes=1):
    return {"instance_type": itype, "nodes": nodes, "gpus_per_node": gpus, "tensor_parallel_size": gpus}


@pytest.fixture
def p5_pair(team):
    """Team ml-research's request of a p5.48xlarge prefill and decode pair onto the cluster, waiting for approval."""
    def request(cluster):
        spec = gpu_spec(prefill=_pool("p5.48xlarge", 8), decode=_pool("p5.48xlarge", 8))
        return DeploymentFactory(team=team, cluster=cluster, name="llama", spec=spec, status=Status.PENDING_APPROVAL)
    return request


def _approve(d, actor):
    d.refresh_from_db()
    return deployment_approve(actor=actor, deployment=d, generation=d.generation)


def test_a_cluster_installed_as_documented_passes_every_check(eks, emulator):
    TeamFactory(slug="ml-research")
    cluster = eks()
    cluster_addons.cluster_ready(_client(emulator))

    lines = _by_name(cluster_preflight(cluster))

    assert [n for n, line in lines.items() if line.status == FAIL] == []
    # moto 5.2.5 does not implement iam:SimulatePrincipalPolicy (it answers 500): said so, not passed.
    assert {n for n, line in lines.items() if line.status == UNVERIFIED} == {"driver-iam", "node-role-iam",
                                                                             "runtime-image-pull"}
    assert lines["runtime-images"].status == PASS
    assert "SimulatePrincipalPolicy" in lines["driver-iam"].evidence
    assert "1 of 1 pods ready" in lines["nvidia-device-plugin"].evidence
    assert "nvidia.com/gpu 8, vpc.amazonaws.com/efa 32" in lines["allocatable"].evidence
    assert "0 of 30 node groups used" in lines["nodegroup-quota"].evidence
    assert lines["vpc-cni"].status == PASS
    assert "1 can be created" in lines["team-namespaces"].evidence
    assert emulator.namespaces == {}  # the dry run created nothing


def test_the_defaults_that_break_a_real_cluster_are_three_failures_each_with_its_fix(eks, emulator):
    """The NVIDIA chart's default affinity and tolerations, no EFA plugin, and node subnets in two zones."""
    cluster = eks(zones=("a", "b"))
    api = _client(emulator)
    cluster_addons.system_node(api, name="system-1", instance_type="m5.2xlarge", allocatable=cluster_addons.M5_2XLARGE)
    cluster_addons.kuberay(api, version="1.5.1")
    cluster_addons.nvidia_device_plugin(api, documented=False)
    cluster_addons.metrics_server(api)

    lines = _by_name(cluster_preflight(cluster))

    failed = {n: line for n, line in lines.items() if line.status == FAIL}
    assert set(failed) == {"nvidia-device-plugin", "efa-device-plugin", "subnets"}
    nvidia = failed["nvidia-device-plugin"]
    assert "does not tolerate vpc.amazonaws.com/efa=true:NoSchedule" in nvidia.evidence
    assert "feature.node.kubernetes.io/pci-10de.present In true" in nvidia.evidence
    assert "-f deploy/cluster/nvidia-device-plugin-values.yaml" in nvidia.fix
    assert "No DaemonSet runs a aws-efa-k8s-device-plugin image" in failed["efa-device-plugin"].evidence
    assert "-f deploy/cluster/efa-device-plugin-values.yaml" in failed["efa-device-plugin"].fix
    assert "span 2 Availability Zones" in failed["subnets"].evidence
    assert failed["subnets"].fix.startswith("Keep the subnets of one zone")
    assert lines["allocatable"].status == UNVERIFIED  # no GPU node yet


def test_a_cluster_whose_own_nodes_cannot_hold_the_ray_head_fails_with_the_node_group_to_add(eks, emulator):
    """The head asks for 4 CPU and 16 GiB; an m5.xlarge (4 vCPU, 16 GiB) leaves less allocatable, and a GPU node's
    taints keep the head off it, however big."""
    cluster = eks()
    api = _client(emulator)
    cluster_addons.system_node(api, name="system-1", instance_type="m5.xlarge", allocatable=cluster_addons.M5_XLARGE)
    cluster_addons.gpu_node(api, name="gpu-1", instance_type="p5.48xlarge", nodegroup="tandem-d1-prefill")

    head = _by_name(cluster_preflight(cluster))["ray-head"]

    assert head.status == FAIL
    assert "(4 CPU, 16Gi requested, and 40 GiB of disk for the runtime image and its logs): system-1 (node group " \
           "system) has 3.92 CPU, 14.4 GiB and 89.0 GiB of ephemeral storage free (allocatable less what its pods " \
           "request): short of cpu and memory" in head.evidence
    assert "gpu-1" not in head.evidence
    assert head.fix.startswith(HEAD_NODES_FIX) and "--instance-types m5.2xlarge" in head.fix

    cluster_addons.system_node(api, name="system-2", instance_type="m5.2xlarge", allocatable=cluster_addons.M5_2XLARGE)
    head = _by_name(cluster_preflight(cluster))["ray-head"]
    assert head.status == PASS and head.evidence.startswith("system-2 (node group system) has 7.91 CPU")


def test_a_head_node_group_with_ekss_default_20_gib_disk_fails_and_one_of_100_gib_passes(eks, emulator,
                                                                                       platform_admin):
    """EKS's default node disk leaves about 17 GiB allocatable, which the runtime image alone fills: the head's node
    would go to DiskPressure pulling it, though its CPU and memory fit. The doctor's run, through the worker's task."""
    cluster = eks()
    api = _client(emulator)
    cluster_addons.cluster_ready(api, system_disk_gib=20)

    run = _doctor(cluster, platform_admin)

    head = run.lines.get(name="ray-head")
    assert (run.status, head.status) == (ClusterCheck.Status.FAILED, FAIL)
    assert "(node group system) has 7.91 CPU, 30.1 GiB and 17.0 GiB of ephemeral storage free (allocatable less " \
           "what its pods request): short of ephemeral-storage" in head.evidence
    assert "fill its node's disk pulling the image (DiskPressure evicts what runs there)" in head.evidence
    assert "--disk-size 100" in head.fix and "a node group's disk size cannot change" in head.fix

    cluster_addons.system_node(api, name="system-2", instance_type="m5.2xlarge", allocatable=cluster_addons.M5_2XLARGE,
                               disk_gib=100, nodegroup="system-100")
    run = _doctor(cluster, platform_admin)
    head = run.lines.get(name="ray-head")
    assert (run.status, head.status) == (ClusterCheck.Status.PASSED, PASS), head.evidence
    assert head.evidence.startswith("system-2 (node group system-100) has 7.91 CPU, 30.1 GiB and 89.0 GiB")


def test_the_head_counts_what_the_pods_already_on_a_node_request(eks, emulator):
    """An m5.2xlarge fits a head when empty; with another workload's 4 CPU on it, only 3.91 CPU are left."""
    cluster = eks()
    api = _client(emulator)
    cluster_addons.system_node(api, name="system-1", instance_type="m5.2xlarge", allocatable=cluster_addons.M5_2XLARGE)
    cluster_addons.pod_on(api, node="system-1", name="coredns-1", requests={"cpu": "100m", "memory": "70Mi"})
    assert _by_name(cluster_preflight(cluster))["ray-head"].status == PASS

    cluster_addons.pod_on(api, node="system-1", name="search-indexer", namespace="default",
                          requests={"cpu": "3900m", "memory": "8Gi"})
    head = _by_name(cluster_preflight(cluster))["ray-head"]
    assert head.status == FAIL
    assert "system-1 (node group system) has 3.91 CPU, 22.0 GiB and 89.0 GiB of ephemeral storage free " \
           "(allocatable less what its pods request): short of cpu" in head.evidence


@pytest.mark.parametrize("version, verdict", [("1.4.2", FAIL), ("1.5.1", PASS), ("1.6.2", PASS)])
def test_the_crd_check_reads_the_served_schema_of_each_kuberay_release(eks, emulator, version, verdict):
    cluster = eks()
    cluster_addons.kuberay(_client(emulator), version=version)
    lines = _by_name(cluster_preflight(cluster))
    assert lines["kuberay-crd"].status == verdict
    assert lines["kuberay-operator"].status == verdict
    if verdict == FAIL:
        assert "lacks workerGroupSpecs[].resources (KubeRay 1.5.0), authOptions (KubeRay 1.5.1)" in \
            lines["kuberay-crd"].evidence
        assert "crd?ref=v1.5.1" in lines["kuberay-crd"].fix


def test_a_node_whose_devices_were_never_advertised_fails_allocatable(eks, emulator):
    cluster = eks()
    api = _client(emulator)
    cluster_addons.gpu_node(api, name="n1", instance_type="p5.48xlarge", nodegroup="tandem-d1-prefill",
                            devices=False)
    line = _by_name(cluster_preflight(cluster))["allocatable"]
    assert line.status == FAIL
    assert "n1 (p5.48xlarge) has nvidia.com/gpu 0, not 8" in line.evidence
    assert "vpc.amazonaws.com/efa 0, not 32" in line.evidence


def test_a_team_namespace_someone_else_owns_fails(eks, emulator):
    TeamFactory(slug="ml-research")
    cluster = eks()
    k8s.CoreV1Api(_client(emulator)).create_namespace({"metadata": {"name": "tandem-ml-research"}})
    line = _by_name(cluster_preflight(cluster))["team-namespaces"]
    assert line.status == FAIL and "tandem-ml-research exists and is not Tandem's" in line.evidence


def test_the_node_group_quota_counts_what_exists(eks, aws, emulator):
    cluster = eks()
    client = boto3.client("eks", region_name=REGION, endpoint_url=aws.url)
    for i in range(29):
        client.create_nodegroup(clusterName="gpu-prod", nodegroupName=f"other-{i}",
                                nodeRole="arn:aws:iam::123456789012:role/nodes",
                                subnets=cluster.config["subnet_ids"])
    line = _by_name(cluster_preflight(cluster))["nodegroup-quota"]
    assert line.status == FAIL and "29 of 30 node groups used" in line.evidence


@pytest.mark.parametrize(("installed", "status", "says"), [
    ("1.19.2", PASS, "amazon-k8s-cni:v1.19.2-eksbuild.1 (1.18.5 or newer handles EFA-only interfaces)"),
    ("1.18.4", FAIL, "amazon-k8s-cni:v1.18.4-eksbuild.1: Tandem's EFA node groups put EFA-only interfaces on every "
                     "network card but the first, which the VPC CNI handles from 1.18.5 on."),
    (None, UNVERIFIED, "No DaemonSet kube-system/aws-node runs an amazon-k8s-cni image"),
])
def test_the_vpc_cni_must_handle_the_efa_only_interfaces_of_tandems_node_groups(eks, emulator, installed, status, says):
    cluster = eks()
    if installed:
        cluster_addons.vpc_cni(_client(emulator), version=installed)
    line = _by_name(cluster_preflight(cluster))["vpc-cni"]
    assert line.status == status and says in line.evidence, line
    if status != PASS:
        assert line.fix.startswith("aws eks update-addon --cluster-name $CLUSTER_NAME --addon-name vpc-cni")


def test_the_simulated_driver_actions_are_the_policys():
    policy = yaml.safe_load((ROOT / "deploy/iam/eks-driver-policy.json").read_text())
    actions = {a for s in policy["Statement"] if s["Effect"] == "Allow"
               for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
    assert actions == set(DRIVER_ACTIONS)


def test_toleration_and_affinity_rules_follow_kubernetes():
    taint = {"key": "vpc.amazonaws.com/efa", "value": "true", "effect": "NoSchedule"}
    assert taint_tolerated(taint, [{"operator": "Exists"}])  # tolerates everything
    assert taint_tolerated(taint, [{"key": "vpc.amazonaws.com/efa", "operator": "Equal", "value": "true"}])
    assert not taint_tolerated(taint, [{"key": "vpc.amazonaws.com/efa", "operator": "Equal", "value": "yes"}])
    assert not taint_tolerated(taint, [{"key": "vpc.amazonaws.com/efa", "operator": "Exists",
                                        "effect": "NoExecute"}])
    pod = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "a", "operator": "In", "values": ["1"]}, {"key": "b", "operator": "Exists"}]},
        {"matchExpressions": [{"key": "c", "operator": "DoesNotExist"}]}]}}}}
    assert node_admits(pod, {"a": "1", "b": "", "c": "x"})  # first term
    assert node_admits(pod, {})  # second term
    assert not node_admits(pod, {"a": "1", "c": "x"})
    assert not node_admits({"nodeSelector": {"x": "y"}}, {})



def test_tandems_efa_security_group_without_its_self_rules_fails_and_absent_passes(eks, aws):
    """Someone removed the egress rule of Tandem's EFA group (the eks target restores it only when it creates a node
    group): EFA traffic is dropped until then. A cluster without the group yet is fine: Tandem makes it."""
    cluster = eks()
    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=aws.url)
    sg = ec2.describe_security_groups(Filters=[{"Name": "group-name", "Values": ["tandem-efa"]}])["SecurityGroups"][0]
    ec2.revoke_security_group_egress(GroupId=sg["GroupId"], IpPermissions=[
        {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": sg["GroupId"]}]}])
    line = _by_name(cluster_preflight(cluster))["efa-security-group"]
    assert line.status == FAIL and "does not let all traffic out between its members" in line.evidence
    assert f"authorize-security-group-egress --group-id {sg['GroupId']}" in line.fix
    ec2.delete_security_group(GroupId=sg["GroupId"])
    line = _by_name(cluster_preflight(cluster))["efa-security-group"]
    assert line.status == PASS and "Tandem creates it" in line.evidence


# --- the runtime image: registered by digest, in the cluster's ECR, before any deployment is approved ----------
def _image_lines(cluster) -> list:
    return [line for line in cluster_preflight(cluster) if line.name.startswith("runtime-image")]


def test_a_registered_runtime_image_missing_from_ecr_fails_with_the_fix_and_passes_once_pushed(eks, aws, emulator):
    """A team registers the digest it built, then pushes: until the push, every Ray pod would end in ErrImagePull."""
    cluster_addons.cluster_ready(_client(emulator))
    manifest = cluster_addons.runtime_image_manifest(layer="3")  # built, not yet pushed
    ref = cluster_addons.runtime_image_ref(manifest)
    cluster = eks(runtime_images={RUNTIME: ref})

    missing = _image_lines(cluster)
    assert [(line.name, line.status, line.subject) for line in missing] == \
        [("runtime-images", FAIL, f"runtime:{RUNTIME}")]
    assert "ECR has no repository tandem-runtime of ECR 123456789012 (us-west-2)" in missing[0].evidence
    assert missing[0].fix.startswith("aws ecr create-repository --repository-name tandem-runtime --region us-west-2")

    cluster_addons.runtime_image_push(aws.url, cluster_addons.runtime_image_manifest(layer="4"))  # another image
    missing = _image_lines(cluster)[0]
    assert missing.status == FAIL and f"ECR has no image {ref.split('@')[1]} in repository tandem-runtime" \
        in missing.evidence and "ErrImagePull" in missing.evidence
    assert f"tandemctl cluster set eks-prod 'runtime_images={{\"{RUNTIME}\": " in missing.fix

    cluster_addons.runtime_image_push(aws.url, manifest)
    found, pull = _image_lines(cluster)
    assert (found.name, found.status, found.subject) == ("runtime-images", PASS, f"runtime:{RUNTIME}")
    assert f"{ref} is in repository tandem-runtime" in found.evidence and RUNTIME in found.evidence
    # The node role's pull rights on the repository: IAM's simulation, which moto does not offer (said so).
    assert (pull.name, pull.status, pull.subject) == ("runtime-image-pull", UNVERIFIED, f"runtime:{RUNTIME}")


def test_a_runtime_without_a_registered_image_fails_and_one_outside_ecr_is_unverified(eks, emulator):
    cluster_addons.cluster_ready(_client(emulator))
    cluster = eks(runtime_images={})
    [line] = _image_lines(cluster)
    assert (line.status, line.subject) == (FAIL, f"runtime:{RUNTIME}")
    assert "deployments of it are refused" in line.evidence and "docs/install.md, step 5" in line.fix
    cluster.config["runtime_images"] = {RUNTIME: "ghcr.io/acme/tandem-runtime@sha256:" + "cd" * 32}
    cluster.save()
    [line] = _image_lines(Cluster.objects.get(pk=cluster.pk))
    assert line.status == UNVERIFIED and "not in a private ECR registry" in line.evidence


def test_a_p5_the_node_subnets_zone_does_not_offer_fails_for_its_deployment_and_passes_in_a_zone_that_does(
        eks, aws, emulator, platform_admin, team_admin, p5_pair):
    """A new account's cluster in us-west-2a, where (here) EC2 offers no p5.48xlarge: the doctor says where it is
    offered, the approval of the p5 deployment is refused with that, and both pass once the node subnets are in a
    zone that offers it."""
    aws.offerings({"p5.48xlarge": ["us-west-2b", "us-west-2c"]})
    cluster = eks()
    cluster_addons.cluster_ready(_client(emulator))
    assert _doctor(cluster, platform_admin).status == ClusterCheck.Status.PASSED  # nothing asks for p5 yet
    d = p5_pair(cluster)

    run = _doctor(cluster, platform_admin)

    assert run.status == ClusterCheck.Status.FAILED
    overview = run.lines.get(name="instance-offerings")
    assert overview.status == PASS and "Not offered there: p5.48xlarge (us-west-2b, us-west-2c)" in overview.evidence
    line = run.lines.get(status=FAIL)
    assert (line.name, line.subject) == ("instance-offered", "instance:p5.48xlarge")
    assert line.evidence == ("p5.48xlarge is not offered in us-west-2a, the Availability Zone of the cluster's node "
                             "subnets (EC2 offers it in us-west-2b, us-west-2c): its node group's instances would "
                             "never launch. Asked for by ml-research/llama (waiting for approval).")
    assert line.fix.startswith("Register private subnets of us-west-2b or us-west-2c as the cluster's subnet_ids "
                               "(tandemctl cluster set eks-prod 'subnet_ids=[")
    assert "or choose an instance type offered in us-west-2a (g5.xlarge, " in line.fix
    with pytest.raises(Conflict) as refused:
        _approve(d, team_admin)
    assert "Cluster eks-prod's last check fails for what this deployment uses" in refused.value.message
    assert "instance-offered (p5.48xlarge): p5.48xlarge is not offered in us-west-2a" in refused.value.message
    assert "Fix: Register private subnets of us-west-2b or us-west-2c" in refused.value.message
    assert "tandemctl doctor eks-prod" in refused.value.message

    # The fix: private subnets of us-west-2b, registered as the cluster's.
    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=aws.url)
    vpc = ec2.describe_subnets(SubnetIds=cluster.config["subnet_ids"])["Subnets"][0]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.9.0/24", AvailabilityZone="us-west-2b")["Subnet"]
    cluster_update(actor=platform_admin, cluster=cluster, config={**cluster.config, "subnet_ids": [subnet["SubnetId"]]})
    cluster.refresh_from_db()
    run = _doctor(cluster, platform_admin)
    assert run.status == ClusterCheck.Status.PASSED, [(x.name, x.evidence) for x in run.lines.filter(status=FAIL)]
    assert not run.lines.filter(name="instance-offered").exists()
    assert _approve(d, team_admin).status == Status.APPROVED


def test_a_vcpu_quota_below_the_deployments_need_fails_with_the_numbers_and_passes_once_raised(
        eks, aws, emulator, platform_admin, team_admin, p5_pair):
    """A new account's 96 vCPUs of P: the doctor says what Tandem runs, the room left and what the waiting p5
    deployment needs (384), with the command that asks AWS for it; its approval is refused until a run passes."""
    aws.quota("L-417A185B", 96)
    cluster = eks()
    cluster_addons.cluster_ready(_client(emulator))
    d = p5_pair(cluster)

    run = _doctor(cluster, platform_admin)

    assert run.status == ClusterCheck.Status.FAILED
    line = run.lines.get(status=FAIL)
    assert (line.name, line.subject) == ("vcpu-quota-p", "family:P")
    assert line.evidence == (
        "Running On-Demand P instances (L-417A185B) in us-west-2: 96 vCPUs; Tandem's node groups of the family run "
        "0; room for 1 × p4d.24xlarge or p4de.24xlarge (96 vCPUs each), 0 × p5.48xlarge, p5e.48xlarge or "
        "p5en.48xlarge (192 vCPUs each). The deployments here need 384 in all: ml-research/llama (waiting for "
        "approval) 384 (prefill 1 × p5.48xlarge, decode 1 × p5.48xlarge).")
    assert line.fix.startswith("Ask AWS for at least 384 vCPUs: aws service-quotas request-service-quota-increase "
                               "--service-code ec2 --quota-code L-417A185B --desired-value 384 --region us-west-2")
    assert run.lines.get(name="vcpu-quota-g").status == PASS
    with pytest.raises(Conflict) as refused:
        _approve(d, team_admin)
    assert "vcpu-quota-p (P): Running On-Demand P instances (L-417A185B) in us-west-2: 96 vCPUs" in \
        refused.value.message
    assert "--desired-value 384" in refused.value.message

    aws.quota("L-417A185B", 384)  # AWS granted the request
    run = _doctor(cluster, platform_admin)
    assert run.status == ClusterCheck.Status.PASSED
    assert "384 vCPUs; Tandem's node groups of the family run 0; room for 4 × p4d.24xlarge" in \
        run.lines.get(name="vcpu-quota-p").evidence
    assert _approve(d, team_admin).status == Status.APPROVED


def _worker_role(aws) -> str:
    """The workers' role in IAM, holding deploy/iam/eks-driver-policy.json with the cluster's values, as
    docs/install.md (step 2) makes it."""
    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=aws.url)
    vpc = ec2.describe_vpcs()["Vpcs"][-1]["VpcId"]
    policy = (ROOT / "deploy/iam/eks-driver-policy.json").read_text()
    for key, value in {"${AWS_REGION}": REGION, "${AWS_ACCOUNT_ID}": "123456789012", "${CLUSTER_NAME}": "gpu-prod",
                       "${NODE_ROLE_NAME}": "nodes", "${VPC_ID}": vpc}.items():
        policy = policy.replace(key, value)
    iam = boto3.client("iam", region_name=REGION, endpoint_url=aws.url)
    trust = {"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Action": "sts:AssumeRoleWithWebIdentity",
        "Principal": {"Federated": "arn:aws:iam::123456789012:oidc-provider/oidc.eks.us-west-2.amazonaws.com/id/X"}}]}
    role = iam.create_role(RoleName="tandem-worker", AssumeRolePolicyDocument=json.dumps(trust))
    iam.put_role_policy(RoleName="tandem-worker", PolicyName="tandem-eks-driver", PolicyDocument=policy)
    return role["Role"]["Arn"]


def test_the_driver_policy_is_simulated_on_the_arns_the_driver_acts_on(eks, aws, emulator):
    """deploy/iam/eks-driver-policy.json names Tandem's node groups and placement groups `tandem-*`: simulated
    without ARNs it passed whatever the cluster's node group prefix; on the ARNs the driver acts on, a cluster that
    names its node groups `gpu-*` is told which calls on which ARNs IAM would refuse."""
    cluster = eks()
    cluster.config["role_arn"] = _worker_role(aws)
    cluster.save()
    line = _by_name(cluster_preflight(cluster))["driver-iam"]
    assert line.status == PASS, line.evidence
    assert line.evidence.startswith("arn:aws:iam::123456789012:role/tandem-worker is allowed eks:DescribeCluster, ")
    assert "arn:aws:eks:us-west-2:123456789012:nodegroup/gpu-prod/tandem-d1-prefill/" in line.evidence
    assert "arn:aws:ec2:us-west-2:123456789012:placement-group/tandem-d1-prefill" in line.evidence

    cluster.config["nodegroup_prefix"] = "gpu-"
    cluster.save()
    line = _by_name(cluster_preflight(cluster))["driver-iam"]
    assert line.status == FAIL
    group = "arn:aws:eks:us-west-2:123456789012:nodegroup/gpu-prod/gpu-d1-prefill/00000000-0000-0000-0000-000000000000"
    assert line.evidence == (
        f"arn:aws:iam::123456789012:role/tandem-worker is not allowed eks:TagResource on {group}; "
        f"eks:DescribeNodegroup on {group}; eks:UpdateNodegroupConfig on {group}; eks:DeleteNodegroup on {group}; "
        "ec2:CreatePlacementGroup on arn:aws:ec2:us-west-2:123456789012:placement-group/gpu-d1-prefill; "
        "ec2:CreateTags on arn:aws:ec2:us-west-2:123456789012:placement-group/gpu-d1-prefill; "
        "ec2:DeletePlacementGroup on arn:aws:ec2:us-west-2:123456789012:placement-group/gpu-d1-prefill.")
    assert "replace tandem-* with gpu-* in it" in line.fix

