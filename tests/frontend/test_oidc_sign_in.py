"""Company sign-in in a real browser through a real OpenID provider (npm's oidc-provider on Node.js).

The full redirect flow: Tandem's button → the provider's login and consent pages → Tandem's callback (code +
PKCE, signed ID token, userinfo) → the team the user's group maps to. Signing in again after the provider took
the group away removes the membership, audited, and revokes the team keys that user created.
"""
import httpx
import pytest

from deployments.models import AccessToken, ApiKey, Event, Membership
from tests.factories import TeamFactory
from tests.frontend.browser import browser, shot  # noqa: F401  (fixture)
from tests.support.oidc import OidcProvider

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

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

    # 3. The provider moves Ada from the admins' group to another team's; she signs in again.
    provider.set_account("ada", email="ada@example.com", name="Ada Lovelace", groups=["vision"])
    ctx, page = company_sign_in(browser, live_server.url, "ada")
    page.wait_for_url("**/deployments/")
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
    provider.set_account("ada", email="ada@example.com", name="Ada Lovelace", groups=[])
    ctx, page = company_sign_in(browser, live_server.url, "ada")
    page.get_by_role("heading", name="You are not in a team yet").wait_for()
    shot(page, "oidc-03-no-team")
    assert not Membership.objects.filter(user__username="ada@example.com").exists()
    # Leaving her last team revokes her personal tokens too.
    assert AccessToken.objects.get(name="ci").revoked_at is not None
    assert api.get("/api/v1/deployments/").status_code == 401
    ctx.close()
    api.close()
