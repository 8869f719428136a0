"""The portal's deployments list and approvals queue: paginated, and a page costs the same SQL queries with 5
deployments as with 60 (bench/scale.py times them at 10,000)."""
import re

import pytest

from deployments.models import Membership
from frontend.views.approvals import QUEUE_PAGE_SIZE
from frontend.views.deployments import LIST_PAGE_SIZE
from tests.factories import DeploymentFactory, MembershipFactory, TeamFactory
from tests.support.fleet import count_queries, grow

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("who,url", [("member", "/deployments/"), ("member", "/deployments/?status=running"),
                                     ("team_admin", "/approvals/"), ("platform_admin", "/approvals/")])
def test_a_page_costs_the_same_queries_with_5_or_60_deployments(request, signed_in, team, who, url):
    client = signed_in(request.getfixturevalue(who))
    # the admin's second team makes the queue hold items of two teams, each with its own quota figures
    second = TeamFactory()
    MembershipFactory(team=second, user=request.getfixturevalue("team_admin"), role=Membership.Role.ADMIN)
    teams = [team, second, TeamFactory()]
    grow(teams=teams, to=5)
    count_queries(client.get, url)  # warm
    few = count_queries(client.get, url)
    grow(teams=teams, to=60)
    many = count_queries(client.get, url)
    assert many == few, f"{url} as {who}: {few} queries with 5 deployments, {many} with 60"


def test_the_list_pages_through_the_teams_deployments_newest_first(signed_in, member, team, cluster,
                                                                     htmx_headers):
    names = [DeploymentFactory(team=team, cluster=cluster).name for _ in range(LIST_PAGE_SIZE + 3)]
    client = signed_in(member)
    first = client.get("/deployments/").content.decode()
    assert f"Page 1 of 2 · 1–{LIST_PAGE_SIZE} of {LIST_PAGE_SIZE + 3}" in first
    assert names[-1] in first and f">{names[0]}<" not in first
    # the next page's link keeps the filters, and htmx gets the table alone
    second = client.get("/deployments/?status=pending_approval&page=2", headers=htmx_headers("deployment-table"))
    html = second.content.decode()
    assert html.lstrip().startswith('<div id="deployment-table"')
    shown = re.findall(r'class="row-title" href="/deployments/\d+/">([^<]+)<', html)
    assert shown == names[2::-1]
    assert 'href="?status=pending_approval&amp;page=1"' in html and 'hx-target="#deployment-table"' in html


def test_the_queue_pages_oldest_first_and_counts_every_waiting_item(signed_in, team_admin, team, cluster, member):
    names = [DeploymentFactory(team=team, cluster=cluster, requested_by=member).name
             for _ in range(QUEUE_PAGE_SIZE + 1)]
    client = signed_in(team_admin)
    first = client.get("/approvals/").content.decode()
    assert names[0] in first and f">{names[-1]}<" not in first
    assert f'aria-label="{QUEUE_PAGE_SIZE + 1} waiting"' in first and 'rel="next" href="?page=2"' in first
    assert f">{names[-1]}<" in client.get("/approvals/?page=2").content.decode()
