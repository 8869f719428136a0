"""Walking a list page by page sees each row once: under any `?ordering=` the id breaks ties (many deployments share
a status, two teams a name), so no row shows on two pages and none is skipped."""
import pytest

from deployments.lifecycle import Status
from tests.factories import ClusterFactory, DeploymentFactory, TeamFactory

pytestmark = pytest.mark.django_db


def _ids(api, url: str) -> list[int]:
    response = api.get(url)
    assert response.status_code == 200, response.content[:300]
    return [row["id"] for row in response.json()["results"]]


@pytest.mark.parametrize("ordering", ["status", "-status", "name", "-name", "-created_at"])
def test_walking_every_page_gives_the_full_ordered_list_once(api, platform_admin, ordering):
    cluster, teams = ClusterFactory(), [TeamFactory(), TeamFactory()]
    for i in range(40):  # two statuses only; each name in both teams
        DeploymentFactory(team=teams[i % 2], cluster=cluster, name=f"d{i // 2:02d}",
                          status=Status.RUNNING if i % 5 else Status.PAUSED)
    api.force_authenticate(platform_admin)
    full = _ids(api, f"/api/v1/deployments/?ordering={ordering}&limit=500")
    walked = [pk for offset in range(0, 40, 7) for pk in _ids(api, f"/api/v1/deployments/?ordering={ordering}"
                                                                 f"&limit=7&offset={offset}")]
    assert walked == full and len(set(full)) == 40
    field = ordering.lstrip("-")
    rows = {r["id"]: r for r in api.get(f"/api/v1/deployments/?ordering={ordering}&limit=500").json()["results"]}
    for a, b in zip(full, full[1:]):  # rows equal in the field come by id, in the field's direction
        if rows[a][field] == rows[b][field]:
            assert (a > b) if ordering.startswith("-") else (a < b), (ordering, a, b)
