"""The dry run of a create or an update (`POST /deployments/preview/`, `POST /deployments/{id}/preview/`): it
answers what the write would do under the write's own rules, refuses what the write refuses with the same
answer, and keeps nothing: no row, generation, event or reconcile request."""
import pytest

from deployments.lifecycle import Status
from deployments.models import Deployment, Event, Membership
from deployments.services.clusters import cluster_update
from deployments.services.spec_store import deployment_proposal_set
from deployments.services.status import RECONCILE_TASK
from deployments.spec import spec_parse
from tests.factories import DeploymentFactory, MembershipFactory, TeamFactory, UserFactory, spec_input
from tests.support.broker import queued

pytestmark = pytest.mark.django_db


def create_body(team, cluster_, **over):
    return {"team": team.slug, "cluster": cluster_.name, "name": "chat", "purpose": "support", "spec": spec_input(),
            **over}


def decode_nodes(n: int) -> dict:
    return spec_input(decode={"instance_type": "g6e.12xlarge", "nodes": n, "gpus_per_node": 4,
                              "tensor_parallel_size": 4})


@pytest.fixture
def running(team, cluster, member):
    return DeploymentFactory(team=team, cluster=cluster, requested_by=member, name="chat", status=Status.RUNNING)


def _stored(d: Deployment) -> tuple:
    d.refresh_from_db()
    return d.generation, d.spec, d.proposed_spec, d.proposed_by_id, d.purpose, d.status, d.updated_at, \
        Event.objects.filter(deployment=d).count()


def test_a_change_needing_approval_is_previewed_field_by_field_and_nothing_is_kept(
        api, member, running, django_capture_on_commit_callbacks):
    api.force_authenticate(member)
    before = _stored(running)
    with django_capture_on_commit_callbacks() as enqueued:
        r = api.post(f"/api/v1/deployments/{running.pk}/preview/", {"spec": decode_nodes(2)}, format="json")
    assert r.status_code == 200, r.json()
    p = r.json()
    assert (p["outcome"], p["waits_for_approval"], p["status"], p["generation"]) == ("proposed", True, "running",
                                                                                    before[0])
    assert p["changes"] == [{"field": "decode.nodes", "old": 1, "new": 2, "needs_approval": True}]
    assert (p["gpus_before"], p["gpus_after"]) == (8, 12) and p["hourly_usd_after"] > p["hourly_usd_before"]
    assert _stored(running) == before and enqueued == []

    # The update itself then does what the preview said, as its proposal shows it to an approver.
    d = api.patch(f"/api/v1/deployments/{running.pk}/", {"spec": decode_nodes(2)}, format="json").json()
    assert d["proposal"]["changes"] == p["changes"]
    assert (d["proposal"]["gpus_after"], d["proposal"]["hourly_usd_after"]) == (p["gpus_after"], p["hourly_usd_after"])


def test_a_change_applied_at_once_is_previewed_without_its_reconcile_request(
        api, member, running, django_capture_on_commit_callbacks, redis_client):
    api.force_authenticate(member)
    spec = spec_input(engine={"max_model_len": 4096})
    before = _stored(running)
    with django_capture_on_commit_callbacks() as enqueued:
        p = api.post(f"/api/v1/deployments/{running.pk}/preview/", {"spec": spec, "purpose": "eval"},
                     format="json").json()
    assert (p["outcome"], p["waits_for_approval"], p["status"], p["generation"]) == ("updated", False, "updating",
                                                                                    before[0] + 1)
    assert {c["field"]: (c["old"], c["new"], c["needs_approval"]) for c in p["changes"]} == {
        "engine.max_model_len": (8192, 4096, False), "purpose": ("", "eval", False)}
    assert _stored(running) == before and enqueued == []
    with django_capture_on_commit_callbacks(execute=True):  # the real update asks for a pass: the check sees it
        api.patch(f"/api/v1/deployments/{running.pk}/", {"spec": spec, "purpose": "eval"}, format="json")
    assert queued(redis_client, task=RECONCILE_TASK) == [[running.pk]] and _stored(running)[0] == before[0] + 1


def test_the_same_spec_is_unchanged(api, member, running):
    api.force_authenticate(member)
    p = api.post(f"/api/v1/deployments/{running.pk}/preview/", {"spec": spec_input()}, format="json").json()
    assert (p["outcome"], p["changes"], p["waits_for_approval"]) == ("unchanged", [], False)


def test_an_edit_of_a_pending_request_still_waits(api, member, team, cluster):
    pending = DeploymentFactory(team=team, cluster=cluster, requested_by=member, name="chat")
    api.force_authenticate(member)
    before = _stored(pending)
    p = api.post(f"/api/v1/deployments/{pending.pk}/preview/", {"spec": decode_nodes(2)}, format="json").json()
    assert (p["outcome"], p["waits_for_approval"], p["status"], p["generation"]) == (
        "edited", True, "pending_approval", before[0] + 1)
    assert p["changes"] == [{"field": "decode.nodes", "old": 1, "new": 2, "needs_approval": True}]
    assert _stored(pending) == before


def test_a_new_request_is_previewed_and_nothing_is_created(api, member, team, cluster):
    api.force_authenticate(member)
    r = api.post("/api/v1/deployments/preview/", create_body(team, cluster), format="json")
    assert r.status_code == 200, r.json()
    p = r.json()
    assert (p["outcome"], p["waits_for_approval"], p["status"], p["generation"]) == ("created", True,
                                                                                    "pending_approval", 1)
    fields = {c["field"]: (c["old"], c["new"]) for c in p["changes"]}
    assert fields["model_id"] == (None, "llama-3-8b") and fields["decode.nodes"] == (None, 1)
    assert fields["purpose"] == (None, "support") and all(c["needs_approval"] for c in p["changes"])
    assert (p["gpus_before"], p["gpus_after"], p["hourly_usd_before"]) == (0, 8, 0.0)
    assert not Deployment.objects.exists() and not Event.objects.exists()
    # Nothing was reserved either: the name is free for the request itself.
    assert api.post("/api/v1/deployments/", create_body(team, cluster), format="json").status_code == 201


@pytest.mark.parametrize("over", [
    {"spec": spec_input(engine={"max_model_len": -1})},
    {"name": "Not A DNS Name"},
    {"spec": decode_nodes(4)},  # 4 + 16 GPUs: past the team's 16-GPU quota
    {"cluster": "no-such-cluster"},
    {"spec": spec_input(model={"id": "x", "source": "s3://elsewhere/x"})},  # a source the cluster does not allow
])
def test_a_preview_of_a_create_refuses_what_the_create_refuses_with_the_same_answer(api, member, team, cluster,
                                                                                     over):
    api.force_authenticate(member)
    body = create_body(team, cluster, **over)
    preview = api.post("/api/v1/deployments/preview/", body, format="json")
    real = api.post("/api/v1/deployments/", body, format="json")
    assert preview.status_code == real.status_code == 400
    assert preview.json() == real.json()


def test_a_preview_of_a_create_refuses_a_taken_name_as_the_create_does(api, member, team, cluster, running):
    api.force_authenticate(member)
    preview = api.post("/api/v1/deployments/preview/", create_body(team, cluster), format="json")
    real = api.post("/api/v1/deployments/", create_body(team, cluster), format="json")
    assert preview.status_code == real.status_code == 409 and preview.json() == real.json()


@pytest.mark.parametrize("body", [
    {"spec": spec_input(engine={"max_model_len": -1})},
    {"spec": decode_nodes(4)},
    {"spec": "not a mapping"},
    {"purpose": 5},
])
def test_a_preview_of_an_update_refuses_what_the_update_refuses_with_the_same_answer(api, member, running, body):
    api.force_authenticate(member)
    before = _stored(running)
    preview = api.post(f"/api/v1/deployments/{running.pk}/preview/", body, format="json")
    real = api.patch(f"/api/v1/deployments/{running.pk}/", body, format="json")
    assert preview.status_code == real.status_code == 400
    assert preview.json() == real.json() and _stored(running) == before


def test_who_may_not_change_it_may_not_preview_a_change(api, team, running):
    other_member = MembershipFactory(team=team, role=Membership.Role.MEMBER).user
    stranger = MembershipFactory(team=TeamFactory(), role=Membership.Role.ADMIN).user
    for user, code in ((other_member, 403), (stranger, 404)):
        api.force_authenticate(user)
        preview = api.post(f"/api/v1/deployments/{running.pk}/preview/", {"spec": decode_nodes(2)}, format="json")
        real = api.patch(f"/api/v1/deployments/{running.pk}/", {"spec": decode_nodes(2)}, format="json")
        assert preview.status_code == real.status_code == code and preview.json() == real.json()


def test_the_preview_compares_with_the_approved_spec_when_an_update_waits(api, member, running, cluster):
    deployment_proposal_set(deployment=running, spec=spec_parse(decode_nodes(2), target_kind=cluster.kind).to_dict(),
                            by=member)
    running.save()
    api.force_authenticate(member)
    p = api.post(f"/api/v1/deployments/{running.pk}/preview/", {"spec": decode_nodes(3)}, format="json").json()
    assert p["outcome"] == "proposed"
    assert p["changes"] == [{"field": "decode.nodes", "old": 1, "new": 3, "needs_approval": True}]
    same = api.post(f"/api/v1/deployments/{running.pk}/preview/", {"spec": decode_nodes(2)}, format="json").json()
    assert (same["outcome"], same["waits_for_approval"]) == ("unchanged", True)


def test_previews_and_the_proposal_show_the_price_the_team_is_charged_on_a_cluster_with_its_own_prices(
        api, member, team, cluster, running):
    # The cluster's reserved price, set as a platform admin sets it (the edit re-prices its live deployments).
    cluster_update(actor=UserFactory(is_staff=True, is_superuser=True), cluster=cluster,
                   config={**cluster.config, "prices": {"g6e.12xlarge": 8.0}})
    api.force_authenticate(member)
    charged = api.get(f"/api/v1/deployments/{running.pk}/cost/").json()["hourly_usd"]
    assert charged == 16.0  # two nodes at the cluster's $8, not the catalog's $10.493
    p = api.post(f"/api/v1/deployments/{running.pk}/preview/", {"spec": decode_nodes(2)}, format="json").json()
    assert (p["hourly_usd_before"], p["hourly_usd_after"]) == (charged, 24.0)
    created = api.post("/api/v1/deployments/preview/", create_body(team, cluster, name="other"), format="json").json()
    assert created["hourly_usd_after"] == 16.0
    proposal = api.patch(f"/api/v1/deployments/{running.pk}/", {"spec": decode_nodes(2)}, format="json").json()
    assert (proposal["proposal"]["hourly_usd_before"], proposal["proposal"]["hourly_usd_after"]) == (16.0, 24.0)
