"""A side-by-side rollout on the emulated eks target: a second RayService beside the first, node groups grown by the
surge only (boto3 against moto's server, the real kubernetes client against the emulator), and quota and cost
counting the surge while the rollout is in progress and not after."""
import time

import boto3
import pytest
from django.utils import timezone
from kubernetes import client as k8s

from deployments.catalog import INSTANCE_TYPES
from deployments.lifecycle import Status
from deployments.manifests import DEPLOYMENT_LABEL
from deployments.models import Cluster, Deployment, Membership, Rollout
from deployments.services.actions import deployment_approve, deployment_update
from deployments.services.quota import team_gpus_held
from deployments.services.rollouts import rollout_active, rollout_record
from deployments.spec import STAGES
from deployments.spend import deployment_hourly_usd, deployment_spend_usd
from tests.factories import (MODEL_SOURCES, RUNTIME_IMAGES, ClusterFactory, DeploymentFactory, MembershipFactory,
                             TeamFactory, spec_input)
from observability.models import ConformanceRun
from tests.support.eks_nodes import eks_emulated
from tests.support.processes import wait_for
from usage.models import RequestRecord
from workers.pipeline import reconcile_pass
from tests.workers.conftest import gpu_spec
from workers.targets.base import AppUnit
from workers.targets.eks import EksTarget
from workers.targets.kubernetes import GROUP, PLURAL, VERSION

REGION = "us-west-2"
R = 4  # replicas per pool: one g6e.xlarge node each
# One replica moves per pass with max_surge 1 (workers.rollout_plan): (old, new) replicas per pool.
SEQUENCE = [(4, 0), (4, 1), (3, 1), (3, 2), (2, 2), (2, 3), (1, 3), (1, 4), (0, 4)]
PRICE = INSTANCE_TYPES["g6e.xlarge"].hourly_usd


def _pool():
    return {"instance_type": "g6e.xlarge", "nodes": R, "gpus_per_node": 1, "tensor_parallel_size": 1,
            "replicas_min": R, "replicas_max": R}


def _request(source="s3://models/llama-3-8b"):
    return spec_input(model={"id": "llama-3-8b", "source": source}, prefill=_pool(), decode=_pool())


@pytest.fixture
def running(aws, emulator, db):
    """A running deployment of 4 replicas per pool on an EKS cluster (moto) whose API server is the emulator, its
    node groups and RayService in place; and two admins of its team (one proposes, the other approves)."""
    made = eks_emulated(aws, emulator, name="gpu-prod", region=REGION)
    cluster = ClusterFactory(name="eks-prod", kind=Cluster.Kind.EKS, config={
        "region": REGION, "cluster_name": "gpu-prod", "aws_endpoint_url": aws.url,
        "kubernetes_endpoint_url": emulator.base_url, "node_role_arn": "arn:aws:iam::123456789012:role/nodes",
        "subnet_ids": made["subnet_ids"], "model_sources": MODEL_SOURCES, "runtime_images": RUNTIME_IMAGES})
    team = TeamFactory(slug="ml-research", gpu_quota=10)
    admins = [MembershipFactory(team=team, role=Membership.Role.ADMIN).user for _ in range(2)]
    d = DeploymentFactory(team=team, cluster=cluster, name="llama", status=Status.RUNNING,
                          spec=gpu_spec(prefill=_pool(), decode=_pool()))
    target = EksTarget(cluster)
    _pools_settled(target, d)
    target.apply(d, target.desired(d)[0])
    return d, admins, target


def _new_weights(d, admins) -> Deployment:
    """Update the deployment to new weights, as its team does: proposed by one admin, approved by the other."""
    deployment_update(actor=admins[0], deployment=d, spec=_request(source="s3://models/llama-3-8b-v2"))
    d = Deployment.objects.get(pk=d.pk)
    deployment_approve(actor=admins[1], deployment=d, generation=d.generation, proposed_hash=d.proposed_spec_hash)
    return Deployment.objects.get(pk=d.pk)


def _pools_settled(target, d, extra=None):
    """Node groups as ensure_node_pools asks for them, once moto has acted on the change."""
    for _ in range(3):
        if target.ensure_node_pools(d, extra).ready:
            return
    raise AssertionError("the node groups did not settle")


def _sizes(aws, d) -> dict[str, int]:
    eks = boto3.client("eks", region_name=REGION, endpoint_url=aws.url)
    return {s: eks.describe_nodegroup(clusterName="gpu-prod", nodegroupName=f"tandem-d{d.pk}-{s}")["nodegroup"][
        "scalingConfig"]["desiredSize"] for s in STAGES}


def _rayservices(target, d) -> dict[str, dict]:
    """The team namespace's RayServices by name, read through the API server."""
    found = k8s.CustomObjectsApi(target.api).list_namespaced_custom_object(GROUP, VERSION, target.namespace(d), PLURAL)
    return {rs["metadata"]["name"]: rs for rs in found["items"]}


def _workers(rayservices) -> dict[str, int]:
    """Worker pods per pool over all the RayServices: the nodes they take (one pod per g6e.xlarge node)."""
    return {s: sum(g["replicas"] for rs in rayservices.values()
                   for g in rs["spec"]["rayClusterConfig"]["workerGroupSpecs"] if g["groupName"] == s)
            for s in STAGES}


def test_the_spend_of_a_rollout_counts_its_surge_nodes_for_as_long_as_it_ran(aws, running):
    d = _new_weights(*running[:2])
    rollout = rollout_active(d)
    start = rollout.created_at
    rollout_record(rollout=rollout, state=Rollout.State.DONE, finished_at=start + timezone.timedelta(hours=1))
    after = start + timezone.timedelta(hours=2)
    since = start + timezone.timedelta(microseconds=1)  # the two hours after the update, its spec's nodes only
    assert deployment_spend_usd(deployment=d, since=since, until=after) == pytest.approx(
        2 * 8 * PRICE + 1 * 2 * PRICE, rel=1e-4)


def test_an_update_whose_surge_does_not_fit_the_quota_is_refused_at_approval_saying_so(aws, running, api):
    d, admins, _ = running
    d.team.gpu_quota = 9  # the spec's 8 fit; with one more node per pool beside them, 10 do not
    d.team.save(update_fields=["gpu_quota"])
    deployment_update(actor=admins[0], deployment=d, spec=_request(source="s3://models/llama-3-8b-v2"))
    d = Deployment.objects.get(pk=d.pk)
    api.force_authenticate(admins[1])
    r = api.post(f"/api/v1/deployments/{d.pk}/approve/",
                 {"generation": d.generation, "proposed_spec_hash": d.proposed_spec_hash}, format="json")
    assert r.status_code == 400 and r.json()["code"] == "quota_exceeded"
    assert r.json()["detail"].startswith("This needs 10 GPUs (8 for the spec and 2 for the rollout's surge: ")
    assert "team ml-research already holds 0 of its 9-GPU quota" in r.json()["detail"]
    d = Deployment.objects.get(pk=d.pk)
    assert d.status == Status.RUNNING and d.spec_typed.model_source == "s3://models/llama-3-8b"
    assert d.proposed_spec is not None and not d.rollouts.exists()  # still waiting for more quota


def test_a_later_generation_is_its_own_rayservice_whose_endpoint_selects_only_its_head(aws, emulator, running):
    d, _, target = running
    unit = AppUnit(3, d.spec_typed, replicas={"prefill": 1, "decode": 2})
    objects = target.desired(d, unit)[0]
    svc, rs = (next(o for o in objects if o["kind"] == k) for k in ("Service", "RayService"))
    assert rs["metadata"]["name"] == "llama-g3" and svc["metadata"]["name"] == "llama-g3-endpoint"
    assert svc["spec"]["selector"][DEPLOYMENT_LABEL] == "llama-g3"
    assert {g["groupName"]: g["replicas"] for g in rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]} == \
        {"prefill": 1, "decode": 2}
    target.apply(d, objects)
    assert target.observe(d, unit=unit).endpoint_url == target.endpoint_url(d, unit)
    assert target.observe(d).endpoint_url == target.endpoint_url(d) != target.endpoint_url(d, unit)
    assert set(_rayservices(target, d)) == {"llama", "llama-g3"}
    # A teardown of the deployment removes every generation's RayService.
    for _ in range(10):
        if target.teardown(d).ready:
            break
    assert [rs["metadata"]["name"] for rs in emulator.rayservices()] == []


def _traffic(d, generation: int, n: int = 8):
    """What the gateway records for requests a generation served now: alike, so each step is judged fine."""
    now = timezone.now()
    RequestRecord.objects.bulk_create(RequestRecord(
        request_id=f"req-{d.pk}-{generation}-{time.monotonic_ns()}-{i}", deployment_id=d.pk, generation=generation,
        created_at=now, endpoint="chat.completions", stream=True, status_code=200, ttft_ms=40.0, e2e_ms=200.0)
        for i in range(n))


def test_reconcile_passes_roll_new_weights_out_on_eks_within_one_extra_node_per_pool(aws, running, settings,
                                                                                    redis_client):
    """The rollout as the reconciler runs it (workers.rollout), pass after pass against moto and the emulator."""
    settings.TANDEM_ROLLOUT_DRAIN_SECONDS = 0
    d, admins, target = running
    ConformanceRun.objects.create(deployment=d, generation=d.generation, passed=True, started_at=timezone.now(),
                                  base_url="http://gw/v1", model="llama-3-8b")
    deployment_update(actor=admins[0], deployment=d, spec=spec_input(
        model={"id": "llama-3-8b", "source": "s3://models/llama-3-8b-v2"}, prefill=_pool(), decode=_pool(),
        rollout={"step_seconds": 5}))
    d = Deployment.objects.get(pk=d.pk)
    deployment_approve(actor=admins[1], deployment=d, generation=d.generation, proposed_hash=d.proposed_spec_hash)
    d = Deployment.objects.get(pk=d.pk)
    rollout = rollout_active(d)
    serving = _rayservices(target, d)["llama"]["metadata"]["uid"]
    sizes, held, hourly, moves = [], [], [], [(R, 0)]

    def passed(check):
        def one():
            reconcile_pass(d.pk)
            row = Deployment.objects.get(pk=d.pk)
            sizes.append(_sizes(aws, row))
            rayservices = _rayservices(target, row)
            workers = _workers(rayservices)
            assert all(workers[p] <= sizes[-1][p] for p in STAGES), (workers, sizes[-1])  # a node for every worker
            if "llama" in rayservices:  # the old generation gives back replicas on the Ray cluster it serves from
                assert rayservices["llama"]["metadata"]["uid"] == serving
            held.append(team_gpus_held(team=row.team))
            hourly.append(round(deployment_hourly_usd(row) / PRICE, 6))
            replicas = row.rollouts.get(pk=rollout.pk).replicas
            if (move := (replicas["old"]["prefill"], replicas["new"]["prefill"])) != moves[-1]:
                moves.append(move)
            return check(row, row.rollouts.get(pk=rollout.pk))
        return one

    wait_for(passed(lambda row, r: r.state == "checking"), timeout=60, every=0.1, what="the new generation checked")
    ConformanceRun.objects.create(deployment=d, generation=rollout.to_generation, passed=True,
                                  started_at=timezone.now(), base_url="http://gw/v1", model="llama-3-8b")
    for weight in (10, 50, 100):
        wait_for(passed(lambda row, r, w=weight: row.next_weight == w or row.status == Status.RUNNING), timeout=60,
                 every=0.1, what=f"{weight}% of requests to the new generation")
        _traffic(d, rollout.from_generation)
        _traffic(d, rollout.to_generation)
    wait_for(passed(lambda row, r: row.status == Status.RUNNING), timeout=90, every=0.1, what="the rollout done")

    r = Rollout.objects.get(pk=rollout.pk)
    assert (r.state, r.peak_surge) == (Rollout.State.DONE, {"prefill": 1, "decode": 1})
    assert moves == SEQUENCE
    assert max(s["prefill"] for s in sizes) == max(s["decode"] for s in sizes) == R + 1
    assert all(s[p] <= R + 1 for s in sizes for p in STAGES)
    # While it rolled out the team held (and paid for) the spec's 8 GPUs and the surge's 2; after, the spec's.
    assert held[0] == 10 and hourly[0] == pytest.approx(10) and held[-1] == 8 and hourly[-1] == pytest.approx(8)
    assert set(held) == {10, 8} and held == sorted(held, reverse=True)
    wait_for(passed(lambda row, r: _sizes(aws, row) == {"prefill": R, "decode": R}), timeout=30, every=0.1,
             what="the node groups back at the spec's size")
    assert set(_rayservices(target, d)) == {f"llama-g{rollout.to_app}"}
