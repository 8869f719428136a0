"""The latency-targets panel in a real browser: attainment beside the latency charts, the diagnosis with its
evidence, the window switched by htmx, and a recommendation applied with one click."""
import datetime as dt

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from observability.rollups import gateway_rollup
from tests.factories import MembershipFactory, TeamFactory, UserFactory
from tests.frontend.browser import browser, shot, sign_in  # noqa: F401  (fixture)
from tests.observability.test_attainment import _deployment, _queue_growing, _records

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_targets_panel_diagnoses_and_applies_with_one_click(browser, live_server):  # noqa: F811
    team = TeamFactory(slug="ml-research", name="ML Research", gpu_quota=16)
    member = MembershipFactory(team=team, user=UserFactory(username="mia")).user
    now = timezone.now()
    d = _deployment(team, requested_by=member, name="chat-8b")
    _records(d, now, [120, 180, 650, 700, 720, 760, 800, 900])
    _queue_growing(d, now)
    gateway_rollup(since=now - dt.timedelta(minutes=15), until=now + dt.timedelta(minutes=1))
    context, page = sign_in(browser, live_server.url, "mia")
    page.goto(f"/deployments/{d.pk}/")
    panel = page.locator("#targets-panel")
    expect(panel).to_contain_text("Last 1h: 8 answered requests")
    expect(panel.locator("[data-diagnosis=prefill_short]")).to_contain_text("prefill is short of replicas")
    panel.get_by_text("Evidence (last 1h)").click()
    shot(page, "targets-attainment-diagnosis")
    panel.get_by_role("button", name="15m").click()  # htmx swaps the panel for the other window
    expect(page.locator("#targets-panel")).to_contain_text("Last 15m: 8 answered requests")
    page.locator("#targets-panel").get_by_role("button", name="1h").click()
    expect(page.locator("#targets-panel")).to_contain_text("Last 1h: 8 answered requests")
    page.locator("#targets-panel").get_by_role("button", name="Apply this update").click()
    expect(page.locator("body")).to_contain_text("Update applied")
    d.refresh_from_db()
    assert d.spec["prefill"]["replicas_min"] == 2
    context.close()
