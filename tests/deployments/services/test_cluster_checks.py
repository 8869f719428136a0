"""The preflight's records: who may ask for a run, what registering a cluster enqueues, how a finished run is
stored, and the API that starts and reads it (tests/frontend/test_approvals.py: what approvers see of it)."""
import json

import pytest

from deployments.errors import NotAllowed
from deployments.models import Cluster, ClusterCheck
from deployments.services.cluster_checks import CHECK_TASK, cluster_check_record, cluster_check_request
from deployments.services.clusters import cluster_register
from tests.factories import ClusterFactory

pytestmark = pytest.mark.django_db
SUBNETS_FAILED = {"name": "subnets", "status": "fail",
                  "evidence": "The node subnets span 2 Availability Zones (us-west-2a: subnet-0a1b2c3d4e5f60718; "
                              "us-west-2b: subnet-0f1e2d3c4b5a69788)",
                  "fix": 'Keep the subnets of one zone, e.g. us-west-2a: subnet_ids ["subnet-0a1b2c3d4e5f60718"].'}
PASSED = {"name": "metrics-server", "status": "pass", "evidence": "APIService v1beta1.metrics.k8s.io is available.",
          "fix": ""}


def _queued(redis_client) -> list[tuple[str, list]]:
    return [(json.loads(m)["headers"]["task"], json.loads(m)["headers"]["argsrepr"])
            for m in redis_client.lrange("celery", 0, -1)]


def test_registering_a_cluster_enqueues_its_preflight(platform_admin, redis_client, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        cluster = cluster_register(actor=platform_admin, name="gpu-prod", kind="kubernetes",
                                   config={"namespace_prefix": "tandem-"})
    run = ClusterCheck.objects.get(cluster=cluster)
    assert (run.status, run.requested_by) == (ClusterCheck.Status.RUNNING, platform_admin)
    assert _queued(redis_client) == [(CHECK_TASK, f"({run.pk},)")]


def test_only_platform_admins_ask_for_a_run(team_admin, cluster):
    with pytest.raises(NotAllowed):
        cluster_check_request(actor=team_admin, cluster=cluster)
    assert not ClusterCheck.objects.exists()


def test_a_ray_cluster_has_nothing_to_check_and_passes_at_once(platform_admin):
    run = cluster_check_request(actor=platform_admin, cluster=ClusterFactory(kind=Cluster.Kind.RAY))
    assert run.status == ClusterCheck.Status.PASSED and run.lines.count() == 0


def test_a_run_is_recorded_once_failed_when_a_line_fails(platform_admin, cluster):
    run = cluster_check_request(actor=platform_admin, cluster=cluster)
    cluster_check_record(check_id=run.pk, lines=[PASSED, SUBNETS_FAILED])
    cluster_check_record(check_id=run.pk, lines=[PASSED])  # a redelivered message changes nothing
    run.refresh_from_db()
    assert run.status == ClusterCheck.Status.FAILED and run.finished_at is not None
    assert [(line.name, line.status) for line in run.lines.all()] == [("metrics-server", "pass"), ("subnets", "fail")]


def test_the_check_endpoint_is_for_platform_admins(api, team_admin, platform_admin, cluster):
    url = f"/api/v1/clusters/{cluster.name}/check/"
    api.force_authenticate(team_admin)
    assert api.post(url).status_code == 403 and api.get(url).status_code == 403
    api.force_authenticate(platform_admin)
    assert api.get(url).json() == {"detail": "This cluster was never checked; POST to this URL to check it."}
    started = api.post(url)
    assert started.status_code == 202 and started.json()["status"] == "running"
    cluster_check_record(check_id=started.json()["id"], lines=[SUBNETS_FAILED])
    assert api.get(url).json()["lines"] == [SUBNETS_FAILED]
