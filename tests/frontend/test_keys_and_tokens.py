"""API keys and personal access tokens: the secret is shown once, the list never shows it, revoke confirms."""
import pytest
from django.urls import reverse
from django.utils import timezone

from deployments.models import AccessToken, ApiKey
from deployments.services.api_keys import api_key_create
from deployments.services.credentials import credential_check
from tests.factories import MembershipFactory

pytestmark = pytest.mark.django_db
KEYS, TOKENS, TEAM = "/keys/", "/tokens/", "/team/"


def test_urls():
    assert reverse("frontend:api-keys") == KEYS and reverse("frontend:tokens") == TOKENS


def test_create_key_shows_the_secret_once(signed_in, member, team, deployment):
    client = signed_in(member)
    response = client.post(KEYS, {"name": "chat-backend", "scope": "selected", "deployments": [deployment.pk],
                                  "expires_in_days": "30", "requests_per_minute": "600"})
    page = response.content.decode()
    key = ApiKey.objects.get(name="chat-backend")
    secret = page.split('id="new-secret" type="text" readonly value="')[1].split('"')[0]
    assert response.status_code == 201 and credential_check(model=ApiKey, raw=secret) == key
    assert "only time" in page and 'data-copy-target="#new-secret"' in page
    assert key.team == team and not key.all_deployments and list(key.deployments.all()) == [deployment]
    assert key.expires_at is not None and key.requests_per_minute == 600
    listing = client.get(KEYS).content.decode()
    assert secret not in listing and f"tdm_{key.key_id}_…{key.last4}" in listing and "chat-8b" in listing


def test_create_key_errors_next_to_fields(signed_in, member):
    response = signed_in(member).post(KEYS, {"name": "", "requests_per_minute": "-3"})
    page = response.content.decode()
    assert response.status_code == 400 and not ApiKey.objects.exists()
    assert "Give the key a name" in page.split('id="err-key-name">')[1].split("</div>")[0]
    assert "whole number above zero" in page.split('id="err-rpm">')[1].split("</div>")[0]


def test_scoped_key_needs_deployments(signed_in, member):
    page = signed_in(member).post(KEYS, {"name": "x", "scope": "selected"}).content.decode()
    assert "Pick the deployments" in page and not ApiKey.objects.exists()


def test_revoke_key_with_confirmation(signed_in, member, team, redis_client):
    key, _ = api_key_create(actor=member, team=team, name="old")
    client = signed_in(member)
    url = reverse("frontend:api-key-revoke", args=[key.pk])
    assert "Revoke API key “old”?" in client.get(url).content.decode()
    assert client.post(url).status_code == 302
    key.refresh_from_db()
    assert key.revoked_at is not None
    assert "revoked" in client.get(KEYS).content.decode()


def test_another_teams_key_is_404(signed_in, outsider, member, team):
    key, _ = api_key_create(actor=member, team=team, name="theirs")
    client = signed_in(outsider)
    assert client.get(reverse("frontend:api-key-revoke", args=[key.pk])).status_code == 404
    assert client.post(reverse("frontend:api-key-revoke", args=[key.pk])).status_code == 404
    assert "theirs" not in client.get(KEYS).content.decode()


def test_tokens_create_list_revoke(signed_in, member, outsider):
    client = signed_in(member)
    page = client.post(TOKENS, {"name": "ci", "expires_in_days": "90"}).content.decode()
    secret = page.split('id="new-secret" type="text" readonly value="')[1].split('"')[0]
    token = AccessToken.objects.get(name="ci")
    assert secret.startswith(f"tdp_{token.key_id}_") and credential_check(model=AccessToken, raw=secret) == token
    assert secret not in client.get(TOKENS).content.decode()
    url = reverse("frontend:token-revoke", args=[token.pk])
    assert signed_in(outsider).post(url).status_code == 404
    client.post(url)
    token.refresh_from_db()
    assert token.revoked_at is not None


def test_token_needs_a_name(signed_in, member):
    response = signed_in(member).post(TOKENS, {"name": " "})
    assert response.status_code == 400 and "Give the token a name" in response.content.decode()


def _no_store(response) -> bool:
    return "no-store" in response.get("Cache-Control", "")


def test_pages_that_show_a_new_secret_are_never_cached(signed_in, member, team):
    client = signed_in(member)
    key_page = client.post("/keys/", {"name": "chat-backend", "scope": "all"})
    assert key_page.status_code == 201 and 'id="new-secret"' in key_page.content.decode() and _no_store(key_page)
    token_page = client.post("/tokens/", {"name": "ci", "expires_in_days": "90"})
    assert token_page.status_code == 201 and 'id="new-secret"' in token_page.content.decode()
    assert _no_store(token_page)


def test_a_member_manages_only_the_keys_they_own(signed_in, member, team):
    colleague = MembershipFactory(team=team).user
    theirs, _ = api_key_create(actor=colleague, team=team, name="theirs")
    mine, _ = api_key_create(actor=member, team=team, name="mine")
    client = signed_in(member)
    listing = client.get(KEYS).content.decode()
    assert reverse("frontend:api-key-revoke", args=[mine.pk]) in listing
    assert reverse("frontend:api-key-revoke", args=[theirs.pk]) not in listing
    page = client.post(reverse("frontend:api-key-revoke", args=[theirs.pk]), follow=True).content.decode()
    assert "Only the owner of theirs or an admin of team ml-research" in page
    theirs.refresh_from_db()
    assert theirs.revoked_at is None


def test_a_team_admin_revokes_any_key_of_the_team(signed_in, member, team_admin, team):
    key, _ = api_key_create(actor=member, team=team, name="members")
    signed_in(team_admin).post(reverse("frontend:api-key-revoke", args=[key.pk]))
    key.refresh_from_db()
    assert key.revoked_at is not None


def test_keys_never_live_forever(signed_in, member, team):
    team.credential_default_days, team.credential_max_days = 30, 60
    team.save()
    client = signed_in(member)
    page = client.get(KEYS).content.decode()
    assert ">Never<" not in page and "Default (30 days)" in page and ">90 days<" not in page
    client.post(KEYS, {"name": "default-life", "scope": "all", "expires_in_days": ""})
    key = ApiKey.objects.get(name="default-life")
    assert 29.9 < (key.expires_at - timezone.now()).total_seconds() / 86400 <= 30
    response = client.post(KEYS, {"name": "too-long", "scope": "all", "expires_in_days": "365"})
    assert response.status_code == 400 and "at most 60 days" in response.content.decode()


def test_team_admins_set_key_and_token_lifetimes_on_the_team_page(signed_in, member, team_admin, team):
    page = signed_in(member).get(TEAM).content.decode()
    assert 'name="credential_max_days"' not in page and "at most 365 days" in page
    before = (team.credential_default_days, team.credential_max_days)
    response = signed_in(member).post(TEAM, {"credential_default_days": "1", "credential_max_days": "3650"})
    assert response.status_code == 403
    team.refresh_from_db()
    assert (team.credential_default_days, team.credential_max_days) == before
    response = signed_in(team_admin).post(TEAM, {"credential_default_days": "7", "credential_max_days": "30"})
    assert response.status_code == 302
    team.refresh_from_db()
    assert (team.credential_default_days, team.credential_max_days) == (7, 30)
    response = signed_in(team_admin).post(TEAM, {"credential_default_days": "60", "credential_max_days": "30"})
    assert response.status_code == 400 and "between 1 day and the longest (30 days)" in response.content.decode()


def test_a_team_admin_makes_team_keys_and_moves_a_members_key_to_the_team(signed_in, team_admin, member, team):
    theirs, _ = api_key_create(actor=member, team=team, name="chat-backend")
    transfer = reverse("frontend:api-key-transfer", args=[theirs.pk])
    as_member = signed_in(member)
    page = as_member.get(KEYS).content.decode()
    assert f"<td>{member.username}</td>" in page and transfer not in page and 'name="owner"' not in page
    as_member.post(transfer)
    assert ApiKey.objects.get(pk=theirs.pk).owner == member
    page = as_member.post(KEYS, {"name": "sneaky", "scope": "all", "owner": "team"}).content.decode()
    assert "can create team keys" in page and not ApiKey.objects.filter(name="sneaky").exists()

    as_admin = signed_in(team_admin)
    assert transfer in as_admin.get(KEYS).content.decode()
    page = as_admin.post(transfer, follow=True).content.decode()
    assert "chat-backend" in page and "is now a key of" in page and f"<td>{member.username}</td>" not in page
    assert ApiKey.objects.get(pk=theirs.pk).owner is None
    assert team.events.get(kind="api_key_transferred").actor == team_admin
    assert as_admin.post(KEYS, {"name": "svc", "scope": "all", "owner": "team"}).status_code == 201
    assert ApiKey.objects.get(name="svc").owner is None
