"""The eks driver over real HTTP: boto3 against moto's server (EKS, STS) and the emulated Kubernetes API."""
import base64

import boto3
import pytest

from deployments.models import Cluster
from tests.factories import ClusterFactory, DeploymentFactory, TeamFactory
from tests.support.moto_server import eks_cluster_create
from tests.workers.conftest import gpu_spec
from workers.targets.base import PermanentError, TransientError
from workers.targets.eks import EksTarget

REGION = "us-west-2"
NODEGROUPS = r"/clusters/gpu-prod/node-groups"


def _pool(itype, gpus, tp, nodes=1):
    return {"instance_type": itype, "nodes": nodes, "gpus_per_node": gpus, "tensor_parallel_size": tp}


@pytest.fixture
def eks_cluster(aws, emulator, db):
    eks_cluster_create(url=aws.url, name="gpu-prod", region=REGION)
    emulator.token, emulator.token_prefix = None, "k8s-aws-v1."  # accepts only EKS-style tokens
    return ClusterFactory(name="eks-prod", kind=Cluster.Kind.EKS, config={
        "region": REGION, "cluster_name": "gpu-prod", "aws_endpoint_url": aws.url,
        "kubernetes_endpoint_url": emulator.base_url, "node_role_arn": "arn:aws:iam::123456789012:role/nodes",
        "subnet_ids": ["subnet-1"]})


@pytest.fixture
def deployment(eks_cluster):
    spec = gpu_spec(prefill=_pool("p5.48xlarge", 8, 8), decode=_pool("g6e.xlarge", 1, 1, nodes=2))
    return DeploymentFactory(team=TeamFactory(slug="ml-research"), cluster=eks_cluster, name="llama", spec=spec)


def _eks(aws):
    return boto3.client("eks", region_name=REGION, endpoint_url=aws.url)


def test_node_groups_are_created_with_types_sizes_labels_and_gpu_taints(aws, deployment):
    target = EksTarget(deployment.cluster)
    step = target.ensure_node_pools(deployment)
    assert not step.ready and "creating" in step.message  # created this pass; ready on a later one
    assert target.ensure_node_pools(deployment).ready
    prefill = _eks(aws).describe_nodegroup(clusterName="gpu-prod",
                                           nodegroupName="tandem-ml-research-llama-prefill")["nodegroup"]
    assert prefill["instanceTypes"] == ["p5.48xlarge"]
    assert prefill["scalingConfig"] == {"minSize": 1, "maxSize": 1, "desiredSize": 1}
    assert prefill["labels"]["tandem.dev/pool"] == "prefill"
    assert {"key": "vpc.amazonaws.com/efa", "value": "true", "effect": "NO_SCHEDULE"} in prefill["taints"]
    decode = _eks(aws).describe_nodegroup(clusterName="gpu-prod",
                                          nodegroupName="tandem-ml-research-llama-decode")["nodegroup"]
    assert decode["scalingConfig"]["desiredSize"] == 2
    assert decode["taints"] == [{"key": "nvidia.com/gpu", "value": "true", "effect": "NO_SCHEDULE"}]


def test_an_update_resizes_only_the_pool_that_changed(aws, deployment):
    target = EksTarget(deployment.cluster)
    target.ensure_node_pools(deployment)
    deployment.spec["decode"]["nodes"] = 3
    aws.hits.clear()
    step = target.ensure_node_pools(deployment)
    assert "resizing to 3" in step.message and not step.ready
    updates = [p for m, p in aws.hits if m == "POST" and p.endswith("/update-config")]
    assert updates == ["/clusters/gpu-prod/node-groups/tandem-ml-research-llama-decode/update-config"]
    assert _eks(aws).describe_nodegroup(clusterName="gpu-prod", nodegroupName="tandem-ml-research-llama-decode")[
        "nodegroup"]["scalingConfig"]["desiredSize"] == 3


def test_the_kubernetes_side_authenticates_with_an_sts_presigned_token(aws, emulator, deployment):
    target = EksTarget(deployment.cluster)
    objects, _ = target.desired(deployment)
    target.apply(deployment, objects)
    auth = emulator.authorizations[-1]
    token = auth.removeprefix("Bearer k8s-aws-v1.")
    url = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
    assert "Action=GetCallerIdentity" in url and "X-Amz-Signature=" in url and "x-k8s-aws-id" in url
    rs = emulator.rayservices()[0]
    selector = rs["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]["nodeSelector"]
    assert selector == {"eks.amazonaws.com/nodegroup": "tandem-ml-research-llama-prefill"}


def test_a_little_throttling_is_absorbed_and_a_lot_is_transient(aws, deployment):
    target = EksTarget(deployment.cluster)
    aws.inject("GET", NODEGROUPS, count=2)  # botocore's standard retry mode rides this out
    target.ensure_node_pools(deployment)
    aws.inject("GET", NODEGROUPS, count=10)
    with pytest.raises(TransientError, match="throttling"):
        EksTarget(deployment.cluster).ensure_node_pools(deployment)


def test_denied_credentials_are_permanent(aws, deployment):
    aws.inject("POST", NODEGROUPS, status=403, code="AccessDeniedException")
    aws.inject("GET", NODEGROUPS, status=404, code="ResourceNotFoundException", count=2)
    with pytest.raises(PermanentError, match="refused the worker's credentials"):
        EksTarget(deployment.cluster).ensure_node_pools(deployment)


def test_teardown_deletes_the_kubernetes_objects_and_only_the_node_groups_tandem_created(aws, emulator, deployment):
    eks = _eks(aws)
    eks.create_nodegroup(clusterName="gpu-prod", nodegroupName="someone-elses", nodeRole="arn:aws:iam::123456789012:role/n",
                         subnets=["subnet-1"], scalingConfig={"minSize": 1, "maxSize": 1, "desiredSize": 1})
    target = EksTarget(deployment.cluster)
    target.ensure_node_pools(deployment)
    objects, _ = target.desired(deployment)
    target.apply(deployment, objects)
    for _ in range(5):
        if (step := EksTarget(deployment.cluster).teardown(deployment)).ready:
            break
    assert step.ready, step.message
    assert emulator.live_objects() == []
    assert eks.list_nodegroups(clusterName="gpu-prod")["nodegroups"] == ["someone-elses"]
