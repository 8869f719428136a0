"""The approvals queue: who sees what, plan and quota impact, and the decision."""
import json

import pytest
from django.urls import reverse

from deployments.lifecycle import Status
from deployments.services.cluster_checks import cluster_check_record, cluster_check_request
from deployments.services.spec_store import deployment_proposal_set
from deployments.spec import spec_parse
from deployments.spend import deployment_hourly_usd
from tests.deployments.services.test_cluster_checks import PASSED, SUBNETS_FAILED
from tests.factories import DeploymentFactory, spec_input

pytestmark = pytest.mark.django_db
QUEUE = "/approvals/"


def test_url():
    assert reverse("frontend:approvals") == QUEUE


def test_team_admin_sees_the_request_with_quota_impact(signed_in, team_admin, deployment, team, cluster, member):
    DeploymentFactory(team=team, cluster=cluster, requested_by=member, name="held", status=Status.RUNNING)
    page = signed_in(team_admin).get(QUEUE).content.decode()
    assert "chat-8b" in page and "New request" in page
    assert "After approval Ml-Research holds <strong>16 of 16</strong> GPUs." in page
    assert 'formaction="/deployments/%d/approve/"' % deployment.pk in page
    assert 'formaction="/deployments/%d/reject/"' % deployment.pk in page
    assert '<span class="count" aria-label="1 waiting">1</span>' in page


def test_over_quota_is_flagged_before_approving(signed_in, team_admin, deployment, team):
    team.gpu_quota = 6
    team.save()
    page = signed_in(team_admin).get(QUEUE).content.decode()
    assert "Over quota: needs 8, only 6 free." in page


def test_member_sees_an_empty_queue_that_explains(signed_in, member, deployment):
    page = signed_in(member).get(QUEUE).content.decode()
    assert "chat-8b" not in page and "Nothing waits for you" in page and "Team admins approve" in page


def test_other_teams_admin_sees_nothing(signed_in, outsider, deployment):
    assert "chat-8b" not in signed_in(outsider).get(QUEUE).content.decode()


def test_platform_admin_sees_every_team(signed_in, platform_admin, deployment):
    assert "chat-8b" in signed_in(platform_admin).get(QUEUE).content.decode()


def test_approving_over_quota_is_refused_with_the_numbers(signed_in, team_admin, deployment, team):
    team.gpu_quota = 6
    team.save()
    response = signed_in(team_admin).post(reverse("frontend:deployment-approve", args=[deployment.pk]),
                                          {"next": QUEUE, "generation": "1"}, follow=True)
    deployment.refresh_from_db()
    assert deployment.status == Status.PENDING_APPROVAL
    assert "This needs 8 GPUs" in response.content.decode()


def test_requester_cannot_approve_own_request_as_admin(signed_in, team_admin, team, cluster):
    d = DeploymentFactory(team=team, cluster=cluster, requested_by=team_admin, name="mine")
    response = signed_in(team_admin).post(reverse("frontend:deployment-approve", args=[d.pk]),
                                          {"generation": "1"}, follow=True)
    d.refresh_from_db()
    assert d.status == Status.PENDING_APPROVAL and "another admin of the team must approve" in response.content.decode()


# What an approver sees of a cluster whose preflight fails (recorded through the service the worker uses), with
# the check lines of the preflight's own record tests (PASSED, SUBNETS_FAILED).


def test_the_approver_sees_the_clusters_failed_checks_redacted_and_the_platform_admin_in_full(
        signed_in, team_admin, platform_admin, deployment, cluster, api):
    run = cluster_check_request(actor=platform_admin, cluster=cluster)
    cluster_check_record(check_id=run.pk, lines=[PASSED, SUBNETS_FAILED])

    page = signed_in(team_admin).get("/approvals/").content.decode()
    assert f"{cluster.name} fails 1 of its checks" in page
    assert "<strong>subnets</strong>: The node subnets span 2 Availability Zones" in page
    assert "subnet-0a1b2c3d4e5f60718" not in page  # members and team admins never read the cluster's internals
    assert "subnet-0a1b2c3d4e5f60718" in signed_in(platform_admin).get("/approvals/").content.decode()

    api.force_authenticate(team_admin)
    body = api.get(f"/api/v1/deployments/{deployment.pk}/").json()
    assert [f["name"] for f in body["cluster_check_failures"]] == ["subnets"]
    assert "subnet-0a1b2c3d4e5f60718" not in json.dumps(body)


def test_a_passing_or_running_cluster_shows_no_failures(signed_in, team_admin, platform_admin, deployment, cluster):
    run = cluster_check_request(actor=platform_admin, cluster=cluster)
    cluster_check_record(check_id=run.pk, lines=[SUBNETS_FAILED])
    cluster_check_request(actor=platform_admin, cluster=cluster)  # a new run, not finished: the last result stands
    assert "fails 1 of its checks" in signed_in(team_admin).get("/approvals/").content.decode()
    fixed = cluster_check_request(actor=platform_admin, cluster=cluster)
    cluster_check_record(check_id=fixed.pk, lines=[PASSED])
    assert "of its checks" not in signed_in(team_admin).get("/approvals/").content.decode()


def test_the_queue_shows_the_hourly_cost_the_team_would_be_charged_at_the_cluster_s_own_prices(
        signed_in, team_admin, deployment, team, cluster, member):
    cluster.config = {**cluster.config, "prices": {"g6e.12xlarge": 8.0}}  # the cluster's reserved price
    cluster.save()
    running = DeploymentFactory(team=team, cluster=cluster, requested_by=member, name="held", status=Status.RUNNING)
    bigger = spec_parse(spec_input(decode={"instance_type": "g6e.12xlarge", "nodes": 2, "gpus_per_node": 4,
                                           "tensor_parallel_size": 4}), target_kind=cluster.kind).to_dict()
    running.save(update_fields=deployment_proposal_set(deployment=running, spec=bigger, by=member))
    assert deployment_hourly_usd(running) == 16.0  # what cost charges for it now
    page = signed_in(team_admin).get(QUEUE).content.decode()
    assert "<div><dt>Hourly cost</dt><dd>$16.00</dd></div>" in page  # the new request: two nodes at $8
    assert "<tr data-cost><td>Hourly cost</td><td>$16.00</td><td><strong>$24.00</strong></td></tr>" in page


@pytest.mark.parametrize("leave", ["delete", "pause"])
def test_a_proposed_update_leaves_the_queue_page_when_its_deployment_is_deleted_or_paused(
        signed_in, team_admin, team, cluster, member, leave):
    from deployments.services.actions import deployment_delete, deployment_update
    from deployments.services.pause import deployment_pause
    from tests.factories import spec_input

    running = DeploymentFactory(team=team, cluster=cluster, requested_by=member, name="chat-70b",
                                status=Status.RUNNING)
    bigger = spec_input(decode={"instance_type": "g6e.12xlarge", "nodes": 2, "gpus_per_node": 4,
                                "tensor_parallel_size": 4})
    deployment_update(actor=member, deployment=running, spec=bigger)
    assert "chat-70b" in signed_in(team_admin).get(QUEUE).content.decode()
    (deployment_delete if leave == "delete" else deployment_pause)(actor=member, deployment=running)
    page = signed_in(team_admin).get(QUEUE).content.decode()
    assert "chat-70b" not in page and "Nothing waits for you" in page
