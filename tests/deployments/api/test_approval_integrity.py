"""Approvals that cannot be bypassed, through the REST API: what needs approval again, how quota counts, that a
decision is bound to what was reviewed, and four-eyes at decision time."""
import pytest

from deployments.catalog import INSTANCE_TYPES
from deployments.event_kinds import EventKind
from deployments.models import Deployment, Membership
from deployments.selectors import deployments_awaiting_approval_by
from tests.factories import DeploymentFactory, MembershipFactory, spec_input

pytestmark = pytest.mark.django_db


def pool(**over):
    return {"instance_type": "g6e.12xlarge", "nodes": 1, "gpus_per_node": 4, "tensor_parallel_size": 4, **over}


def url(d, action=""):
    return f"/api/v1/deployments/{d.pk}/" + (f"{action}/" if action else "")


@pytest.fixture
def running(team, cluster, member):
    return DeploymentFactory(team=team, cluster=cluster, requested_by=member, status="running", name="chat")


def seen_by(api, user, d) -> dict:
    """What an approver has in front of them: the deployment as the API shows it now."""
    api.force_authenticate(user)
    return api.get(url(d)).json()


def decision(body: dict, **over) -> dict:
    return {"generation": body["generation"], "proposed_spec_hash": body.get("proposed_spec_hash"), **over}


def test_a_bigger_instance_type_waits_for_approval_while_the_old_spec_runs(api, member, team_admin, running):
    api.force_authenticate(member)
    r = api.patch(url(running), {"spec": spec_input(prefill=pool(instance_type="p5.48xlarge"))}, format="json")
    assert r.status_code == 200, r.json()
    body = r.json()
    assert body["status"] == "running" and body["generation"] == 1
    assert body["spec"]["prefill"]["instance_type"] == "g6e.12xlarge"
    assert body["proposed_spec"]["prefill"]["instance_type"] == "p5.48xlarge" and body["proposed_by"] == member.username
    change = next(c for c in body["proposal"]["changes"] if c["field"] == "prefill.instance_type")
    assert (change["old"], change["new"], change["needs_approval"]) == ("g6e.12xlarge", "p5.48xlarge", True)
    g6e, p5 = INSTANCE_TYPES["g6e.12xlarge"].hourly_usd, INSTANCE_TYPES["p5.48xlarge"].hourly_usd
    assert body["proposal"]["hourly_usd_before"] == pytest.approx(2 * g6e, abs=1e-3)
    assert body["proposal"]["hourly_usd_after"] == pytest.approx(g6e + p5, abs=1e-3)
    assert (body["proposal"]["gpus_before"], body["proposal"]["gpus_after"]) == (8, 12)
    api.force_authenticate(team_admin)
    r = api.post(url(running, "approve"), decision(body), format="json")
    assert r.status_code == 200 and r.json()["spec"]["prefill"]["instance_type"] == "p5.48xlarge"
    assert r.json()["status"] == "updating" and r.json()["generation"] == 2


@pytest.mark.parametrize("change", [
    {"model": {"id": "llama-3-8b", "source": "s3://models/llama-3-8b-instruct"}},
    {"prefill": pool(nodes=2)},
    {"decode": pool(gpus_per_node=2, tensor_parallel_size=2)},
    {"engine": {"max_model_len": 8192, "dtype": "float16"}},
    {"engine": {"max_model_len": 8192, "gpu_memory_utilization": 0.95}},
    {"expected_load": {"requests_per_second": 200, "mean_prompt_tokens": 1024, "mean_output_tokens": 256}},
], ids=["model-source", "nodes", "gpus-per-node", "dtype", "memory-utilization", "expected-load"])
def test_what_runs_or_costs_never_changes_without_approval(api, member, running, change):
    api.force_authenticate(member)
    before = Deployment.objects.get(pk=running.pk).spec
    r = api.patch(url(running), {"spec": spec_input(**change)}, format="json")
    assert r.status_code == 200, r.json()
    running.refresh_from_db()
    assert running.spec == before and running.proposed_spec is not None and running.status == "running"


def test_tuning_and_purpose_apply_at_once(api, member, running):
    api.force_authenticate(member)
    r = api.patch(url(running), {"spec": spec_input(engine={"max_model_len": 4096}), "purpose": "evals, then chat"},
                  format="json")
    body = r.json()
    assert (body["status"], body["generation"], body["proposed_spec"]) == ("updating", 2, None)
    assert body["spec"]["engine"]["max_model_len"] == 4096 and body["purpose"] == "evals, then chat"


def test_a_free_update_while_someone_else_s_proposal_waits_is_a_409_and_the_proposal_stays(
        api, member, team_admin, running):
    api.force_authenticate(member)
    assert api.patch(url(running), {"spec": spec_input(prefill=pool(nodes=2))}, format="json").status_code == 200
    proposal = seen_by(api, team_admin, running)
    r = api.patch(url(running), {"spec": spec_input(engine={"max_model_len": 4096})}, format="json")
    assert r.status_code == 409, r.json()
    assert r.json()["detail"] == (
        f"{member.username}'s proposed update of this deployment waits for approval, and your change would "
        f"discard it. Ask an admin of team {running.team.slug} to approve or reject it (or {member.username} "
        "to withdraw it), then apply your change.")
    after = api.get(url(running)).json()
    assert (after["proposed_spec_hash"], after["proposed_by"], after["generation"], after["status"]) == (
        proposal["proposed_spec_hash"], member.username, 1, "running")


def test_quota_counts_the_whole_node_a_pool_provisions(api, member, team, cluster):
    """On a Kubernetes cluster a p5.48xlarge asked for with 1 GPU per node still takes all 8 of them."""
    team.gpu_quota = 8
    team.save()
    api.force_authenticate(member)
    one = pool(instance_type="p5.48xlarge", gpus_per_node=1, tensor_parallel_size=1)
    r = api.post("/api/v1/deployments/", {"team": team.slug, "cluster": cluster.name, "name": "sly",
                                          "spec": spec_input(prefill=one, decode=one)}, format="json")
    assert r.status_code == 400 and r.json()["code"] == "quota_exceeded"
    assert "This needs 16 GPUs" in r.json()["detail"]


def test_an_edit_after_the_admin_opened_the_request_is_a_409(api, member, team_admin, team, cluster):
    api.force_authenticate(member)
    created = api.post("/api/v1/deployments/", {"team": team.slug, "cluster": cluster.name, "name": "small",
                                                "spec": spec_input()}, format="json").json()
    shown = seen_by(api, team_admin, Deployment.objects.get(pk=created["id"]))
    api.force_authenticate(member)
    api.patch(f"/api/v1/deployments/{created['id']}/", {"spec": spec_input(prefill=pool(nodes=2))}, format="json")
    api.force_authenticate(team_admin)
    for action in ("approve", "reject"):
        r = api.post(f"/api/v1/deployments/{created['id']}/{action}/", decision(shown), format="json")
        assert r.status_code == 409 and "the request changed since you opened it" in r.json()["detail"].lower()
    assert Deployment.objects.get(pk=created["id"]).status == "pending_approval"
    fresh = seen_by(api, team_admin, Deployment.objects.get(pk=created["id"]))
    assert api.post(f"/api/v1/deployments/{created['id']}/approve/", decision(fresh), format="json").json()[
        "status"] == "approved"


def test_another_proposal_after_the_admin_opened_it_is_a_409(api, member, team_admin, running):
    api.force_authenticate(member)
    api.patch(url(running), {"spec": spec_input(prefill=pool(nodes=2))}, format="json")
    shown = seen_by(api, team_admin, running)
    api.force_authenticate(member)
    api.patch(url(running), {"spec": spec_input(prefill=pool(instance_type="p5.48xlarge"))}, format="json")
    api.force_authenticate(team_admin)
    r = api.post(url(running, "approve"), decision(shown), format="json")
    assert r.status_code == 409 and "with a different proposed update" in r.json()["detail"]
    running.refresh_from_db()
    assert running.spec["prefill"]["instance_type"] == "g6e.12xlarge" and running.generation == 1
    r = api.post(url(running, "approve"), decision(shown, proposed_spec_hash=None), format="json")
    assert r.status_code == 400 and "proposed_spec_hash" in r.json()["errors"]


def test_generation_is_required(api, team_admin, running):
    api.force_authenticate(team_admin)
    r = api.post(url(running, "approve"), {"comment": "ok"}, format="json")
    assert r.status_code == 400 and "generation" in r.json()["errors"]


def test_a_requester_made_platform_admin_mid_flight_cannot_approve_their_own_request(api, member, team, cluster):
    api.force_authenticate(member)
    created = api.post("/api/v1/deployments/", {"team": team.slug, "cluster": cluster.name, "name": "mine",
                                                "spec": spec_input()}, format="json").json()
    member.is_staff = True
    member.save()
    r = api.post(f"/api/v1/deployments/{created['id']}/approve/", decision(created), format="json")
    assert r.status_code == 403 and "another admin" in r.json()["detail"]
    assert Deployment.objects.get(pk=created["id"]).status == "pending_approval"


def test_a_requester_made_team_admin_mid_flight_cannot_approve_their_own_request(api, member, team, cluster):
    api.force_authenticate(member)
    created = api.post("/api/v1/deployments/", {"team": team.slug, "cluster": cluster.name, "name": "mine",
                                                "spec": spec_input()}, format="json").json()
    Membership.objects.filter(team=team, user=member).update(role=Membership.Role.ADMIN)
    r = api.post(f"/api/v1/deployments/{created['id']}/approve/", decision(created), format="json")
    assert r.status_code == 403
    assert Deployment.objects.get(pk=created["id"]).status == "pending_approval"


def test_the_admin_who_proposed_an_update_cannot_approve_it(api, team_admin, running, team):
    api.force_authenticate(team_admin)
    body = api.patch(url(running), {"spec": spec_input(prefill=pool(nodes=2))}, format="json").json()
    assert body["proposed_by"] == team_admin.username
    r = api.post(url(running, "approve"), decision(body), format="json")
    assert r.status_code == 403 and "You proposed this update" in r.json()["detail"]
    running.refresh_from_db()
    assert running.proposed_spec is not None and running.spec != running.proposed_spec, "approved anyway"
    other = MembershipFactory(team=team, role=Membership.Role.ADMIN).user
    api.force_authenticate(other)
    assert api.post(url(running, "approve"), decision(body), format="json").status_code == 200


def test_the_admin_who_edited_a_pending_request_cannot_approve_it(api, member, team_admin, team, cluster):
    d = DeploymentFactory(team=team, cluster=cluster, requested_by=member, name="asked")
    api.force_authenticate(team_admin)
    body = api.patch(url(d), {"spec": spec_input(prefill=pool(nodes=2))}, format="json").json()
    r = api.post(url(d, "approve"), decision(body), format="json")
    assert r.status_code == 403
    d.refresh_from_db()
    assert d.status == "pending_approval"


def test_an_approver_demoted_after_opening_it_cannot_approve(api, member, team_admin, team, running):
    api.force_authenticate(member)
    body = api.patch(url(running), {"spec": spec_input(prefill=pool(nodes=2))}, format="json").json()
    Membership.objects.filter(team=team, user=team_admin).update(role=Membership.Role.MEMBER)
    api.force_authenticate(team_admin)
    assert api.post(url(running, "approve"), decision(body), format="json").status_code == 403
    running.refresh_from_db()
    assert running.proposed_spec is not None and running.spec != running.proposed_spec, "approved anyway"


@pytest.mark.parametrize("leave, to", [("delete", "deleting"), ("pause", "pausing")])
def test_a_proposed_update_is_dropped_when_the_deployment_is_deleted_or_paused(api, member, team_admin, running,
                                                                                leave, to):
    """Nobody can decide an update of a deployment that is going away or pausing: it leaves the queue at once
    instead of waiting there for ever with approve, reject and withdraw all refused."""
    api.force_authenticate(member)
    r = api.patch(url(running), {"spec": spec_input(prefill=pool(instance_type="p5.48xlarge"))}, format="json")
    assert r.json()["proposed_spec"] is not None and list(deployments_awaiting_approval_by(team_admin)) == [running]
    r = api.delete(url(running)) if leave == "delete" else api.post(url(running, "pause"))
    assert r.status_code == 202 and r.json()["status"] == to
    body = seen_by(api, team_admin, running)
    assert (body["proposed_spec"], body["proposed_spec_hash"], body["proposal"]) == (None, None, None)
    assert list(deployments_awaiting_approval_by(team_admin)) == []
    dropped = running.events.get(kind=EventKind.UPDATE_WITHDRAWN)
    assert dropped.before["proposed_spec"]["prefill"]["instance_type"] == "p5.48xlarge" and dropped.actor == member
    assert dropped.message == f"Dropped: the deployment is {to} now, where an update cannot be decided; ask for it " \
                              "again once it runs."
