"""The rollout panel in a real browser: the steps move by themselves while the deployment updates (the status
panel polls), and a team admin pauses, then aborts with a reason, from the page."""
import pytest
from playwright.sync_api import expect

from deployments.models import Rollout
from tests.factories import ClusterFactory, MembershipFactory, TeamFactory, UserFactory
from tests.frontend.browser import browser, shot, sign_in  # noqa: F401  (fixture)
from tests.support.rollouts import rollout_at_step, rollout_started

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_an_admin_watches_the_steps_move_then_pauses_and_aborts(browser, live_server):  # noqa: F811
    team = TeamFactory(slug="ml-research", name="ML Research", gpu_quota=16)
    ada = MembershipFactory(team=team, role="admin", user=UserFactory(username="ada")).user
    r = rollout_at_step(rollout_started(team=team, cluster=ClusterFactory(name="gpu-prod"), admin=ada), 0, 10)
    context, page = sign_in(browser, live_server.url, "ada")
    page.goto(f"/deployments/{r.deployment_id}/")
    panel = page.locator(f"[data-rollout='{r.pk}']")
    expect(panel.locator("[data-step-state=current]")).to_have_text("10% — current: 10% of requests on generation 2")

    rollout_at_step(r, 1, 50)  # the reconciler moves it on: the page follows without a reload
    expect(panel.locator("[data-step-state=current]")).to_have_text("50% — current: 50% of requests on generation 2",
                                                                    timeout=10_000)
    expect(panel.locator("[data-step-state=done]")).to_have_text("10% — done")
    shot(page, "rollout-panel-shifting")

    panel.get_by_role("button", name="Pause rollout").click()
    expect(page.locator("body")).to_contain_text("Rollout paused")
    expect(page.locator(f"[data-rollout='{r.pk}'] [data-rollout-state]")).to_have_text("Shifting, paused")

    panel = page.locator(f"[data-rollout='{r.pk}']")
    panel.get_by_label("Reason").fill("the new weights answer in French")
    panel.get_by_role("button", name="Abort rollout").click()
    expect(page.locator("body")).to_contain_text("Rollout aborted")
    r.refresh_from_db()
    assert r.state == Rollout.State.ROLLING_BACK and r.reason.endswith(": the new weights answer in French")
    context.close()
