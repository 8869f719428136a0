"""Django's user admin changes who may sign in, who is a platform admin and who exists only through the people
services: audited, and a deactivated or deleted user's keys are refused by a running gateway within a second.

Each test drives the real admin views as a signed-in platform admin over real PostgreSQL (and Redis and a gateway
process where a key's revocation is checked)."""
import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

from deployments.models import AccessToken, ApiKey, Event, Membership
from deployments.services.access_tokens import access_token_create
from deployments.services.api_keys import api_key_create
from tests.factories import MembershipFactory
from tests.support.processes import start_gateway
from tests.support.revocation import assert_key_refused_within

User = get_user_model()


@pytest.fixture
def admin_client(client, platform_admin):
    client.force_login(platform_admin)
    return client


def user_action(admin_client, action: str, *users, follow=False):
    return admin_client.post(reverse("admin:auth_user_changelist"),
                             {"action": action, "_selected_action": [u.pk for u in users]}, follow=follow)


def change_form(user, **changes) -> dict:
    """The user change form as the admin page submits it."""
    data = {"username": user.username, "first_name": user.first_name, "last_name": user.last_name,
            "email": user.email, "last_login_0": "", "last_login_1": "", "date_joined_0": "2026-01-01",
            "date_joined_1": "00:00:00"}
    return data | changes


@pytest.mark.django_db(transaction=True)
def test_a_user_deactivated_in_admin_loses_keys_tokens_and_teams_at_once(admin_client, platform_admin, team,
                                                                        tmp_path, api):
    member = MembershipFactory(team=team).user
    key, raw_key = api_key_create(actor=member, team=team, name="ci")
    _, raw_token = access_token_create(user=member, name="laptop")
    gateway = start_gateway(tmp_path)
    try:
        assert_key_refused_within([gateway.base_url], raw_key,
                                  lambda: user_action(admin_client, "deactivate", member))
    finally:
        gateway.stop()

    assert api.get("/api/v1/teams/", HTTP_AUTHORIZATION=f"Bearer {raw_token}").status_code == 401
    member.refresh_from_db()
    assert not member.is_active and not Membership.objects.filter(user=member).exists()
    event = Event.objects.get(kind="user_deactivated")
    assert (event.actor, event.before["teams"]) == (platform_admin, [team.slug])
    assert Event.objects.get(kind="api_key_revoked").before["key_id"] == key.key_id


def test_the_change_form_does_not_write_who_may_sign_in_or_who_is_admin(admin_client, platform_admin, member):
    url = reverse("admin:auth_user_change", args=[member.pk])
    response = admin_client.post(url, change_form(member, first_name="Kim", is_staff="on", is_superuser="on"))
    assert response.status_code == 302, response.content.decode()[:3000]

    member.refresh_from_db()
    assert member.first_name == "Kim"  # the form was saved, but not the fields only services write
    assert (member.is_active, member.is_staff, member.is_superuser) == (True, False, False)
    page = admin_client.get(url).content.decode()
    assert 'name="is_staff"' not in page and 'name="is_active"' not in page
    event = Event.objects.get(kind="user_updated")
    assert (event.actor, event.before, event.after) == (platform_admin, {"first_name": ""}, {"first_name": "Kim"})


def test_a_user_added_in_admin_is_audited(admin_client, platform_admin):
    response = admin_client.post(reverse("admin:auth_user_add"), {
        "username": "newcomer", "usable_password": "true", "password1": "a long passphrase 42",
        "password2": "a long passphrase 42"})
    assert response.status_code == 302, response.content.decode()[:3000]
    user = User.objects.get(username="newcomer")
    assert user.check_password("a long passphrase 42")
    event = Event.objects.get(kind="user_created")
    assert (event.actor, event.after) == (platform_admin, {"user": "newcomer"})


def test_platform_admin_is_granted_and_revoked_in_admin_with_events(admin_client, platform_admin, member):
    user_action(admin_client, "grant_platform_admin", member)
    member.refresh_from_db()
    assert member.is_staff and member.is_superuser
    user_action(admin_client, "revoke_platform_admin", member)
    member.refresh_from_db()
    assert not member.is_staff and not member.is_superuser
    kinds = list(Event.objects.filter(actor=platform_admin).order_by("id").values_list("kind", flat=True))
    assert kinds == ["platform_admin_granted", "platform_admin_revoked"]


def test_deleting_a_user_in_admin_revokes_their_keys_and_keeps_the_trail(admin_client, platform_admin, team):
    member = MembershipFactory(team=team).user
    api_key_create(actor=member, team=team, name="ci")
    access_token_create(user=member, name="laptop")
    response = admin_client.post(reverse("admin:auth_user_delete", args=[member.pk]), {"post": "yes"})
    assert response.status_code == 302, response.content.decode()[:3000]

    assert not User.objects.filter(pk=member.pk).exists()
    # Keys and tokens go with their owner's row, each revoked first (its event below keeps the trail).
    assert not ApiKey.objects.exists() and not AccessToken.objects.exists()
    kinds = set(Event.objects.filter(actor=platform_admin).values_list("kind", flat=True))
    assert kinds == {"member_removed", "api_key_revoked", "access_token_revoked", "user_deactivated", "user_deleted"}
    assert Event.objects.get(kind="user_deleted").before["user"] == member.username


def test_deleting_several_users_in_admin_goes_through_the_service(admin_client, team):
    users = [MembershipFactory(team=team).user for _ in range(2)]
    response = admin_client.post(reverse("admin:auth_user_changelist"),
                                 {"action": "delete_selected", "post": "yes",
                                  "_selected_action": [u.pk for u in users]})
    assert response.status_code == 302
    assert not User.objects.filter(pk__in=[u.pk for u in users]).exists()
    assert Event.objects.filter(kind="user_deleted").count() == 2


def test_a_platform_admin_cannot_deactivate_or_delete_themselves_in_admin(admin_client, platform_admin):
    page = user_action(admin_client, "deactivate", platform_admin, follow=True).content.decode()
    assert "You cannot deactivate yourself" in page
    assert admin_client.get(reverse("admin:auth_user_delete", args=[platform_admin.pk])).status_code == 403
    platform_admin.refresh_from_db()
    assert platform_admin.is_active and not Event.objects.filter(kind="user_deactivated").exists()

