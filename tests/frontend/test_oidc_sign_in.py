"""Company sign-in in a real browser through a real OpenID provider (npm's oidc-provider on Node.js).

The full redirect flow: Tandem's button → the provider's login and consent pages → Tandem's callback (code +
PKCE, signed ID token, userinfo) → the team the user's group maps to. Signing in again after the provider took
the group away removes the membership, audited, and revokes the team keys that user created. A person is the
provider's (issuer, subject): an e-mail never takes over an account on its own, and the portal session asks the
provider again every TANDEM_OIDC_RECHECK_S.
"""
import time
from importlib import import_module

import httpx
import pytest
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model

from deployments.models import AccessToken, ApiKey, Event, ExternalIdentity, Membership
from deployments.services.access_tokens import access_token_create
from frontend.oidc import VOUCHED_AT
from tests.factories import MembershipFactory, TeamFactory, UserFactory
from tests.frontend.browser import browser, shot  # noqa: F401  (fixture)
from tests.support.oidc import OidcProvider
from tests.support.processes import free_port

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
User = get_user_model()

GROUP_MAP = {"ml-research-admins": ("ml-research", "admin"), "ml-research": ("ml-research", "member"),
             "vision": ("vision", "member")}


@pytest.fixture
def provider(live_server, tmp_path, settings):
    op = OidcProvider(tmp_path, redirect_uri=live_server.url + "/oidc/callback/")
    for name, value in op.settings().items():
        setattr(settings, name, value)
    settings.TANDEM_OIDC_GROUP_MAP = GROUP_MAP
    settings.TANDEM_OIDC_PLATFORM_ADMIN_GROUPS = ["tandem-platform-admins"]
    settings.TANDEM_PASSWORD_SIGN_IN = False
    settings.AUTHENTICATION_BACKENDS = ["frontend.oidc.TandemOIDCBackend"]
    yield op
    op.stop()


def company_sign_in(browser, base_url: str, account: str, *, screenshot: str | None = None):  # noqa: F811
    """A fresh browser (no cookies at Tandem or the provider) signs in through the provider's pages."""
    context = browser.new_context(viewport={"width": 1280, "height": 800}, base_url=base_url)
    page = context.new_page()
    page.goto("/accounts/login/")
    if screenshot:
        shot(page, screenshot)
    assert page.get_by_label("Password").count() == 0, "local passwords are turned off"
    page.get_by_role("link", name="Sign in with Example Corp").click()
    page.locator("input[name=login]").fill(account)  # the provider's own login page
    page.locator("input[name=password]").fill("anything")
    page.get_by_role("button", name="Sign-in").click()
    page.get_by_role("button", name="Continue").click()  # the provider's consent page
    page.wait_for_url(f"{base_url}/**")
    return context, page


def test_company_sign_in_lands_in_the_mapped_team_and_follows_the_groups(browser, live_server, provider):  # noqa: F811
    team = TeamFactory(slug="ml-research", name="ML Research")
    TeamFactory(slug="vision", name="Vision")
    provider.set_account("ada", email="ada@example.com", name="Ada Lovelace",
                         groups=["ml-research-admins", "unrelated-group"])

    # 1. First sign-in: a user is created and lands in the team the group maps to, as its admin.
    ctx, page = company_sign_in(browser, live_server.url, "ada", screenshot="oidc-01-sign-in")
    page.wait_for_url("**/deployments/")
    assert page.locator("#team-switch option:checked").inner_text() == "ML Research"
    page.goto("/team/")
    row = page.locator("tr", has_text="ada@example.com")
    assert row.get_by_text("Admin").is_visible()
    shot(page, "oidc-02-team")
    added = Event.objects.get(kind="member_added", team=team)
    assert added.actor is None and added.after == {"user": "ada@example.com", "role": "admin"}
    assert "groups claim" in added.message

    # 2. The signed-in user creates a team key and a personal access token in the portal, as anyone does.
    page.goto("/keys/")
    page.get_by_label("Name").fill("notebook")
    page.get_by_role("button", name="Create key").click()
    page.get_by_role("heading", name="Copy your new API key now").wait_for()
    page.goto("/tokens/")
    page.get_by_label("Name").fill("ci")
    page.get_by_role("button", name="Create token").click()
    raw_token = page.locator("#new-secret").input_value()
    assert raw_token.startswith("tdp_")
    api = httpx.Client(base_url=live_server.url, headers={"Authorization": f"Bearer {raw_token}"})
    assert api.get("/api/v1/deployments/").status_code == 200
    ctx.close()

    # 3. The provider moves Ada from the admins' group to another team's, and her e-mail changes; she signs in
    # again, as the same person (her identity is the provider's issuer and subject, not her e-mail).
    provider.set_account("ada", email="ada.lovelace@example.com", name="Ada Lovelace", groups=["vision"])
    ctx, page = company_sign_in(browser, live_server.url, "ada")
    page.wait_for_url("**/deployments/")
    assert User.objects.get(username="ada@example.com").email == "ada.lovelace@example.com"
    assert User.objects.count() == 1
    assert not Membership.objects.filter(team=team, user__username="ada@example.com").exists()
    assert Membership.objects.get(team__slug="vision", user__username="ada@example.com").role == "member"
    removed = Event.objects.get(kind="member_removed", team=team)
    assert removed.actor is None and removed.before == {"user": "ada@example.com", "role": "admin"}
    key = ApiKey.objects.get(name="notebook")
    assert key.revoked_at is not None
    assert Event.objects.filter(kind="api_key_revoked", team=team).exists()
    # Her personal token lives on while she is in a team, and reaches only the teams she is in now.
    assert AccessToken.objects.get(name="ci").revoked_at is None
    teams = api.get("/api/v1/teams/")
    assert teams.status_code == 200 and [t["slug"] for t in teams.json()["results"]] == ["vision"]
    assert api.get("/api/v1/teams/ml-research/").status_code == 404
    ctx.close()

    # 4. Taken out of every mapped group: no team left.
    provider.set_account("ada", email="ada.lovelace@example.com", name="Ada Lovelace", groups=[])
    ctx, page = company_sign_in(browser, live_server.url, "ada")
    page.get_by_role("heading", name="You are not in a team yet").wait_for()
    shot(page, "oidc-03-no-team")
    assert not Membership.objects.filter(user__username="ada@example.com").exists()
    # Leaving her last team revokes her personal tokens too.
    assert AccessToken.objects.get(name="ci").revoked_at is not None
    assert api.get("/api/v1/deployments/").status_code == 401
    ctx.close()
    api.close()


def test_a_token_endpoint_out_of_reach_is_a_failed_sign_in_not_a_server_error(browser, live_server, provider,  # noqa: F811
                                                                              settings):
    provider.set_account("ada", email="ada@example.com", name="Ada Lovelace", groups=[])
    settings.OIDC_OP_TOKEN_ENDPOINT = f"http://127.0.0.1:{free_port()}/token"  # nothing listens there

    ctx, page = company_sign_in(browser, live_server.url, "ada")
    page.wait_for_url("**/accounts/login/?sign_in_failed=1")
    assert "did not work" in page.get_by_role("alert").inner_text()
    assert not User.objects.exists()
    ctx.close()


def signed_in_as(page) -> str:
    return page.locator(".userbox a[title^='Signed in']").inner_text()


def test_an_unverified_email_cannot_take_alices_account(browser, live_server, provider):  # noqa: F811
    alice = UserFactory(username="alice@corp.example", email="alice@corp.example", password=None)
    MembershipFactory(team=TeamFactory(slug="payments", name="Payments"), user=alice, role=Membership.Role.ADMIN)
    provider.set_account("mallory", email="alice@corp.example", email_verified=False, name="Not Alice", groups=[])

    ctx, page = company_sign_in(browser, live_server.url, "mallory")
    page.get_by_role("heading", name="You are not in a team yet").wait_for()
    assert signed_in_as(page).startswith("alice@corp.example~")  # an account of their own
    identity = ExternalIdentity.objects.get(issuer=provider.issuer, subject="mallory")
    assert identity.user_id != alice.pk and not identity.user.memberships.exists()
    ctx.close()


def test_a_verified_email_cannot_take_a_password_account_and_the_person_is_told_why(browser, live_server,  # noqa: F811
                                                                                     provider):
    UserFactory(username="alice@corp.example", email="alice@corp.example")  # signs in with a Tandem password
    provider.set_account("alice", email="alice@corp.example", name="Alice", groups=[])

    ctx, page = company_sign_in(browser, live_server.url, "alice")
    page.wait_for_url("**/accounts/login/**")
    alert = page.get_by_role("alert")
    assert "already a Tandem account alice@corp.example that signs in with a password" in alert.inner_text()
    shot(page, "oidc-04-refused")
    page.goto("/deployments/")
    page.wait_for_url("**/accounts/login/?next=/deployments/")  # nobody is signed in
    refused = Event.objects.get(kind="sign_in_refused")
    assert refused.after["reason"] == "password_account" and refused.after["subject"] == "alice"
    assert not ExternalIdentity.objects.exists() and User.objects.count() == 1
    ctx.close()


def test_a_reused_alias_does_not_bring_the_previous_owners_account(browser, live_server, provider):  # noqa: F811
    team = TeamFactory(slug="payments", name="Payments")
    provider.set_account("alice-2019", email="alice@corp.example", name="Alice who left", groups=[])
    ctx, page = company_sign_in(browser, live_server.url, "alice-2019")
    page.get_by_role("heading", name="You are not in a team yet").wait_for()
    ctx.close()
    MembershipFactory(team=team, user=User.objects.get(username="alice@corp.example"))  # granted by hand
    provider.remove_account("alice-2019")
    provider.set_account("alice-2026", email="alice@corp.example", name="New Alice", groups=[])

    ctx, page = company_sign_in(browser, live_server.url, "alice-2026")
    page.wait_for_url("**/accounts/login/**")
    assert "belongs to another Example Corp identity" in page.get_by_role("alert").inner_text()
    assert Event.objects.get(kind="sign_in_refused").after["reason"] == "alias_reused"
    assert not ExternalIdentity.objects.filter(subject="alice-2026").exists()
    ctx.close()


def provider_vouched_ago(context, seconds: float) -> None:
    """Move the time the provider last vouched for this browser's Tandem session `seconds` into the past, as
    waiting that long would (the interval itself stays the default 900 s)."""
    key = next(c["value"] for c in context.cookies() if c["name"] == django_settings.SESSION_COOKIE_NAME)
    session = import_module(django_settings.SESSION_ENGINE).SessionStore(session_key=key)
    session[VOUCHED_AT] = time.time() - seconds
    session.save()


def test_the_session_rechecks_the_provider_and_ends_when_it_no_longer_signs_the_person_in(  # noqa: F811
        browser, live_server, provider):
    TeamFactory(slug="ml-research", name="ML Research")
    TeamFactory(slug="vision", name="Vision")
    provider.set_account("ada", email="ada@example.com", name="Ada Lovelace", groups=["ml-research"])
    ctx, page = company_sign_in(browser, live_server.url, "ada")
    page.wait_for_url("**/deployments/")
    ada = User.objects.get(username="ada@example.com")
    _, raw_token = access_token_create(user=ada, name="ci")
    api = httpx.Client(base_url=live_server.url, headers={"Authorization": f"Bearer {raw_token}"})

    def roles() -> dict:
        return dict(Membership.objects.filter(user=ada).values_list("team__slug", "role"))

    # 1. Within the interval the provider is not asked: its change of Ada's groups waits.
    provider.set_account("ada", email="ada@example.com", name="Ada Lovelace", groups=["vision"])
    provider_vouched_ago(ctx, 899)
    page.goto("/team/")
    assert page.url.endswith("/team/") and roles() == {"ml-research": "member"}

    # 2. Past it, the next page asks the provider without a prompt: Ada is still known there, so she stays signed
    # in on the page she asked for, her groups synced. The REST API is never sent to the provider: her overdue
    # session gets a 401 there, and her token (no session) is answered as before.
    provider_vouched_ago(ctx, 901)
    overdue = page.request.get("/api/v1/deployments/", max_redirects=0)
    assert overdue.status == 401 and "sign-in check" in overdue.json()["detail"]
    assert api.get("/api/v1/deployments/").status_code == 200
    page.goto("/team/")
    assert page.url.endswith("/team/") and signed_in_as(page) == "ada@example.com"
    assert roles() == {"vision": "member"}

    # 3. The provider no longer knows Ada (disabled there): past the interval, her next page signs her out.
    provider.remove_account("ada")
    page.goto("/deployments/")
    assert page.url.endswith("/deployments/")  # not yet
    provider_vouched_ago(ctx, 901)
    page.goto("/deployments/")
    page.wait_for_url("**/accounts/login/?sign_in_failed=1")
    shot(page, "oidc-05-recheck-signed-out")
    page.goto("/team/")
    page.wait_for_url("**/accounts/login/?next=/team/")
    ctx.close()
    api.close()

    # 4. The same when the person's session at the provider ended (its cookie gone), with the account still there.
    provider.set_account("bob", email="bob@example.com", name="Bob", groups=["vision"])
    ctx, page = company_sign_in(browser, live_server.url, "bob")
    page.wait_for_url("**/deployments/")
    ctx.clear_cookies(name="_session")
    provider_vouched_ago(ctx, 901)
    page.goto("/deployments/")
    page.wait_for_url("**/accounts/login/?sign_in_failed=1")
    ctx.close()
