"""A page of the API costs the same SQL queries with 5 deployments as with 60: a list of 50 stays fast at 10,000
(bench/scale.py measures it there)."""
import pytest

from tests.factories import TeamFactory
from tests.support.fleet import count_queries, grow

pytestmark = pytest.mark.django_db


@pytest.fixture(params=["member", "platform_admin"])
def reader(request, api, team):
    """The API signed in as a team member (their team's rows) or a platform admin (every team's)."""
    user = request.getfixturevalue(request.param)
    api.force_authenticate(user)
    return api


@pytest.mark.parametrize("url", ["/api/v1/deployments/?limit=50", "/api/v1/deployments/?limit=50&status=running",
                                 "/api/v1/events/?limit=50", "/api/v1/deployments/{first}/",
                                 "/api/v1/deployments/{first}/events/"])
def test_a_page_costs_the_same_queries_with_5_or_60_deployments(reader, team, url):
    teams = [team, TeamFactory()]
    grow(teams=teams, to=5)
    first = team.deployments.order_by("pk").first().pk
    url = url.format(first=first)
    count_queries(reader.get, url)  # warm: what a first request loads once per process
    few = count_queries(reader.get, url)
    grow(teams=teams, to=60)
    many = count_queries(reader.get, url)
    assert many == few, f"{url}: {few} queries with 5 deployments, {many} with 60"


def test_this_months_spend_reads_the_month_once_for_its_total_and_the_budget(api, member, team):
    """`budget_used` is this month's total against the budget: a budget costs the spend answer no second read of
    the month."""
    grow(teams=[team], to=5)
    api.force_authenticate(member)
    url = f"/api/v1/teams/{team.slug}/spend/"
    count_queries(api.get, url)  # warm
    without_budget = count_queries(api.get, url)
    team.monthly_budget_usd = 1000
    team.save()
    with_budget = count_queries(api.get, url)
    assert with_budget == without_budget
    assert api.get(url).json()["monthly_budget_usd"] == 1000
