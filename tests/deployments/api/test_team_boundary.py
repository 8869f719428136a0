"""A team admin acts only inside their team (issue 29, finding 3), and keys have an owner over the REST API: a
person's keys go when they leave, a team key (or one a team admin moved to the team) stays."""
import pytest

from deployments.models import AccessToken, ApiKey, Membership
from deployments.services.api_keys import api_key_create
from deployments.services.credentials import credential_mint
from deployments.services.teams import membership_set
from tests.factories import DeploymentFactory, MembershipFactory, TeamFactory

pytestmark = pytest.mark.django_db


def bearer(api, token: str):
    api.force_authenticate(None)
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return api


def test_leaving_one_of_two_teams_keeps_the_token_but_it_reaches_only_the_team_left(api, team, member, cluster):
    other = TeamFactory(slug="other")
    other_admin = MembershipFactory(team=other, role=Membership.Role.ADMIN).user
    MembershipFactory(team=other, user=member)
    secret_there = DeploymentFactory(team=other, cluster=cluster, requested_by=other_admin, name="secret-there")
    _, token = credential_mint(model=AccessToken, user=member, name="laptop")
    assert bearer(api, token).get(f"/api/v1/deployments/{secret_there.pk}/").status_code == 200

    api.force_authenticate(other_admin)
    seat = Membership.objects.get(team=other, user=member)
    assert api.delete(f"/api/v1/members/{seat.pk}/").status_code == 204

    teams = bearer(api, token).get("/api/v1/teams/")
    assert teams.status_code == 200 and [t["slug"] for t in teams.json()["results"]] == ["ml-research"]
    assert api.get("/api/v1/teams/other/").status_code == 404
    assert api.get(f"/api/v1/deployments/{secret_there.pk}/").status_code == 404
    assert api.get("/api/v1/events/?team=other").json()["results"] == []
    assert other.events.get(kind="member_removed").after["access_tokens_revoked"] == []


def test_a_team_admin_cannot_add_a_platform_admin_and_a_platform_admin_can(api, team, team_admin, platform_admin):
    """A platform admin in no team is someone a team admin may name (a new arrival, as far as teams go)."""
    api.force_authenticate(team_admin)
    r = api.post("/api/v1/members/", {"team": team.slug, "user": platform_admin.username}, format="json")
    assert r.status_code == 403
    assert r.json()["detail"] == ("root-admin is a platform admin; only platform admins can add them to a team, "
                                  "change their role or remove them.")
    assert not Membership.objects.filter(team=team, user=platform_admin).exists()
    assert not team.events.filter(kind="member_added").exists()

    another_root = MembershipFactory(team=TeamFactory(slug="ops"), user__is_staff=True).user
    api.force_authenticate(platform_admin)
    r = api.post("/api/v1/members/", {"team": team.slug, "user": another_root.username, "role": "admin"},
                 format="json")
    assert r.status_code == 201 and team.events.get(kind="member_added").actor == platform_admin


def test_a_team_admin_cannot_change_or_remove_a_platform_admins_seat(api, team, team_admin, platform_admin):
    """The attack of finding 3: a team admin who removes a platform admin from the team would revoke every one of
    their personal tokens (their last team), tokens that reach every team."""
    seat = membership_set(actor=platform_admin, team=team, user=platform_admin, role=Membership.Role.MEMBER)
    _, token = credential_mint(model=AccessToken, user=platform_admin, name="automation")
    api.force_authenticate(team_admin)
    r = api.patch(f"/api/v1/members/{seat.pk}/", {"role": "admin"}, format="json")
    assert r.status_code == 403 and "only platform admins can" in r.json()["detail"]
    r = api.delete(f"/api/v1/members/{seat.pk}/")
    assert r.status_code == 403 and "only platform admins can" in r.json()["detail"]
    seat.refresh_from_db()
    assert seat.role == Membership.Role.MEMBER
    assert bearer(api, token).get("/api/v1/teams/").status_code == 200

    api.force_authenticate(platform_admin)
    assert api.delete(f"/api/v1/members/{seat.pk}/").status_code == 204
    # Left in no team, a platform admin keeps their tokens: they reach every team, in one or not.
    assert bearer(api, token).get("/api/v1/teams/ml-research/").status_code == 200


def test_keys_show_their_owner_and_team_admins_make_team_keys_and_move_keys_to_the_team(
        api, team, team_admin, member):
    api.force_authenticate(member)
    r = api.post("/api/v1/api-keys/", {"team": team.slug, "name": "svc", "team_key": True}, format="json")
    assert r.status_code == 403 and "can create team keys" in r.json()["detail"]
    assert not ApiKey.objects.filter(name="svc").exists()
    r = api.post("/api/v1/api-keys/", {"team": team.slug, "name": "mine"}, format="json")
    assert r.status_code == 201 and r.json()["owner"] == member.username and "team_key" not in r.json()
    mine = r.json()["id"]
    r = api.post(f"/api/v1/api-keys/{mine}/transfer/", {}, format="json")
    assert r.status_code == 403 and "Only admins of team ml-research" in r.json()["detail"]

    api.force_authenticate(team_admin)
    r = api.post("/api/v1/api-keys/", {"team": team.slug, "name": "svc", "team_key": True}, format="json")
    assert r.status_code == 201 and r.json()["owner"] is None and r.json()["created_by"] == team_admin.username
    r = api.post(f"/api/v1/api-keys/{mine}/transfer/", {"message": "chat runs on it"}, format="json")
    assert r.status_code == 200 and r.json()["owner"] is None
    assert team.events.get(kind="api_key_transferred").message == "chat runs on it"
    owners = {k["name"]: k["owner"] for k in api.get("/api/v1/api-keys/").json()["results"]}
    assert owners == {"mine": None, "svc": None}
    r = api.post(f"/api/v1/api-keys/{mine}/transfer/", {"message": 5}, format="json")
    assert r.status_code == 400 and "message" in r.json()["errors"]


def test_removing_a_member_keeps_the_keys_moved_to_the_team(api, team, team_admin, member):
    moved, _ = api_key_create(actor=member, team=team, name="moved")
    kept_by_them, _ = api_key_create(actor=member, team=team, name="theirs")
    api.force_authenticate(team_admin)
    assert api.post(f"/api/v1/api-keys/{moved.pk}/transfer/", {}, format="json").status_code == 200
    seat = Membership.objects.get(team=team, user=member)
    assert api.delete(f"/api/v1/members/{seat.pk}/").status_code == 204
    live = {k["name"] for k in api.get("/api/v1/api-keys/").json()["results"]}
    assert live == {"moved"}
    assert team.events.get(kind="member_removed").after["api_keys_revoked"] == [kept_by_them.display]
