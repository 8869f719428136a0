"""What an `eks` cluster's config must say (node role, subnets) and may say (capacity, deadline, team roles), and
the S3 policy generated for a team's pod role from it."""
import io
import json

from django.core.management import call_command

from deployments.cluster_config import cluster_config_of
from deployments.team_roles import team_role_arn, team_weights_policy
from tests.factories import ClusterFactory, TeamFactory

EKS = {"region": "us-west-2", "cluster_name": "gpu-prod", "node_role_arn": "arn:aws:iam::123456789012:role/nodes",
       "subnet_ids": ["subnet-0123456789abcdef0"]}
SOURCES = {"s3": ["s3://acme-models/shared"], "teams": {"ml": {"s3": ["s3://acme-ml"]},
                                                       "vision": {"s3": ["s3://acme-vision/v1"]}}}


def _register(api, config):
    return api.post("/api/v1/clusters/", {"name": "eks-prod", "kind": "eks", "config": config}, format="json")


def test_an_eks_cluster_without_node_role_or_subnets_is_refused_naming_each(api, platform_admin):
    api.force_authenticate(platform_admin)
    r = _register(api, {"region": "us-west-2", "cluster_name": "gpu-prod"})
    assert r.status_code == 400
    errors = r.json()["errors"]["config"]
    assert any(e.startswith("node_role_arn: the node group IAM role ARN") for e in errors)
    assert any(e.startswith("subnet_ids: a list of private subnet ids") for e in errors)
    r = _register(api, {**EKS, "subnet_ids": ["subnet-1"]})  # not a subnet id EC2 could have
    assert r.status_code == 400 and r.json()["errors"]["config"][0].startswith("subnet_ids:")
    assert _register(api, EKS).status_code == 201


def test_capacity_deadline_and_team_roles_are_checked_at_registration(api, platform_admin):
    api.force_authenticate(platform_admin)
    r = _register(api, {**EKS, "capacity_type": "RESERVED", "provisioning_deadline_minutes": 0,
                        "team_roles": {"ml": "not-an-arn"}})
    errors = r.json()["errors"]["config"]
    assert r.status_code == 400 and [e.split(":")[0] for e in errors] == \
        ["capacity_type", "provisioning_deadline_minutes", "team_roles"]
    r = _register(api, {**EKS, "capacity_type": "CAPACITY_BLOCK"})
    assert r.status_code == 400 and "needs the capacity block's reservation id" in r.json()["errors"]["config"][0]
    ok = _register(api, {**EKS, "capacity_type": "CAPACITY_BLOCK",
                         "capacity_reservation_ids": {"p5.48xlarge": "cr-0123456789abcdef0"},
                         "provisioning_deadline_minutes": 90,
                         "team_roles": {"ml": "arn:aws:iam::123456789012:role/tandem-ml"}})
    assert ok.status_code == 201, ok.json()


def test_a_teams_pod_role_may_read_only_its_own_and_the_shared_weights():
    config = cluster_config_of("eks", {**EKS, "model_sources": SOURCES,
                                       "team_roles": {"ml": "arn:aws:iam::123456789012:role/tandem-ml"}})
    policy = team_weights_policy(config, "ml")
    reads = [s for s in policy["Statement"] if s["Action"] == ["s3:GetObject"]]
    assert [r for s in reads for r in s["Resource"]] == ["arn:aws:s3:::acme-models/shared/*", "arn:aws:s3:::acme-ml/*"]
    lists = {s["Resource"]: s.get("Condition") for s in policy["Statement"] if s["Action"] == ["s3:ListBucket"]}
    assert lists == {"arn:aws:s3:::acme-models": {"StringLike": {"s3:prefix": ["shared", "shared/*"]}},
                     "arn:aws:s3:::acme-ml": None}
    assert "acme-vision" not in json.dumps(policy)
    assert team_role_arn(config, "ml") == "arn:aws:iam::123456789012:role/tandem-ml"
    assert team_role_arn(config, "vision") is None


def test_the_policy_command_prints_the_teams_policy(db):
    ClusterFactory(name="eks-prod", kind="eks", config={**EKS, "model_sources": SOURCES})
    TeamFactory(slug="vision")
    out = io.StringIO()
    call_command("tandem_team_policy", "eks-prod", "vision", stdout=out, stderr=io.StringIO())
    policy = json.loads(out.getvalue())
    assert policy == team_weights_policy(cluster_config_of("eks", {**EKS, "model_sources": SOURCES}), "vision")
    assert policy["Statement"][0]["Resource"] == ["arn:aws:s3:::acme-models/shared/*", "arn:aws:s3:::acme-vision/v1/*"]


def test_an_approval_past_ekss_node_group_limit_is_refused_with_the_numbers(api, team_admin, team):
    from deployments.lifecycle import Status
    from tests.factories import MODEL_SOURCES, RUNTIME_IMAGES, DeploymentFactory

    cluster = ClusterFactory(name="eks-prod", kind="eks", config={**EKS, "model_sources": MODEL_SOURCES,
                                                                   "runtime_images": RUNTIME_IMAGES})
    team.gpu_quota = 10_000
    team.save()
    for i in range(14):  # 28 node groups, paused ones (kept at zero nodes) included
        DeploymentFactory(team=team, cluster=cluster, name=f"d{i}",
                          status=Status.PAUSED if i % 2 else Status.RUNNING)
    fits = DeploymentFactory(team=team, cluster=cluster, name="fits", status=Status.PENDING_APPROVAL)
    over = DeploymentFactory(team=team, cluster=cluster, name="over", status=Status.PENDING_APPROVAL)
    api.force_authenticate(team_admin)
    r = api.post(f"/api/v1/deployments/{fits.pk}/approve/", {"generation": fits.generation}, format="json")
    assert r.status_code == 200, r.json()
    r = api.post(f"/api/v1/deployments/{over.pk}/approve/", {"generation": over.generation}, format="json")
    assert 400 <= r.status_code < 500 and r.json()["code"] == "quota_exceeded", r.json()
    assert "would need 32 managed node groups; EKS allows 30 per cluster" in json.dumps(r.json())
    over.refresh_from_db()
    assert over.status == Status.PENDING_APPROVAL
