"""The approvals queue: who sees what, plan and quota impact, and the decision."""
import pytest
from django.urls import reverse

from deployments.lifecycle import Status
from tests.factories import DeploymentFactory

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
