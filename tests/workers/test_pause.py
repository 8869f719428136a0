"""Pause and resume through the reconciler, on the emulated Kubernetes API and on EKS (moto): what goes, what
stays, and that users wait for conformance again after a resume."""
import boto3
import pytest

from deployments.conditions import condition_get
from deployments.lifecycle import Status
from deployments.models import Cluster, Deployment
from deployments.services.pause import deployment_pause, deployment_resume
from deployments.services.quota import team_gpus_held
from observability.models import ConformanceRun
from tests.factories import RUNTIME_IMAGES, ClusterFactory, DeploymentFactory, MembershipFactory, TeamFactory
from tests.observability.mock_openai import MODEL
from tests.support.broker import queued
from tests.support.eks_nodes import eks_emulated
from tests.support.processes import wait_for
from tests.workers.conftest import gpu_spec
from workers.pipeline import reconcile_pass
from workers.targets.eks import EksTarget

RUN_TASK = "observability.tasks.run_conformance"
REGION = "us-west-2"


def _row(d) -> Deployment:
    return Deployment.objects.get(pk=d.pk)


def _settle(d, status: str):
    wait_for(lambda: reconcile_pass(d.pk) is None and _row(d).status == status, timeout=30, what=status)
    return _row(d)


@pytest.fixture
def serving(k8s_cluster, redis_client):
    """Running, with a passed conformance run of its generation: users are let in."""
    team = TeamFactory(slug="ml-research", gpu_quota=64)
    spec = gpu_spec(model={"id": MODEL, "source": f"s3://models/{MODEL}"})
    d = DeploymentFactory(team=team, cluster=k8s_cluster, name="llama", spec=spec, status=Status.APPROVED,
                          requested_by=MembershipFactory(team=team).user)
    d = _settle(d, Status.RUNNING)
    ConformanceRun.objects.create(deployment=d, generation=d.generation, passed=True, started_at=d.updated_at,
                                  base_url="http://gw/v1", model=MODEL)
    reconcile_pass(d.pk)
    assert condition_get(_row(d).conditions, "EndpointReady")["reason"] == "Answering"
    return _row(d)


def test_pause_deletes_the_rayservice_keeps_the_deployment_and_a_resume_is_checked_again(
        serving, emulator, redis_client):
    d = serving
    assert emulator.rayservices() and team_gpus_held(team=d.team) == 8
    deployment_pause(actor=d.requested_by, deployment=d)
    d = _settle(d, Status.PAUSED)
    assert emulator.rayservices() == [] and team_gpus_held(team=d.team) == 0
    assert [(c["type"], c["reason"]) for c in d.conditions] == [("ServeRunning", "Paused")]
    assert d.ready_estimate_seconds and d.ready_estimate_seconds >= 1  # from its own approval → running
    assert d.name == "llama" and d.spec == serving.spec and not d.applied_hash

    redis_client.flushdb()
    deployment_resume(actor=d.requested_by, deployment=d)
    d = _settle(d, Status.RUNNING)
    assert len(emulator.rayservices()) == 1
    # The run before the pause checked an earlier generation: users wait for a new one (the gateway's `checking`).
    assert condition_get(d.conditions, "EndpointReady")["reason"] == "ConformancePending"
    assert condition_get(d.conditions, "ConformancePassed") is None
    assert queued(redis_client, task=RUN_TASK) == [[d.pk]]


@pytest.fixture
def eks_serving(aws, emulator, db):
    made = eks_emulated(aws, emulator, name="gpu-prod", region=REGION)
    cluster = ClusterFactory(name="eks-prod", kind=Cluster.Kind.EKS, config={
        "region": REGION, "cluster_name": "gpu-prod", "aws_endpoint_url": aws.url,
        "kubernetes_endpoint_url": emulator.base_url, "node_role_arn": "arn:aws:iam::123456789012:role/nodes",
        "subnet_ids": made["subnet_ids"], "model_sources": {"s3": ["s3://models"]},
        "runtime_images": RUNTIME_IMAGES})
    return DeploymentFactory(team=TeamFactory(slug="ml-research"), cluster=cluster, name="llama",
                             spec=gpu_spec(), status=Status.RUNNING)


def test_on_eks_a_pause_scales_the_node_groups_to_zero_and_a_resume_back(aws, emulator, eks_serving):
    d = eks_serving
    target = EksTarget(d.cluster)
    for _ in range(3):
        target.ensure_node_pools(d)
    objects, _ = target.desired(d)
    target.apply(d, objects)
    for _ in range(5):
        if (step := EksTarget(d.cluster).pause(d)).ready:
            break
    assert step.ready and "scaled to zero" in step.message
    eks = boto3.client("eks", region_name=REGION, endpoint_url=aws.url)
    for stage in ("prefill", "decode"):
        ng = eks.describe_nodegroup(clusterName="gpu-prod", nodegroupName=f"tandem-d{d.pk}-{stage}")["nodegroup"]
        assert ng["scalingConfig"] == {"minSize": 0, "maxSize": 1, "desiredSize": 0}
    assert emulator.rayservices() == []
    step = EksTarget(d.cluster).ensure_node_pools(d)  # what the resume's pass does first
    assert "resizing to 1" in step.message


def test_on_eks_a_deployment_still_provisioning_is_paused_and_its_node_groups_go_to_zero(aws, emulator, eks_serving):
    """Waiting for GPU capacity bills its node groups: a pause then stops that, as it does for a running one."""
    d = eks_serving
    Deployment.objects.filter(pk=d.pk).update(status=Status.APPROVED)  # just approved: the first pass runs next
    reconcile_pass(d.pk)
    d = _row(d)
    assert d.status == Status.PROVISIONING and d.events.filter(kind="node_pools").exists()
    eks = boto3.client("eks", region_name=REGION, endpoint_url=aws.url)
    names = [f"tandem-d{d.pk}-{stage}" for stage in ("prefill", "decode")]
    assert [eks.describe_nodegroup(clusterName="gpu-prod", nodegroupName=n)["nodegroup"]["scalingConfig"]
            ["desiredSize"] for n in names] == [1, 1]
    deployment_pause(actor=d.requested_by, deployment=d)
    d = _settle(d, Status.PAUSED)
    for name in names:
        ng = eks.describe_nodegroup(clusterName="gpu-prod", nodegroupName=name)["nodegroup"]
        assert ng["scalingConfig"] == {"minSize": 0, "maxSize": 1, "desiredSize": 0}
    assert emulator.rayservices() == [] and team_gpus_held(team=d.team) == 0
    assert d.spec == eks_serving.spec and d.name == "llama"
