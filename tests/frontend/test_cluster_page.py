"""A cluster's page: platform admins read its latest checks and run them again; nobody else finds it."""
import pytest

from deployments.models import ClusterCheck
from deployments.services.cluster_checks import cluster_check_record, cluster_check_request

pytestmark = pytest.mark.django_db
SUBNETS_FAILED = {"name": "subnets", "status": "fail", "evidence": "The node subnets span 2 Availability Zones.",
                  "fix": "Keep the subnets of one zone."}


def test_the_platform_admin_reads_each_check_and_runs_them_again(signed_in, platform_admin, cluster, htmx_headers):
    client = signed_in(platform_admin)
    page = client.get(f"/clusters/{cluster.name}/").content.decode()
    assert "Never checked." in page and f'action="/clusters/{cluster.name}/check/"' in page

    response = client.post(f"/clusters/{cluster.name}/check/")  # the button, without JavaScript
    assert response.status_code == 302 and response["Location"] == f"/clusters/{cluster.name}/"
    run = ClusterCheck.objects.get(cluster=cluster)
    assert (run.status, run.requested_by) == (ClusterCheck.Status.RUNNING, platform_admin)
    panel = client.get(f"/clusters/{cluster.name}/checks/", headers=htmx_headers())
    assert panel.status_code == 200 and 'hx-trigger="every 2s"' in panel.content.decode()  # polls while running

    cluster_check_record(check_id=run.pk, lines=[SUBNETS_FAILED])
    panel = client.get(f"/clusters/{cluster.name}/checks/", headers=htmx_headers())
    assert panel.status_code == 286  # settled: htmx stops polling
    body = panel.content.decode()
    assert 'data-check="subnets" data-status="fail"' in body and "Keep the subnets of one zone." in body
    assert "1 failed" in body


def test_nobody_else_finds_the_page_or_its_button(signed_in, team_admin, cluster):
    client = signed_in(team_admin)
    assert client.get(f"/clusters/{cluster.name}/").status_code == 404
    assert client.post(f"/clusters/{cluster.name}/check/").status_code == 404
    assert not ClusterCheck.objects.exists()


def test_a_ray_cluster_shows_that_nothing_applies(signed_in, platform_admin):
    from tests.factories import ClusterFactory

    ray = ClusterFactory(name="local", kind="ray")
    run = cluster_check_request(actor=platform_admin, cluster=ray)
    assert run.status == ClusterCheck.Status.PASSED
    assert "none failed" in signed_in(platform_admin).get("/clusters/local/").content.decode()
