"""Company sign-in: which account an identity is, and group claims → memberships; the rules the browser test does
not walk through one by one."""
import time
from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import SuspiciousOperation
from django.core.management import call_command

from deployments.models import AccessToken, Event, ExternalIdentity, Membership
from deployments.services.access_tokens import access_token_create
from deployments.services.identities import SignInRefused
from deployments.services.sign_in import sign_in_user_from_claims
from frontend.oidc import VOUCHED_AT, id_token_issuer
from tests.factories import MembershipFactory, TeamFactory, UserFactory

pytestmark = pytest.mark.django_db

ISSUER = "https://idp.corp.example"


@pytest.fixture(autouse=True)
def mapping(settings):
    settings.TANDEM_OIDC_GROUP_MAP = {"research-admins": ("research", "admin"), "research": ("research", "member"),
                                      "vision": ("vision", "member"), "ghosts": ("no-such-team", "member")}
    settings.TANDEM_OIDC_PLATFORM_ADMIN_GROUPS = ["platform"]


def claims(*groups, email="kim@example.com", sub="kim", verified=True):
    return {"sub": sub, "email": email, "email_verified": verified, "groups": list(groups)}


def sign_in(claims_: dict):
    return sign_in_user_from_claims(claims=claims_, issuer=ISSUER)


def roles(user) -> dict:
    return dict(Membership.objects.filter(user=user).values_list("team__slug", "role"))


def test_the_higher_role_wins_when_two_groups_name_one_team():
    TeamFactory(slug="research")
    user = sign_in(claims("research", "research-admins"))
    assert user.username == "kim@example.com" and not user.has_usable_password()
    assert roles(user) == {"research": "admin"}


def test_a_role_change_and_a_removal_are_each_audited_once():
    TeamFactory(slug="research")
    TeamFactory(slug="vision")
    user = sign_in(claims("research-admins", "vision"))
    sign_in(claims("research"))
    sign_in(claims("research"))  # nothing changed: nothing recorded
    assert roles(user) == {"research": "member"}
    kinds = list(Event.objects.order_by("id").values_list("kind", "team__slug"))
    assert kinds == [("user_created", None), ("member_added", "research"), ("member_added", "vision"),
                     ("member_role_changed", "research"), ("member_removed", "vision")]


def test_memberships_in_teams_the_mapping_does_not_name_are_left_alone():
    hand_made = TeamFactory(slug="side-project")
    user = UserFactory(username="kim@example.com", password=None)
    MembershipFactory(team=hand_made, user=user, role=Membership.Role.ADMIN)
    sign_in(claims())
    assert roles(user) == {"side-project": "admin"}
    assert AccessToken.objects.filter(user=user).count() == 0


def test_platform_admin_follows_its_group_and_is_audited():
    user = sign_in(claims("platform"))
    assert user.is_staff and user.is_superuser
    user = sign_in(claims())
    user.refresh_from_db()
    assert not user.is_staff and not user.is_superuser
    assert list(Event.objects.filter(kind__startswith="platform_admin").order_by("id").values_list("kind", flat=True)) \
        == ["platform_admin_granted", "platform_admin_revoked"]


def test_a_group_naming_a_missing_team_says_so_instead_of_failing_the_sign_in():
    user = sign_in(claims("ghosts"))
    assert roles(user) == {}
    assert "create it" in Event.objects.get(kind="sign_in_mapping_unknown_team").message


def test_leaving_the_last_team_revokes_personal_tokens():
    TeamFactory(slug="research")
    user = sign_in(claims("research"))
    token, _ = access_token_create(user=user, name="ci")
    sign_in(claims())
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


# --- Which account an identity is: (issuer, subject), an e-mail only when verified --------------------------------

@pytest.fixture
def alice():
    """A person granted a team role by hand, before she ever signed in with the company (no password)."""
    user = UserFactory(username="alice@corp.example", email="alice@corp.example", password=None)
    MembershipFactory(team=TeamFactory(slug="payments"), user=user, role=Membership.Role.ADMIN)
    return user


def refused(claims_: dict) -> Event:
    """Sign in expecting a refusal; returns its audit event, after checking nothing was linked or created."""
    users, identities = get_user_model().objects.count(), ExternalIdentity.objects.count()
    with pytest.raises(SignInRefused):
        sign_in(claims_)
    assert (get_user_model().objects.count(), ExternalIdentity.objects.count()) == (users, identities)
    return Event.objects.get(kind="sign_in_refused")


@pytest.mark.parametrize("verified", [False, "false", None])
def test_an_unverified_email_cannot_take_an_existing_account(alice, verified):
    intruder = sign_in(claims(email="alice@corp.example", sub="x", verified=verified))
    assert intruder.pk != alice.pk
    assert intruder.username.startswith("alice@corp.example~") and not intruder.has_usable_password()
    assert roles(intruder) == {} and roles(alice) == {"payments": "admin"}
    assert not ExternalIdentity.objects.filter(user=alice).exists()
    # The fresh account is the identity's own from now on.
    assert sign_in(claims(email="alice@corp.example", sub="x", verified=verified)).pk == intruder.pk


@pytest.mark.parametrize("verified", [True, "true"])
def test_a_verified_email_links_the_account_once_and_the_identity_keeps_it(alice, verified):
    user = sign_in(claims(email="alice@corp.example", sub="alice-1", verified=verified))
    assert user.pk == alice.pk and roles(user) == {"payments": "admin"}
    assert ExternalIdentity.objects.get(user=alice).subject == "alice-1"
    linked = Event.objects.get(kind="identity_linked")
    assert linked.actor is None and linked.after == {"user": "alice@corp.example", "issuer": ISSUER,
                                                     "subject": "alice-1"}


def test_entra_id_sends_no_email_verified_so_its_username_claim_names_new_accounts_and_links_none(alice, settings):
    settings.TANDEM_OIDC_USERNAME_CLAIM = "preferred_username"
    entra = {"email": "bob@corp.example", "preferred_username": "bob@corp.example", "groups": []}
    assert sign_in({**entra, "sub": "AAAAbob"}).username == "bob@corp.example"
    taken = {"sub": "AAAAalice", "email": "alice@corp.example", "preferred_username": "alice@corp.example"}
    assert sign_in(taken).username.startswith("alice@corp.example~")
    assert not ExternalIdentity.objects.filter(user=alice).exists()


def test_entra_id_signs_in_as_the_account_the_directory_provisioned_and_never_as_one_made_by_hand(settings):
    """Entra provisions people over SCIM and sends no `email_verified`: its trusted username claim (the UPN) links
    the first sign-in to the account the directory pushed under that name, with its teams; an account of that
    name made any other way is not taken (the identity gets its own)."""
    from deployments.services.scim import UserFields, scim_user_create

    settings.TANDEM_OIDC_USERNAME_CLAIM = "preferred_username"
    TeamFactory(slug="research")
    pushed = scim_user_create(fields=UserFields(username="dana@corp.example", external_id="e-dana"))
    MembershipFactory(user=pushed, team__slug="payments")  # granted by hand in Tandem
    entra = {"sub": "AAAAdana", "email": "dana@corp.example", "preferred_username": "dana@corp.example",
             "groups": ["research"]}
    assert sign_in(entra).pk == pushed.pk and roles(pushed) == {"research": "member", "payments": "member"}
    link = Event.objects.get(kind="identity_linked")
    assert link.after["subject"] == "AAAAdana" and "directory provisioned" in link.message
    by_hand = UserFactory(username="erin@corp.example")
    by_hand.set_unusable_password()
    by_hand.save()
    other = sign_in({"sub": "AAAAerin", "preferred_username": "erin@corp.example", "groups": []})
    assert other.pk != by_hand.pk and other.username.startswith("erin@corp.example~")
    # An unverified e-mail as the username claim vouches for nothing, provisioned or not.
    settings.TANDEM_OIDC_USERNAME_CLAIM = "email"
    scim_user_create(fields=UserFields(username="finn@corp.example"))
    finn = sign_in(claims(email="finn@corp.example", sub="finn-x", verified=False))
    assert finn.username.startswith("finn@corp.example~")


def test_a_verified_email_never_takes_a_password_account():
    local = UserFactory(username="alice@corp.example")  # signs in with the password "pw"
    event = refused(claims(email="alice@corp.example", sub="alice-1"))
    assert event.after["reason"] == "password_account" and event.after["account"] == local.username
    assert "password" in event.message and "pw" not in str(event.after)


def test_a_reused_alias_does_not_bring_the_previous_owners_account(alice):
    sign_in(claims(email="alice@corp.example", sub="alice-who-left"))
    event = refused(claims(email="alice@corp.example", sub="new-hire"))
    assert event.after["reason"] == "alias_reused" and event.after["subject"] == "new-hire"
    assert roles(alice) == {"payments": "admin"}


def test_the_same_identity_with_a_changed_email_is_the_same_person():
    TeamFactory(slug="research")
    kim = sign_in(claims("research", email="kim@example.com"))
    renamed = sign_in(claims("research", email="kim.lee@example.com", verified=False))
    assert renamed.pk == kim.pk and renamed.email == "kim.lee@example.com" and roles(renamed) == {"research": "member"}
    assert get_user_model().objects.count() == 1


def test_a_deactivated_account_is_refused_before_its_groups_are_synced():
    TeamFactory(slug="research")
    kim = sign_in(claims())
    get_user_model().objects.filter(pk=kim.pk).update(is_active=False)
    assert refused(claims("research")).after["reason"] == "inactive"
    assert roles(kim) == {}


def test_a_platform_admin_links_an_identity_on_purpose_from_the_command_line(alice, capsys):
    local = UserFactory(username="bob@corp.example")  # a password account: no sign-in links it on its own
    bobs_first = sign_in(claims(email="bob@corp.example", sub="bob", verified=False))  # got a fresh account
    call_command("identity_link", "--user", local.username, "--issuer", ISSUER, "--subject", "bob")
    assert "signs in as bob@corp.example." in capsys.readouterr().out
    assert sign_in(claims(email="bob@corp.example", sub="bob")).pk == local.pk
    moved = Event.objects.get(kind="identity_linked")
    assert moved.before["user"] == bobs_first.username and moved.after["user"] == local.username
    call_command("identity_link", "--user", local.username, "--issuer", ISSUER, "--subject", "bob")
    assert "already" in capsys.readouterr().out and Event.objects.filter(kind="identity_linked").count() == 1


@pytest.mark.parametrize("payload, issuer", [
    ({"iss": ISSUER, "aud": "tandem"}, ISSUER),
    ({"iss": ISSUER, "aud": ["tandem", "another-app"]}, ISSUER),
    ({"aud": "tandem"}, ISSUER),  # no `iss` in the token: the configured issuer
    ({"iss": "https://evil.example", "aud": "tandem"}, None),
    ({"iss": ISSUER, "aud": "another-app"}, None),
    ({"iss": ISSUER, "aud": ["another-app"]}, None),
])
def test_the_identity_comes_from_an_id_token_of_the_configured_issuer_for_this_client(settings, payload, issuer):
    settings.OIDC_RP_CLIENT_ID = "tandem"
    settings.TANDEM_OIDC_ISSUER = ISSUER
    if issuer is None:
        with pytest.raises(SuspiciousOperation):
            id_token_issuer(payload)
    else:
        assert id_token_issuer(payload) == issuer


# --- The session's re-check, request by request (the browser test walks the provider's side) ------------------------

@pytest.fixture
def oidc_session(client, settings, member):
    """`member` signed in with the company provider (as its callback leaves the session), `age` seconds ago."""
    settings.TANDEM_OIDC_ENABLED = True
    settings.AUTHENTICATION_BACKENDS = ["frontend.oidc.TandemOIDCBackend"]
    settings.OIDC_RP_CLIENT_ID = "tandem"
    settings.OIDC_OP_AUTHORIZATION_ENDPOINT = "https://idp.corp.example/authorize"
    settings.OIDC_OP_JWKS_ENDPOINT = "https://idp.corp.example/jwks"
    settings.TANDEM_OIDC_RECHECK_S = 900

    def signed_in(age: float):
        client.force_login(member, backend="frontend.oidc.TandemOIDCBackend")
        session = client.session
        session[VOUCHED_AT] = time.time() - age
        session.save()
        return client
    return signed_in


def test_a_page_past_the_interval_asks_the_provider_without_a_prompt(oidc_session):
    assert oidc_session(age=899).get("/deployments/").status_code == 200
    response = oidc_session(age=901).get("/deployments/?page=2")
    assert response.status_code == 302
    to = urlsplit(response["Location"])
    assert f"{to.scheme}://{to.netloc}{to.path}" == "https://idp.corp.example/authorize"
    assert parse_qs(to.query)["prompt"] == ["none"]
    assert response.wsgi_request.session["oidc_login_next"] == "/deployments/?page=2"


def test_htmx_reloads_the_page_and_the_api_answers_401_instead_of_a_redirect(oidc_session):
    client = oidc_session(age=901)
    htmx = client.get("/deployments/", headers={"HX-Request": "true"})
    assert htmx.status_code == 200 and htmx["HX-Refresh"] == "true"
    api = client.get("/api/v1/deployments/")
    assert api.status_code == 401 and "reload the portal" in api.json()["detail"]


def test_a_company_session_ends_at_the_next_request_once_the_account_is_deactivated(oidc_session, member):
    client = oidc_session(age=0)
    assert client.get("/deployments/").status_code == 200
    get_user_model().objects.filter(pk=member.pk).update(is_active=False)
    response = client.get("/deployments/")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


def test_a_password_session_is_never_sent_to_the_provider(client, settings, member):
    settings.TANDEM_OIDC_RECHECK_S = 0
    client.force_login(member)
    assert client.get("/deployments/").status_code == 200
