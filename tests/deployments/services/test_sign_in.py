"""Group claims → memberships at sign-in: the rules the browser test does not walk through one by one."""
import pytest

from deployments.models import AccessToken, Event, Membership
from deployments.services.access_tokens import access_token_create
from deployments.services.sign_in import sign_in_user_from_claims
from tests.factories import MembershipFactory, TeamFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def mapping(settings):
    settings.TANDEM_OIDC_GROUP_MAP = {"research-admins": ("research", "admin"), "research": ("research", "member"),
                                      "vision": ("vision", "member"), "ghosts": ("no-such-team", "member")}
    settings.TANDEM_OIDC_PLATFORM_ADMIN_GROUPS = ["platform"]


def claims(*groups, email="kim@example.com"):
    return {"sub": "kim", "email": email, "groups": list(groups)}


def roles(user) -> dict:
    return dict(Membership.objects.filter(user=user).values_list("team__slug", "role"))


def test_the_higher_role_wins_when_two_groups_name_one_team():
    TeamFactory(slug="research")
    user = sign_in_user_from_claims(claims=claims("research", "research-admins"))
    assert user.username == "kim@example.com" and not user.has_usable_password()
    assert roles(user) == {"research": "admin"}


def test_a_role_change_and_a_removal_are_each_audited_once():
    TeamFactory(slug="research")
    TeamFactory(slug="vision")
    user = sign_in_user_from_claims(claims=claims("research-admins", "vision"))
    sign_in_user_from_claims(claims=claims("research"), user=user)
    sign_in_user_from_claims(claims=claims("research"), user=user)  # nothing changed: nothing recorded
    assert roles(user) == {"research": "member"}
    kinds = list(Event.objects.order_by("id").values_list("kind", "team__slug"))
    assert kinds == [("user_created", None), ("member_added", "research"), ("member_added", "vision"),
                     ("member_role_changed", "research"), ("member_removed", "vision")]


def test_memberships_in_teams_the_mapping_does_not_name_are_left_alone():
    hand_made = TeamFactory(slug="side-project")
    user = UserFactory(username="kim@example.com")
    MembershipFactory(team=hand_made, user=user, role=Membership.Role.ADMIN)
    sign_in_user_from_claims(claims=claims(), user=user)
    assert roles(user) == {"side-project": "admin"}
    assert AccessToken.objects.filter(user=user).count() == 0


def test_platform_admin_follows_its_group_and_is_audited():
    user = sign_in_user_from_claims(claims=claims("platform"))
    assert user.is_staff and user.is_superuser
    user = sign_in_user_from_claims(claims=claims(), user=user)
    user.refresh_from_db()
    assert not user.is_staff and not user.is_superuser
    assert list(Event.objects.filter(kind__startswith="platform_admin").order_by("id").values_list("kind", flat=True)) \
        == ["platform_admin_granted", "platform_admin_revoked"]


def test_a_group_naming_a_missing_team_says_so_instead_of_failing_the_sign_in():
    user = sign_in_user_from_claims(claims=claims("ghosts"))
    assert roles(user) == {}
    assert "create it" in Event.objects.get(kind="sign_in_mapping_unknown_team").message


def test_leaving_the_last_team_revokes_personal_tokens():
    TeamFactory(slug="research")
    user = sign_in_user_from_claims(claims=claims("research"))
    token, _ = access_token_create(user=user, name="ci")
    sign_in_user_from_claims(claims=claims(), user=user)
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert Event.objects.get(kind="access_token_revoked").actor is None


def test_password_sign_in_can_be_turned_off(client, settings, member):
    settings.TANDEM_OIDC_ENABLED = True
    settings.TANDEM_PASSWORD_SIGN_IN = False
    settings.AUTHENTICATION_BACKENDS = ["frontend.oidc.TandemOIDCBackend"]
    page = client.get("/accounts/login/").content.decode()
    assert 'href="/oidc/authenticate/"' in page and 'name="password"' not in page
    response = client.post("/accounts/login/", {"username": member.username, "password": "pw"})
    assert response.status_code == 200 and not response.wsgi_request.user.is_authenticated
    assert client.post("/admin/login/", {"username": member.username, "password": "pw"}).status_code == 200
