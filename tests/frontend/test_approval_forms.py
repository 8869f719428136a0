"""Approvals that cannot be bypassed, through the portal's own forms (the real views, Django's test client): an
update that costs waits with its diff in the queue, quota counts whole nodes in the plan, a decision is bound to
the generation and proposed spec the form showed, four-eyes holds at decision time."""
import re

import pytest
from django.urls import reverse

from deployments.lifecycle import Status
from deployments.models import Deployment, Membership
from frontend import spec_form
from tests.factories import DeploymentFactory

pytestmark = pytest.mark.django_db
QUEUE = "/approvals/"


@pytest.fixture
def running(team, cluster, member):
    return DeploymentFactory(team=team, cluster=cluster, requested_by=member, status=Status.RUNNING, name="chat")


def edit_values(d, **over) -> dict:
    values = spec_form.values_from_spec(d.spec_typed) | {"purpose": d.purpose}
    return values | over


def hidden(page: str, pk: int) -> dict:
    """The decision fields of one deployment's card in the queue, as the browser would post them."""
    card = page.split(f'aria-labelledby="ap-{pk}"')[1].split("</article>")[0]
    found = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', card))
    return {k: found.get(k, "") for k in ("generation", "proposed_spec_hash", "next")}


def test_an_edit_of_a_running_deployment_that_costs_more_waits_with_its_diff(signed_in, member, team_admin,
                                                                             running):
    response = signed_in(member).post(reverse("frontend:deployment-edit", args=[running.pk]),
                                      edit_values(running, prefill_instance_type="p5.48xlarge"), follow=True)
    assert "it waits for an admin" in response.content.decode()
    running.refresh_from_db()
    assert running.spec["prefill"]["instance_type"] == "g6e.12xlarge" and running.status == Status.RUNNING
    page = signed_in(team_admin).get(QUEUE).content.decode()
    diff = page.split("<table data-diff>")[1].split("</table>")[0]
    row = diff.split("<code>prefill.instance_type</code>")[1].split("</tr>")[0]
    assert "g6e.12xlarge" in row and "p5.48xlarge" in row
    cost = diff.split("<tr data-cost>")[1].split("</tr>")[0]
    assert re.findall(r"\$[\d,.]+", cost) == ["$20.99", "$65.53"]
    assert "proposed by " + member.username in page.replace("\n", " ")


def test_tuning_a_running_deployment_applies_at_once(signed_in, member, running):
    signed_in(member).post(reverse("frontend:deployment-edit", args=[running.pk]),
                           edit_values(running, engine_max_model_len="4096"))
    running.refresh_from_db()
    assert running.spec["engine"]["max_model_len"] == 4096 and running.status == Status.UPDATING


def test_the_plan_says_quota_counts_whole_nodes(signed_in, member, cluster, htmx_headers):
    values = spec_form.default_values("p5.48xlarge") | {
        "name": "sly", "cluster": cluster.name, "model_id": "m", "model_source": "s3://models/m",
        "prefill_gpus_per_node": "1", "prefill_tensor_parallel_size": "1",
        "decode_gpus_per_node": "1", "decode_tensor_parallel_size": "1"}
    page = signed_in(member).post("/deployments/validate/", values, headers=htmx_headers()).content.decode()
    assert re.search(r'class="big">(\d+) <span[^>]*>GPUs requested', page)[1] == "16"
    assert "Tandem provisions whole nodes" in page and "p5.48xlarge × 8 GPUs" in page


def test_approving_from_a_stale_form_changes_nothing(signed_in, member, team_admin, deployment):
    admin = signed_in(team_admin)
    form = hidden(admin.get(QUEUE).content.decode(), deployment.pk)
    values = spec_form.values_from_spec(deployment.spec_typed) | {"prefill_nodes": "2", "purpose": ""}
    signed_in(member).post(reverse("frontend:deployment-edit", args=[deployment.pk]), values)
    response = admin.post(reverse("frontend:deployment-approve", args=[deployment.pk]), form, follow=True)
    assert "The request changed since you opened it" in response.content.decode()
    deployment.refresh_from_db()
    assert deployment.status == Status.PENDING_APPROVAL and deployment.generation == 2
    form = hidden(admin.get(QUEUE).content.decode(), deployment.pk)
    admin.post(reverse("frontend:deployment-approve", args=[deployment.pk]), form)
    deployment.refresh_from_db()
    assert deployment.status == Status.APPROVED and deployment.spec["prefill"]["nodes"] == 2


def test_rejecting_from_a_stale_form_of_a_proposed_update_changes_nothing(signed_in, member, team_admin, running):
    edit = reverse("frontend:deployment-edit", args=[running.pk])
    signed_in(member).post(edit, edit_values(running, prefill_nodes="2"))
    admin = signed_in(team_admin)
    form = hidden(admin.get(QUEUE).content.decode(), running.pk)
    assert len(form["proposed_spec_hash"]) == 64
    signed_in(member).post(edit, edit_values(running, prefill_nodes="3"))
    response = admin.post(reverse("frontend:deployment-reject", args=[running.pk]), form, follow=True)
    assert "with a different proposed update" in response.content.decode()
    assert Deployment.objects.get(pk=running.pk).proposed_spec["prefill"]["nodes"] == 3


def test_the_admin_who_proposed_an_update_cannot_approve_it_in_the_queue(signed_in, team_admin, running):
    admin = signed_in(team_admin)
    admin.post(reverse("frontend:deployment-edit", args=[running.pk]), edit_values(running, prefill_nodes="2"))
    form = hidden(admin.get(QUEUE).content.decode(), running.pk)
    response = admin.post(reverse("frontend:deployment-approve", args=[running.pk]), form, follow=True)
    assert "You proposed this update" in response.content.decode()
    running.refresh_from_db()
    assert running.spec["prefill"]["nodes"] == 1 and running.proposed_spec is not None


def test_a_requester_made_team_admin_mid_flight_cannot_approve_in_the_queue(signed_in, member, team, deployment):
    Membership.objects.filter(team=team, user=member).update(role=Membership.Role.ADMIN)
    client = signed_in(member)
    form = hidden(client.get(QUEUE).content.decode(), deployment.pk)
    response = client.post(reverse("frontend:deployment-approve", args=[deployment.pk]), form, follow=True)
    assert "another admin of the team must approve" in response.content.decode()
    deployment.refresh_from_db()
    assert deployment.status == Status.PENDING_APPROVAL
