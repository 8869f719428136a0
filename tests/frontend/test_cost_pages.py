"""The portal's cost page, the budget banner, the deployment's cost card, and its pause and resume buttons; and
the cost page in a real browser (its chart drawn by the vendored Chart.js), screenshotted."""
import datetime as dt
import re

import pytest
from django.urls import reverse
from django.utils import timezone

from deployments.lifecycle import Status
from deployments.models import Event, Membership
from tests.factories import ClusterFactory, DeploymentFactory, MembershipFactory, TeamFactory, UserFactory
from tests.support.fleet import count_queries
from tests.frontend.browser import browser, shot, sign_in  # noqa: F401  (fixture)


def ran_for(d, hours: float):
    """Its timeline: requested and running since `hours` ago (cut at the month's start)."""
    month_start = timezone.now().replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    since = max(timezone.now() - dt.timedelta(hours=hours), month_start)
    for kind, after in (("requested", {"spec": d.spec}), ("status_running", {"status": "running"})):
        e = Event.objects.create(kind=kind, team=d.team, deployment=d, after=after)
        Event.objects.filter(pk=e.pk).update(created_at=since)


@pytest.mark.django_db
def test_cost_page_shows_spend_by_deployment_with_the_chart_data_and_the_csv_link(signed_in, member, team, cluster):
    d = DeploymentFactory(team=team, cluster=cluster, requested_by=member, name="chat-8b", status=Status.RUNNING)
    ran_for(d, 3)
    page = signed_in(member).get(reverse("frontend:team-cost")).content.decode()
    assert "chat-8b" in page and 'id="spend-data"' in page and 'id="spend-chart"' in page
    assert f"/api/v1/teams/{team.slug}/spend/?format=csv&amp;month={timezone.now():%Y-%m}" in page
    assert signed_in(member).get(reverse("frontend:team-cost"), {"month": "nope"}).status_code == 404


@pytest.mark.django_db
def test_cost_page_figures_are_the_hours_run_times_the_hourly_price(signed_in, member, team, cluster):
    """A deployment of two nodes (one per pool) that started running 3 h before this month began, on a cluster
    that prices its nodes at $7.50 an hour: last month's page bills exactly those 6 node-hours, $45.00, all on the
    month's last day."""
    d = DeploymentFactory(team=team, cluster=cluster, requested_by=member, name="chat-8b", status=Status.RUNNING)
    assert (d.spec["prefill"]["nodes"], d.spec["decode"]["nodes"]) == (1, 1)
    cluster.config = {**cluster.config,
                      "prices": {d.spec[pool]["instance_type"]: 7.5 for pool in ("prefill", "decode")}}
    cluster.save()
    month_start = timezone.now().replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    for kind, after in (("requested", {"spec": d.spec}), ("status_running", {"status": "running"})):
        e = Event.objects.create(kind=kind, team=team, deployment=d, after=after)
        Event.objects.filter(pk=e.pk).update(created_at=month_start - dt.timedelta(hours=3))
    last_month = month_start - dt.timedelta(days=1)
    page = signed_in(member).get(reverse("frontend:team-cost"), {"month": f"{last_month:%Y-%m}"}).content.decode()
    assert "data-cost-total>$45.00<" in page
    assert re.search(r">chat-8b</a></td><td>6\.00</td><td>\$45\.00</td>", page), page
    assert re.findall(r"<tr><td>(\w+ \d+)</td><td>\$([\d.]+)</td></tr>", page) == [
        (f"{last_month:%b} {last_month.day}", "45.00")]
    assert f"/api/v1/teams/{team.slug}/spend/?format=csv&amp;month={last_month:%Y-%m}" in page


@pytest.mark.django_db
def test_the_cost_page_sums_this_months_spend_once_for_itself_and_the_banner(signed_in, member, team, cluster):
    """The banner takes the month so far from the page that already summed it: a budget costs the cost page no
    query of its own (on other pages it is read once, in the view, never from the template)."""
    ran_for(DeploymentFactory(team=team, cluster=cluster, requested_by=member, status=Status.RUNNING), 1)
    client = signed_in(member)
    count_queries(client.get, reverse("frontend:team-cost"))  # warm: the session's team is chosen
    without_budget = count_queries(client.get, reverse("frontend:team-cost"))
    team.monthly_budget_usd = 0
    team.save()
    with_budget = count_queries(client.get, reverse("frontend:team-cost"))
    assert with_budget == without_budget
    assert 'data-budget-banner="over"' in client.get(reverse("frontend:team-cost")).content.decode()


@pytest.mark.django_db
def test_the_budget_banner_shows_from_80_percent_on_every_page(signed_in, member, team, cluster):
    d = DeploymentFactory(team=team, cluster=cluster, requested_by=member, name="chat-8b", status=Status.RUNNING)
    ran_for(d, 1)
    client = signed_in(member)
    assert "data-budget-banner" not in client.get(reverse("frontend:deployments")).content.decode()
    team.monthly_budget_usd = 0  # any spend uses it up
    team.save()
    page = client.get(reverse("frontend:deployments")).content.decode()
    assert 'data-budget-banner="over"' in page and "need a platform admin's approval" in page


@pytest.mark.django_db
def test_the_requester_pauses_and_resumes_from_the_deployment_page_and_sees_its_cost(signed_in, member, team,
                                                                                       cluster):
    d = DeploymentFactory(team=team, cluster=cluster, requested_by=member, name="chat-8b", status=Status.RUNNING)
    client = signed_in(member)
    page = client.get(reverse("frontend:deployment-detail", args=[d.pk])).content.decode()
    assert reverse("frontend:deployment-pause", args=[d.pk]) in page and "data-cost-hourly>$20.99<" in page
    client.post(reverse("frontend:deployment-pause", args=[d.pk]))
    d.refresh_from_db()
    assert d.status == Status.PAUSING
    type(d).objects.filter(pk=d.pk).update(status=Status.PAUSED)  # as the reconciler leaves it
    page = client.get(reverse("frontend:deployment-detail", args=[d.pk])).content.decode()
    assert reverse("frontend:deployment-resume", args=[d.pk]) in page and "data-cost-hourly>$0.00<" in page
    response = client.post(reverse("frontend:deployment-resume", args=[d.pk]), follow=True)
    assert "Resuming chat-8b" in response.content.decode()
    d.refresh_from_db()
    assert d.status == Status.PROVISIONING
    # On its way back (waiting for capacity, say), it can be paused again from its page.
    assert reverse("frontend:deployment-pause", args=[d.pk]) in response.content.decode()


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_cost_page_in_a_browser_draws_the_chart(browser, live_server):  # noqa: F811
    team = TeamFactory(slug="ml-research", name="ML Research", gpu_quota=64, monthly_budget_usd=70)
    mia = MembershipFactory(team=team, user=UserFactory(username="mia"), role=Membership.Role.ADMIN).user
    cluster = ClusterFactory(name="gpu-prod", config={"prices": {"g6e.12xlarge": 7.5}})
    for name, hours in (("chat-8b", 3), ("embed-small", 1)):
        ran_for(DeploymentFactory(team=team, cluster=cluster, requested_by=mia, name=name, status=Status.RUNNING),
                hours)
    _, page = sign_in(browser, live_server.url, "mia")
    page.get_by_role("link", name="Cost").click()
    page.locator("[data-spend-panel][data-rendered=true]").wait_for()
    assert page.locator("[data-budget-banner]").is_visible()
    shot(page, "team-cost")
