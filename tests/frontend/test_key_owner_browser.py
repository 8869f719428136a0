"""The keys page in a real browser: each key's owner, and a team admin's Move to team (no JavaScript needed: a
plain form)."""
import pytest

from deployments.models import ApiKey
from deployments.services.api_keys import api_key_create
from tests.frontend.browser import browser, shot, sign_in  # noqa: F401  (fixture)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def owner_cell(page, key_name: str) -> str:
    return page.locator("tr", has_text=key_name).locator("td").nth(1).inner_text().strip()


def test_a_team_admin_moves_a_members_key_to_the_team(browser, live_server, team, team_admin, member):  # noqa: F811
    api_key_create(actor=member, team=team, name="chat-backend")
    api_key_create(actor=team_admin, team=team, name="nightly-evals", team_key=True)
    context, page = sign_in(browser, live_server.url, team_admin.username)
    page.goto("/keys/")
    assert owner_cell(page, "chat-backend") == member.username and owner_cell(page, "nightly-evals") == "team"
    assert page.get_by_role("radio", name="The team: a service key that stays when people leave").count() == 1

    page.locator("tr", has_text="chat-backend").get_by_role("button", name="Move to team").click()
    page.get_by_text("chat-backend (tdm_").wait_for()  # the confirmation, on the keys page again
    assert owner_cell(page, "chat-backend") == "team"
    assert page.locator("tr", has_text="chat-backend").get_by_role("button", name="Move to team").count() == 0
    shot(page, "keys-moved-to-team")
    assert ApiKey.objects.get(name="chat-backend").owner is None
    context.close()
