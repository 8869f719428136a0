"""The preflight's records: who may ask for a run, what registering a cluster enqueues, how a finished run is
stored, and the API that starts and reads it (tests/frontend/test_approvals.py: what approvers see of it)."""
import json

import pytest

from deployments.errors import Conflict, NotAllowed
from deployments.models import Cluster, ClusterCheck, Deployment
from deployments.services import actions
from deployments.services.cluster_checks import CHECK_TASK, cluster_check_record, cluster_check_request
from deployments.services.clusters import cluster_register
from tests.deployments.services.test_actions import approve, request, small
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
    assert api.get(url).json()["lines"] == [{**SUBNETS_FAILED, "subject": ""}]


# --- a failing line about something a deployment uses stops its approval ---------------------------------------------
def _failing(subject: str, evidence: str, fix: str = "Fix it.", *, name: str = "runtime-image") -> dict:
    return {"name": name, "status": "fail", "evidence": evidence, "fix": fix, "subject": subject}


def _checked(admin, cluster, *lines) -> None:
    run = cluster_check_request(actor=admin, cluster=cluster)
    cluster_check_record(check_id=run.pk, lines=list(lines))


def test_a_failing_line_about_what_a_deployment_uses_refuses_its_approval_in_the_users_words(
        member, team_admin, platform_admin, team, cluster):
    """Any subject works the same: here a runtime's image (another check emits it); the approver reads the check's
    evidence and fix redacted, as on the approvals page, and the request stays pending."""
    d = request(member, team, cluster)
    runtime = d.spec_typed.runtime
    _checked(platform_admin, cluster, PASSED, _failing(
        f"runtime:{runtime}", "rayproject/ray-llm:2.60.0-py312-cu128 is not in the registry that "
                              "subnet-0a1b2c3d4e5f60718's nodes pull from.", "Push the image, then check again."))

    with pytest.raises(Conflict) as refused:
        approve(team_admin, d)

    assert refused.value.status_code == 409
    assert refused.value.message == (
        f"Cluster gpu-prod's last check fails for what this deployment uses, so it would not start there. "
        f"runtime-image ({runtime}): rayproject/ray-llm:2.60.0-py312-cu128 is not in the registry that "
        "[a network of cluster gpu-prod]'s nodes pull from. Fix: Push the image, then check again. Once fixed, run "
        "the cluster's checks again (tandemctl doctor gpu-prod), then approve.")
    d.refresh_from_db()
    assert d.status == "pending_approval"
    with pytest.raises(Conflict) as refused:  # a platform admin reads it as the check wrote it
        approve(platform_admin, d)
    assert "subnet-0a1b2c3d4e5f60718's nodes" in refused.value.message

    _checked(platform_admin, cluster, PASSED)  # a later run passes it
    assert approve(team_admin, d).status == "approved"


@pytest.mark.parametrize("subject", ["instance:p5.48xlarge", "family:P", "runtime:another-runtime", ""])
def test_a_failing_line_about_something_else_or_the_cluster_as_a_whole_does_not_stop_the_approval(
        member, team_admin, platform_admin, team, cluster, subject):
    """The deployment runs g6e.12xlarge (family G): a p5 offering, the P quota or another runtime are not its
    concern, and a line about the whole cluster is shown to approvers, who decide."""
    d = request(member, team, cluster)
    _checked(platform_admin, cluster, _failing(subject, "Something is wrong."))
    assert approve(team_admin, d).status == "approved"


def test_an_update_is_refused_on_what_its_proposed_spec_uses(member, team_admin, platform_admin, team, cluster):
    d = approve(team_admin, request(member, team, cluster))
    Deployment.objects.filter(pk=d.pk).update(status="running")
    _checked(platform_admin, cluster, _failing("instance:g6e.48xlarge", "g6e.48xlarge is not offered in us-west-2a.",
                                               name="instance-offered"))
    d = actions.deployment_update(actor=member, deployment=d, spec=small(instance_type="g6e.48xlarge",
                                                                         gpus_per_node=8, tensor_parallel_size=8)
                                  ).deployment
    with pytest.raises(Conflict, match=r"instance-offered \(g6e.48xlarge\): g6e.48xlarge is not offered in "
                                       r"us-west-2a."):
        approve(team_admin, d)


def test_a_run_still_running_leaves_the_last_finished_one_deciding(member, team_admin, platform_admin, team, cluster):
    d = request(member, team, cluster)
    _checked(platform_admin, cluster, _failing("family:G", "Running On-Demand G and VT instances: 0 vCPUs.",
                                               name="vcpu-quota-g"))
    cluster_check_request(actor=platform_admin, cluster=cluster)
    with pytest.raises(Conflict, match=r"vcpu-quota-g \(G\): Running On-Demand G and VT instances: 0 vCPUs."):
        approve(team_admin, d)
