"""Who sees what: a cluster's config is for platform admins; another team's objects named in a request body answer
exactly as objects that do not exist."""
import pytest

from deployments.models import ApiKey, Cluster, Deployment, Membership
from tests.factories import ClusterFactory, DeploymentFactory, MembershipFactory, TeamFactory, UserFactory, spec_input

pytestmark = pytest.mark.django_db
CONFIG = {"region": "us-west-2", "cluster_name": "prod", "role_arn": "arn:aws:iam::123456789012:role/tandem",
          "subnet_ids": ["subnet-0abc1234def567890"], "kubernetes_endpoint_url": "https://10.0.0.1:6443"}


@pytest.fixture
def eks(db):
    return ClusterFactory(name="shared-eks", kind=Cluster.Kind.EKS, config=CONFIG, secret_ref="")


def test_members_see_a_clusters_name_and_kind_only(api, member, eks):
    api.force_authenticate(member)
    listed = api.get("/api/v1/clusters/").json()["results"]
    assert listed == [{"id": eks.pk, "name": "shared-eks", "kind": "eks"}]
    assert api.get("/api/v1/clusters/shared-eks/").json() == {"id": eks.pk, "name": "shared-eks", "kind": "eks"}


def test_platform_admins_see_a_clusters_config(api, platform_admin, eks):
    api.force_authenticate(platform_admin)
    assert api.get("/api/v1/clusters/shared-eks/").json()["config"] == CONFIG


def test_the_request_form_names_clusters_without_their_config(client, member, eks):
    client.force_login(member)
    page = client.get("/deployments/new/").content.decode()
    assert "shared-eks" in page and "123456789012" not in page and "10.0.0.1" not in page


@pytest.fixture
def victim(db):
    """Another team, with a member, a deployment and a key, that the caller (admin of their own team) guesses."""
    team = TeamFactory(slug="victim-team")
    bob = MembershipFactory(team=team, role=Membership.Role.ADMIN, user__username="victim-bob").user
    return {"team": team, "bob": bob,
            "deployment": DeploymentFactory(team=team, cluster=ClusterFactory(), requested_by=bob)}


def same_as_missing(api, url, body_with, body_without, *, swap):
    """POST both bodies; they must answer alike (status, fields, message with the guessed value swapped)."""
    a, b = api.post(url, body_with, format="json"), api.post(url, body_without, format="json")
    text_a = a.content.decode().replace(str(swap[0]), "X")
    text_b = b.content.decode().replace(str(swap[1]), "X")
    assert a.status_code == b.status_code and a.status_code in (400, 404) and text_a == text_b
    return a


def test_another_teams_slug_on_a_request_answers_as_a_missing_one(api, team_admin, team, cluster, victim):
    api.force_authenticate(team_admin)
    body = {"cluster": cluster.name, "name": "sneaky", "spec": spec_input()}
    r = same_as_missing(api, "/api/v1/deployments/", {**body, "team": "victim-team"},
                        {**body, "team": "no-such-team"}, swap=("victim-team", "no-such-team"))
    assert "team" in r.json()["errors"]
    assert not Deployment.objects.filter(name="sneaky").exists()


def test_another_teams_deployment_in_a_keys_scope_answers_as_a_missing_one(api, team_admin, team, victim):
    api.force_authenticate(team_admin)
    their_id, missing = victim["deployment"].pk, victim["deployment"].pk + 1000
    body = {"team": team.slug, "name": "scoped", "all_deployments": False}
    same_as_missing(api, "/api/v1/api-keys/", {**body, "deployments": [their_id]}, {**body, "deployments": [missing]},
                    swap=(their_id, missing))
    assert not ApiKey.objects.filter(name="scoped").exists()


def test_another_teams_member_cannot_be_named_on_a_membership(api, team_admin, team, victim):
    api.force_authenticate(team_admin)
    body = {"team": team.slug, "role": "member"}
    same_as_missing(api, "/api/v1/members/", {**body, "user": "victim-bob"}, {**body, "user": "nobody-here"},
                    swap=("victim-bob", "nobody-here"))
    assert not Membership.objects.filter(team=team, user=victim["bob"]).exists()
    same_as_missing(api, "/api/v1/members/", {**body, "team": "victim-team", "user": "victim-bob"},
                    {**body, "team": "no-such-team", "user": "victim-bob"}, swap=("victim-team", "no-such-team"))


def test_a_newcomer_in_no_team_can_still_be_added_by_a_team_admin(api, team_admin, team):
    UserFactory(username="newcomer")
    api.force_authenticate(team_admin)
    r = api.post("/api/v1/members/", {"team": team.slug, "user": "newcomer"}, format="json")
    assert r.status_code == 201
