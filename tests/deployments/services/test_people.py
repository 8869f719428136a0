"""Leavers lose every way in at once: deactivation, reactivation and deletion of people (deployments.services.people),
over real PostgreSQL, with the REST API and the portal as the people being deactivated use them."""
import pytest
from django.contrib.auth import get_user_model
from django.contrib.sessions.models import Session

from deployments.errors import Conflict, NotAllowed
from deployments.models import AccessToken, ApiKey, Event, Membership
from deployments.services.access_tokens import access_token_create
from deployments.services.api_keys import api_key_create
from deployments.services.people import user_deactivate, user_delete, user_reactivate
from deployments.services.sign_in import sign_in_sync_memberships
from tests.factories import DeploymentFactory, MembershipFactory, TeamFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def leaver(team):
    """A member of two teams with a key in each, one key in a team they have since left, a token and a session."""
    user = MembershipFactory(team=team, role=Membership.Role.ADMIN).user
    other = TeamFactory(slug="vision")
    MembershipFactory(team=other, user=user)
    api_key_create(actor=user, team=team, name="ci")
    api_key_create(actor=user, team=other, name="batch")
    former = TeamFactory(slug="former")
    old_key, _ = api_key_create(actor=MembershipFactory(team=former, user=user).user, team=former, name="old")
    Membership.objects.filter(team=former, user=user).delete()  # left before the rule existed: the key stayed live
    access_token_create(user=user, name="laptop")
    return user


def live(model, **filters) -> int:
    return model.objects.filter(revoked_at__isnull=True, **filters).count()


def test_deactivating_takes_every_way_in_away_and_says_so(leaver, member, platform_admin, client):
    client.force_login(leaver)
    client_of_someone_else = client.__class__()
    client_of_someone_else.force_login(member)

    user_deactivate(actor=platform_admin, user=leaver, message="Left the company.")

    leaver.refresh_from_db()
    assert not leaver.is_active
    assert not Membership.objects.filter(user=leaver).exists()
    assert live(ApiKey, created_by=leaver) == 0 and live(AccessToken, user=leaver) == 0
    assert Session.objects.count() == 1  # only the other person's portal session is left
    assert client.get("/deployments/")["Location"].startswith("/accounts/login/")  # the next request is signed out
    assert client_of_someone_else.get("/deployments/").status_code == 200
    event = Event.objects.get(kind="user_deactivated")
    assert event.actor == platform_admin and event.message == "Left the company."
    assert event.before == {"user": leaver.username, "teams": ["ml-research", "vision"]}
    assert len(event.after["api_keys_revoked"]) == 1  # the former team's key; the others went with the memberships
    assert event.after["sessions_ended"] == 1
    assert Event.objects.filter(kind="member_removed").count() == 2
    assert Event.objects.filter(kind="api_key_revoked").count() == 3
    assert Event.objects.filter(kind="access_token_revoked").count() == 1


def test_a_deactivated_platform_admin_is_one_no_longer(platform_admin):
    other_admin = UserFactory(is_staff=True, is_superuser=True)
    user_deactivate(actor=platform_admin, user=other_admin)
    other_admin.refresh_from_db()
    assert not other_admin.is_staff and not other_admin.is_superuser
    assert Event.objects.filter(kind="platform_admin_revoked", actor=platform_admin).exists()


def test_the_api_refuses_a_deactivated_users_token(api, platform_admin, member):
    _, raw = access_token_create(user=member, name="laptop")
    assert api.get("/api/v1/teams/", HTTP_AUTHORIZATION=f"Bearer {raw}").status_code == 200
    user_deactivate(actor=platform_admin, user=member)
    response = api.get("/api/v1/teams/", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert response.status_code == 401


def test_only_platform_admins_deactivate_and_never_themselves(team_admin, member, platform_admin):
    with pytest.raises(NotAllowed):
        user_deactivate(actor=team_admin, user=member)
    with pytest.raises(NotAllowed, match="yourself"):
        user_deactivate(actor=platform_admin, user=platform_admin)
    with pytest.raises(NotAllowed, match="yourself"):
        user_delete(actor=platform_admin, user=platform_admin)
    member.refresh_from_db()
    assert member.is_active and not Event.objects.filter(kind="user_deactivated").exists()


def test_reactivating_lets_them_sign_in_but_gives_nothing_back(leaver, platform_admin):
    user_deactivate(actor=platform_admin, user=leaver)
    user_reactivate(actor=platform_admin, user=leaver)
    leaver.refresh_from_db()
    assert leaver.is_active
    assert not Membership.objects.filter(user=leaver).exists() and live(ApiKey, created_by=leaver) == 0
    assert Event.objects.get(kind="user_reactivated").after == {"user": leaver.username}


def test_deleting_keeps_the_audit_trail_by_name(leaver, platform_admin):
    username = leaver.username
    user_delete(actor=platform_admin, user=leaver)

    assert not get_user_model().objects.filter(username=username).exists()
    kinds = set(Event.objects.values_list("kind", flat=True))
    assert {"user_deactivated", "user_deleted", "member_removed", "api_key_revoked"} <= kinds
    assert Event.objects.get(kind="user_deleted").before["user"] == username
    assert Event.objects.get(kind="user_deactivated").after["user"] == username
    assert live(ApiKey) == 0  # their keys outlive them only as revoked rows


def test_someone_who_requested_deployments_is_deactivated_not_deleted(member, platform_admin):
    DeploymentFactory(requested_by=member)
    with pytest.raises(Conflict, match="deactivate them instead"):
        user_delete(actor=platform_admin, user=member)
    member.refresh_from_db()
    assert member.is_active and not Event.objects.filter(kind__startswith="user_").exists()


def test_a_deactivated_users_groups_give_nothing_back(settings, team, member, platform_admin):
    """From a sign-in's claims (mozilla-django-oidc updates the user before its view refuses an inactive one) or a
    directory's push, both through sign_in_sync_memberships."""
    settings.TANDEM_OIDC_GROUP_MAP = {"research": (team.slug, "admin")}
    settings.TANDEM_OIDC_PLATFORM_ADMIN_GROUPS = ["platform"]
    user_deactivate(actor=platform_admin, user=member)
    sign_in_sync_memberships(user=member, groups=["research", "platform"])
    member.refresh_from_db()
    assert not Membership.objects.filter(user=member).exists() and not member.is_staff
