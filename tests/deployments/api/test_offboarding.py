"""Offboarding and key rights over the REST API: removing a member revokes what they could still call with, keys
and tokens live no longer than the team allows, and a member manages only the keys they own."""
import datetime as dt

import pytest
from django.utils import timezone

from deployments.gateway_channels import KEY_EVENTS_CHANNEL
from deployments.models import AccessToken, ApiKey, Membership
from deployments.services.api_keys import api_key_create
from deployments.services.credentials import credential_mint
from tests.factories import MembershipFactory, TeamFactory

pytestmark = pytest.mark.django_db


def days_from_now(expires_at: str) -> float:
    return (dt.datetime.fromisoformat(expires_at) - timezone.now()).total_seconds() / 86400


def test_removing_a_member_revokes_their_keys_and_tokens_and_tells_the_gateway(
        api, team, team_admin, member, redis_client, django_capture_on_commit_callbacks):
    theirs, _ = api_key_create(actor=member, team=team, name="leaver-backend")
    colleagues, _ = api_key_create(actor=team_admin, team=team, name="team-backend")
    _, token = credential_mint(model=AccessToken, user=member, name="laptop")
    listener = redis_client.pubsub()
    listener.subscribe(KEY_EVENTS_CHANNEL)
    listener.get_message(timeout=1)  # the subscription's confirmation

    api.force_authenticate(team_admin)
    membership = Membership.objects.get(team=team, user=member)
    with django_capture_on_commit_callbacks(execute=True):
        assert api.delete(f"/api/v1/members/{membership.pk}/").status_code == 204

    theirs.refresh_from_db()
    colleagues.refresh_from_db()
    assert theirs.revoked_at is not None and colleagues.revoked_at is None
    announced = listener.get_message(timeout=2)
    assert announced and announced["data"].decode() == theirs.key_id
    api.force_authenticate(None)
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    assert api.get("/api/v1/deployments/").status_code == 401
    event = team.events.get(kind="member_removed")
    assert event.actor == team_admin and event.before["user"] == member.username
    assert event.after["api_keys_revoked"] == [theirs.display] and len(event.after["access_tokens_revoked"]) == 1


def test_keys_get_the_team_default_lifetime_and_never_more_than_its_longest(api, team, member):
    team.credential_default_days, team.credential_max_days = 30, 60
    team.save()
    api.force_authenticate(member)
    r = api.post("/api/v1/api-keys/", {"team": team.slug, "name": "backend"}, format="json")
    assert r.status_code == 201 and 29.9 < days_from_now(r.json()["expires_at"]) <= 30
    later = (timezone.now() + dt.timedelta(days=61)).isoformat()
    r = api.post("/api/v1/api-keys/", {"team": team.slug, "name": "forever", "expires_at": later}, format="json")
    assert r.status_code == 400 and "at most 60 days" in r.json()["errors"]["expires_at"][0]
    assert not ApiKey.objects.filter(name="forever").exists()


def test_a_token_follows_the_strictest_of_its_owners_teams(api, team, member):
    strict = TeamFactory(slug="strict", credential_default_days=7, credential_max_days=14)
    MembershipFactory(team=strict, user=member)
    api.force_authenticate(member)
    r = api.post("/api/v1/tokens/", {"name": "ci"}, format="json")
    assert r.status_code == 201 and 6.9 < days_from_now(r.json()["expires_at"]) <= 7
    later = (timezone.now() + dt.timedelta(days=15)).isoformat()
    r = api.post("/api/v1/tokens/", {"name": "ci", "expires_at": later}, format="json")
    assert r.status_code == 400 and "Team strict lets keys and tokens live at most 14 days" in r.json()["detail"]


def test_team_admins_set_lifetimes_and_members_cannot(api, team, team_admin, member):
    url = f"/api/v1/teams/{team.slug}/"
    api.force_authenticate(member)
    before = (team.credential_default_days, team.credential_max_days)
    assert api.patch(url, {"credential_max_days": 3650}, format="json").status_code == 403
    team.refresh_from_db()
    assert (team.credential_default_days, team.credential_max_days) == before
    api.force_authenticate(team_admin)
    r = api.patch(url, {"credential_default_days": 14, "credential_max_days": 30}, format="json")
    assert r.status_code == 200 and (r.json()["credential_default_days"], r.json()["credential_max_days"]) == (14, 30)
    assert api.patch(url, {"gpu_quota": 1000}, format="json").status_code == 403
    team.refresh_from_db()
    assert team.gpu_quota != 1000
    r = api.patch(url, {"credential_default_days": 31}, format="json")
    assert r.status_code == 400 and "credential_default_days" in r.json()["errors"]
    team.refresh_from_db()
    assert (team.gpu_quota, team.credential_default_days) == (16, 14)


def test_a_member_cannot_revoke_or_rotate_a_colleagues_key_but_manages_their_own(api, team, team_admin, member):
    colleague = MembershipFactory(team=team).user
    theirs, _ = api_key_create(actor=colleague, team=team, name="theirs")
    mine, _ = api_key_create(actor=member, team=team, name="mine")
    api.force_authenticate(member)
    r = api.delete(f"/api/v1/api-keys/{theirs.pk}/")
    assert r.status_code == 403 and "Only the owner of theirs or an admin" in r.json()["detail"]
    assert api.post(f"/api/v1/api-keys/{theirs.pk}/rotate/").status_code == 403
    theirs.refresh_from_db()
    assert theirs.revoked_at is None and ApiKey.objects.filter(name="theirs").count() == 1
    assert api.post(f"/api/v1/api-keys/{mine.pk}/rotate/").status_code == 201
    api.force_authenticate(team_admin)
    assert api.delete(f"/api/v1/api-keys/{theirs.pk}/").status_code == 204
