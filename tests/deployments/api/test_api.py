"""The REST API as automation uses it: tokens, requests, approval and errors (two tenants: test_two_tenants.py)."""
import pytest

from deployments.models import AccessToken, Cluster, Deployment, Membership, Team
from deployments.services.credentials import credential_mint
from tests.factories import DeploymentFactory, UserFactory, spec_input

pytestmark = pytest.mark.django_db


def bearer(api, user):
    _, raw = credential_mint(model=AccessToken, user=user, name="ci")
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return raw


def create_body(team, cluster, **over):
    return {"team": team.slug, "cluster": cluster.name, "name": "llama-8b", "purpose": "eval", "spec": spec_input(),
            **over}


def test_request_and_approve_over_the_api_with_access_tokens(api, member, team_admin, team, cluster):
    bearer(api, member)
    r = api.post("/api/v1/deployments/", create_body(team, cluster), format="json")
    assert r.status_code == 201, r.json()
    body = r.json()
    assert (body["status"], body["gpus"], body["model"], body["requested_by"]) == ("pending_approval", 8,
                                                                                  "llama-3-8b", member.username)
    decision = {"generation": body["generation"]}
    assert api.post(f"/api/v1/deployments/{body['id']}/approve/", decision, format="json").status_code == 403
    assert Deployment.objects.get(pk=body["id"]).status == "pending_approval"
    bearer(api, team_admin)
    r = api.post(f"/api/v1/deployments/{body['id']}/approve/", {**decision, "comment": "go"}, format="json")
    assert r.status_code == 200 and r.json()["status"] == "approved"
    kinds = [e["kind"] for e in api.get(f"/api/v1/deployments/{body['id']}/events/").json()["results"]]
    assert kinds[:2] == ["approved", "requested"]


def test_bad_input_is_a_400_with_field_messages(api, member, team, cluster):
    bearer(api, member)
    spec = spec_input(prefill={"instance_type": "g9.huge"}, runtime={"ray": "2.59.0", "vllm": "0.29.0"})
    r = api.post("/api/v1/deployments/", create_body(team, cluster, name="Bad Name", spec=spec), format="json")
    assert r.status_code == 400
    errors = r.json()["errors"]
    assert "DNS-1123" in errors["name"][0]
    assert "Unknown instance type 'g9.huge'" in errors["spec.prefill.instance_type"][0]
    assert "ray-2.60.0-vllm-0.29.0" in errors["spec.runtime"][0]


def test_quota_exceeded_is_a_400_with_the_numbers(api, member, team, cluster):
    team.gpu_quota = 4
    team.save()
    bearer(api, member)
    r = api.post("/api/v1/deployments/", create_body(team, cluster), format="json")
    assert r.status_code == 400 and r.json()["code"] == "quota_exceeded"
    assert "needs 8 GPUs" in r.json()["detail"]


@pytest.mark.parametrize("body", [None, [], "x", {"spec": "nope"}, {"team": "ml-research", "spec": {"model": 1}}])
def test_malformed_bodies_never_500(api, member, team, cluster, body):
    bearer(api, member)
    r = api.post("/api/v1/deployments/", body, format="json")
    assert r.status_code == 400


def test_revoked_or_wrong_token_is_refused(api, member):
    raw = bearer(api, member)
    assert api.get("/api/v1/deployments/").status_code == 200
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {raw[:-1]}{'y' if raw.endswith('x') else 'x'}")  # one char off
    assert api.get("/api/v1/deployments/").status_code == 401
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    token = AccessToken.objects.get()
    assert api.delete(f"/api/v1/tokens/{token.pk}/").status_code == 204
    assert api.get("/api/v1/deployments/").status_code == 401


def test_token_secret_is_shown_once_and_stored_hashed(api, member):
    api.force_authenticate(member)
    r = api.post("/api/v1/tokens/", {"name": "laptop"}, format="json")
    secret = r.json()["secret"]
    assert secret.startswith("tdp_")
    listed = api.get("/api/v1/tokens/").json()["results"][0]
    assert "secret" not in listed and "digest" not in listed and listed["last4"] == secret[-4:]
    assert secret not in AccessToken.objects.get().digest


def test_filters_and_ordering(api, member, team, cluster):
    DeploymentFactory(team=team, cluster=cluster, name="a", status="running")
    DeploymentFactory(team=team, cluster=cluster, name="b")
    api.force_authenticate(member)
    names = [d["name"] for d in api.get("/api/v1/deployments/?status=running").json()["results"]]
    assert names == ["a"]
    names = [d["name"] for d in api.get("/api/v1/deployments/?ordering=name").json()["results"]]
    assert names == ["a", "b"]
    assert api.get(f"/api/v1/deployments/?cluster={cluster.name}&team={team.slug}").json()["count"] == 2


def test_cluster_secret_ref_is_write_only_and_only_platform_admins_register(api, member, platform_admin):
    body = {"name": "local", "kind": "ray", "config": {"dashboard_url": "http://127.0.0.1:8265"},
            "secret_ref": "env:TANDEM_CLUSTER_LOCAL_RAY_TOKEN"}
    api.force_authenticate(member)
    assert api.post("/api/v1/clusters/", body, format="json").status_code == 403
    assert not Cluster.objects.filter(name="local").exists()
    api.force_authenticate(platform_admin)
    r = api.post("/api/v1/clusters/", body, format="json")
    assert r.status_code == 201 and "secret_ref" not in r.json() and r.json()["has_secret"] is True
    bad = api.post("/api/v1/clusters/", {**body, "name": "x", "secret_ref": "hunter2"}, format="json")
    assert bad.status_code == 400 and "not the secret itself" in bad.json()["errors"]["secret_ref"][0]
    bad = api.post("/api/v1/clusters/", {"name": "y", "kind": "eks", "config": {"region": "nowhere"}}, format="json")
    assert bad.status_code == 400 and any("region" in m for m in bad.json()["errors"]["config"])


def test_a_hugging_face_token_given_as_itself_is_refused_and_nothing_is_stored(api, platform_admin):
    api.force_authenticate(platform_admin)
    body = {"name": "k", "kind": "kubernetes", "config": {"hf_token_refs": {"ml-research": "hf_AbCdEf0123456789"}}}
    bad = api.post("/api/v1/clusters/", body, format="json")
    assert bad.status_code == 400
    assert bad.json()["errors"]["config"] == [
        "hf_token_refs: ml-research: Give `env:VARIABLE_NAME` or `file:/absolute/path`, not the secret itself."]
    assert "hf_AbCdEf0123456789" not in bad.text and not Cluster.objects.filter(name="k").exists()
    body["config"]["hf_token_refs"]["ml-research"] = "env:TANDEM_CLUSTER_HF_ML_RESEARCH"
    assert api.post("/api/v1/clusters/", body, format="json").status_code == 201


def test_platform_admin_creates_team_and_team_admin_adds_members(api, platform_admin, team_admin, team):
    api.force_authenticate(platform_admin)
    r = api.post("/api/v1/teams/", {"slug": "vision", "name": "Vision", "gpu_quota": 32}, format="json")
    assert r.status_code == 201 and r.json()["gpus_held"] == 0
    newbie = UserFactory(username="newbie")
    api.force_authenticate(team_admin)
    r = api.post("/api/v1/members/", {"team": team.slug, "user": "newbie", "role": "member"}, format="json")
    assert r.status_code == 201
    assert Membership.objects.filter(team=team, user=newbie, role="member").exists()
    assert api.post("/api/v1/teams/", {"slug": "mine", "name": "Mine"}, format="json").status_code == 403
    assert not Team.objects.filter(slug="mine").exists()
