"""A deployment that cannot serve says why within two passes and stops paying: on the emulated `eks` target (moto
and the Kubernetes API emulator with its stand-in KubeRay and kubelet), each cause ends with the deployment failed,
ServeRunning naming the stage and the cause in the cluster's own words, the GPU node groups at zero nodes (kept for
a retry), and a `released` event with how long they were billed and what that cost. A cause that cannot heal fails
it at once; any other one, foreseen or not, fails it at its serving deadline."""
import datetime as dt

import boto3
import pytest
from django.utils import timezone

from deployments.conditions import condition_get
from deployments.lifecycle import Status
from deployments.models import Cluster, Deployment, Membership
from deployments.services.actions import deployment_approve, deployment_request, deployment_retry
from deployments.spend import deployment_hourly_usd, deployment_spend_usd
from tests.factories import RUNTIME_IMAGE, RUNTIME_IMAGES, ClusterFactory, MembershipFactory, TeamFactory, spec_input
from tests.support.k8s_emulator import ContainerFault
from tests.support.eks_nodes import eks_emulated
from workers.pipeline import reconcile_pass

REGION = "us-west-2"
CRASH_LOG = ("INFO worker.py:1 Connecting to existing Ray cluster\n"
             "RuntimeError: CUDA error: no kernel image is available for execution on the device\n")


def _row(d) -> Deployment:
    return Deployment.objects.get(pk=d.pk)


def _passes(d, until, *, most: int = 12) -> Deployment:
    """Run reconcile passes (as the worker would, one after another) until `until(row)`, at most `most`."""
    for _ in range(most):
        if until(row := _row(d)):
            return row
        reconcile_pass(d.pk)
    if until(row := _row(d)):
        return row
    raise AssertionError(f"not there after {most} passes: {row.status} {row.status_reason} {row.conditions}")


def _sizes(aws, d) -> dict[str, int]:
    eks = boto3.client("eks", region_name=REGION, endpoint_url=aws.url)
    return {stage: eks.describe_nodegroup(clusterName="gpu-prod", nodegroupName=f"tandem-d{d.pk}-{stage}")[
        "nodegroup"]["scalingConfig"]["desiredSize"] for stage in ("prefill", "decode")}


@pytest.fixture
def eks(aws, emulator, db, redis_client):
    made = eks_emulated(aws, emulator, name="gpu-prod", region=REGION)  # with the system node group for the heads
    return ClusterFactory(name="eks-prod", kind=Cluster.Kind.EKS, config={
        "region": REGION, "cluster_name": "gpu-prod", "aws_endpoint_url": aws.url,
        "kubernetes_endpoint_url": emulator.base_url, "node_role_arn": "arn:aws:iam::123456789012:role/nodes",
        "subnet_ids": made["subnet_ids"], "model_sources": {"s3": ["s3://models"]},
        "runtime_images": RUNTIME_IMAGES})


def _request_and_approve(cluster, spec: dict) -> Deployment:
    """Requested and approved through the services, so its timeline (and so its cost) is the real one."""
    team = TeamFactory(slug="ml-research", gpu_quota=64)
    member = MembershipFactory(team=team, role=Membership.Role.MEMBER).user
    admin = MembershipFactory(team=team, role=Membership.Role.ADMIN).user
    d = deployment_request(actor=member, team=team, cluster=cluster, name="llama", spec=spec)
    return deployment_approve(actor=admin, deployment=d, generation=d.generation, comment="go")


@pytest.fixture
def approved(eks):
    return _request_and_approve(eks, spec_input())


def _failed_and_released(aws, emulator, d) -> Deployment:
    """Passes until it failed; then the pass its failure asked for releases its nodes."""
    d = _passes(d, lambda r: r.status == Status.FAILED)
    assert _sizes(aws, d) == {"prefill": 1, "decode": 1}  # failing frees nothing by itself: the release does
    d = _passes(d, lambda r: r.released_at is not None)
    assert _sizes(aws, d) == {"prefill": 0, "decode": 0}  # kept, at zero nodes, for a retry
    assert emulator.rayservices() == []
    released = d.events.get(kind="released")
    assert released.after == {"released": True}
    assert "Its nodes were billed for 0.00 h (since " in released.message and "$0.0" in released.message
    assert deployment_hourly_usd(d) == 0.0
    return d


def test_an_image_that_does_not_exist_fails_at_once_naming_it_and_releases_the_nodes(aws, emulator, approved):
    emulator.registry = set()  # the image was registered, then deleted from ECR: every pod waits in ImagePullBackOff
    d = _passes(approved, lambda r: condition_get(r.conditions, "ServeRunning") and
                condition_get(r.conditions, "ServeRunning")["reason"] == "ImagePullBackOff", most=4)
    assert d.status == Status.FAILED  # within two passes of its pods' first status: the same pass saw it
    serve = condition_get(d.conditions, "ServeRunning")
    image = RUNTIME_IMAGE
    for stage in ("head", "prefill", "decode"):
        assert f"{stage}: ImagePullBackOff: container ray-" in serve["message"]
    assert f"cannot pull {image}" in serve["message"] and ": not found" in serve["message"]
    assert d.status_reason.startswith("It cannot serve, and waiting will not change that: ")
    assert d.events.filter(kind="not_serving", message__contains="ImagePullBackOff").exists()
    _failed_and_released(aws, emulator, d)


def test_a_bundle_no_node_advertises_fails_at_once_once_every_ray_pod_is_up(aws, emulator, eks, monkeypatch):
    """The second net behind the request-time check (deployments.placement): if Tandem's model of Ray's labels were
    wrong, as main's was for A100 nodes (`A100-40G`, which Ray never gives a node), Ray itself reports the replicas it
    cannot place, and on a complete Ray cluster with fixed node groups nothing will ever take them. The stand-in
    plays Ray with its own rules (tests.support.ray_rules, checked against Ray 2.60's code)."""
    from deployments import placement

    monkeypatch.setattr(placement, "ray_accelerator_label", lambda product: "A100-40G")  # main's label, put back
    p4d = {"instance_type": "p4d.24xlarge", "nodes": 1, "gpus_per_node": 8, "tensor_parallel_size": 8}
    d = _failed_and_released(aws, emulator, _request_and_approve(eks, spec_input(prefill=p4d, decode=p4d)))
    assert d.status_reason.startswith("It cannot serve, and waiting will not change that: prefill: PlacementInfeasible: "
                                      "Ray has not placed 1 Prefill:llama-3-8b replica(s) for over 30 s: each asks for "
                                      "the bundles [{"), d.status_reason
    # Ray's own words: the bundles as Serve prints them (the first holds the replica actor's CPU too; Ray merges its
    # keys through a set, so their order is Ray's to choose)
    assert d.status_reason.count('"accelerator_type:A100-40G": 0.001') >= 2
    assert "decode: PlacementInfeasible: Ray has not placed 1 Decode:llama-3-8b replica(s)" in d.status_reason
    assert "every node of the Ray cluster is up and none can take them, so they never will be" in d.status_reason


def test_a_container_killed_for_memory_at_start_fails_at_once(aws, emulator, approved):
    emulator.container_faults["prefill"] = ContainerFault.oom()
    d = _failed_and_released(aws, emulator, approved)
    assert "prefill: OOMKilled: container ray-worker was killed for running out of memory (exit code 137) before " \
           "it was ever ready; its memory limit is " in d.status_reason
    assert "decode" not in condition_get(d.conditions, "ServeRunning")["message"]


def test_a_serve_replica_whose_engine_raises_at_start_fails_with_the_engines_reason(aws, emulator, approved):
    emulator.fail_apps = True  # Serve's DEPLOY_FAILED as recorded on the local PD stack
    d = _failed_and_released(aws, emulator, approved)
    assert d.status_reason.startswith("Ray Serve could not deploy the application: Decode:llama and Prefill:llama: "
                                      "RuntimeError: Failed to create vLLM engine config")
    assert condition_get(d.conditions, "ServeRunning")["reason"] == "ReplicaStartFailed"


def test_a_crash_loop_is_shown_with_its_last_log_lines_and_fails_at_the_serving_deadline(aws, emulator, approved):
    emulator.container_faults["decode"] = ContainerFault.crash(CRASH_LOG)
    d = _passes(approved, lambda r: r.serve_deadline_at is not None and "CrashLoopBackOff" in
                (condition_get(r.conditions, "ServeRunning") or {}).get("message", ""))
    assert d.status == Status.PROVISIONING  # a crash loop may heal: the deadline decides
    serve = condition_get(d.conditions, "ServeRunning")
    assert serve["reason"] == "CrashLoopBackOff"
    assert serve["message"] == ("decode: CrashLoopBackOff: container ray-worker keeps crashing, restarted 4 times "
                                "(last exit: Error 1); its last log lines: INFO worker.py:1 Connecting to existing "
                                "Ray cluster | RuntimeError: CUDA error: no kernel image is available for execution "
                                "on the device")
    # Its planned start: the image, weights up to half a g6e.12xlarge's GPU memory, the engines, and the grace.
    assert 15 * 60 < (d.serve_deadline_at - timezone.now()).total_seconds() < 25 * 60
    assert reconcile_pass(d.pk) is not None and _row(d).status == Status.PROVISIONING  # before it: waits
    Deployment.objects.filter(pk=d.pk).update(serve_deadline_at=timezone.now() - dt.timedelta(seconds=1))
    d = _failed_and_released(aws, emulator, d)
    assert d.status_reason.startswith("Not serving 19 min after its nodes were ready, the deadline from its planned "
                                      "start of 9 min (the 15 GiB image pulled in 3 min, up to 96 GiB of weights "
                                      "loaded in 3 min, the engines started in 3 min) and the cluster's grace of 10 "
                                      "min. Last seen: decode: CrashLoopBackOff: "), d.status_reason
    assert "no kernel image is available" in d.status_reason


def test_an_unforeseen_waiting_reason_is_shown_in_the_kubelets_words(aws, emulator, approved):
    """Nothing in Tandem names CreateContainerConfigError: the rule is generic, and the deadline decides."""
    emulator.container_faults["prefill"] = ContainerFault(
        waiting=("CreateContainerConfigError", 'secret "tandem-model-access" not found'))
    d = _passes(approved, lambda r: r.serve_deadline_at is not None and "CreateContainerConfigError" in
                (condition_get(r.conditions, "ServeRunning") or {}).get("message", ""))
    assert condition_get(d.conditions, "ServeRunning")["message"] == (
        'prefill: CreateContainerConfigError: container ray-worker: secret "tandem-model-access" not found')
    assert d.status == Status.PROVISIONING


def test_a_retry_brings_the_released_node_groups_back_and_billing_with_them(aws, emulator, approved):
    emulator.registry = set()
    d = _failed_and_released(aws, emulator, approved)
    assert deployment_spend_usd(deployment=d, since=d.created_at, until=timezone.now() + dt.timedelta(hours=1)) \
        == deployment_spend_usd(deployment=d, since=d.created_at, until=timezone.now())  # nothing after release
    emulator.registry = None  # the image is pushed
    d = deployment_retry(actor=d.requested_by, deployment=d)
    assert d.released_at is None and d.serve_deadline_at is None
    d = _passes(d, lambda r: r.status == Status.RUNNING)
    assert _sizes(aws, d) == {"prefill": 1, "decode": 1}
    assert deployment_hourly_usd(d) > 0


# --- the same on an existing Ray cluster: the application goes -----------------------------------------------------
@pytest.fixture
def on_ray(db, dashboard, monkeypatch, redis_client, tmp_path):
    import json

    from deployments.spec import spec_parse
    from tests.factories import DeploymentFactory, local_spec_input
    from tests.support.ray_dashboard import TEST_TOKEN

    model = tmp_path / "tiny-llama"  # on the (local) Ray cluster's machine, as the preflight reads it
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 2048}))
    monkeypatch.setenv("TANDEM_CLUSTER_TEST_RAY_TOKEN", TEST_TOKEN)
    cluster = ClusterFactory(name="local", kind=Cluster.Kind.RAY, secret_ref="env:TANDEM_CLUSTER_TEST_RAY_TOKEN",
                             config={"dashboard_url": dashboard.url, "serve_url": dashboard.url,
                                     "model_sources": {"paths": [str(tmp_path)]}})
    spec = spec_parse(local_spec_input(model={"id": "tiny-llama", "source": str(model)}), target_kind="ray").to_dict()
    return DeploymentFactory(team=TeamFactory(slug="ml"), cluster=cluster, name="tiny", spec=spec,
                             status=Status.APPROVED)


def test_on_ray_a_failed_deployments_application_goes_and_an_unreachable_cluster_is_tried_again_quietly(
        dashboard, on_ray):
    dashboard.fail_apps = True  # Serve's DEPLOY_FAILED, recorded
    d = _passes(on_ray, lambda r: r.status == Status.FAILED)
    assert dashboard.apps, d.status_reason  # failing removes nothing by itself
    dashboard.inject("GET", 503, count=1000)  # then the cluster stops answering
    for _ in range(4):
        assert reconcile_pass(d.pk) is not None  # the release is tried again, later and later
    d = _row(d)
    assert d.released_at is None and d.status == Status.FAILED
    tries = d.events.filter(kind="transient_error")
    assert tries.count() == 1 and tries.get().message.startswith(
        "Releasing what the failed deployment runs on: The Ray dashboard of local answered 503")
    dashboard.faults.clear()  # back: the release goes through and the application is gone
    d = _passes(d, lambda r: r.released_at is not None)
    assert not dashboard.apps or all(a["deleting"] for a in dashboard.apps.values())
    assert d.events.get(kind="released").message.startswith("Released what the failed deployment ran on: ")
