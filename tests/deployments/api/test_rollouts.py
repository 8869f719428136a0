"""Rollouts over the API: the team reads each update's steps, weight and replicas (and sees the one in progress on
the deployment itself); its admins pause, resume or abort it, everyone else is refused."""
import pytest

from deployments.lifecycle import Status
from deployments.models import Event, Rollout
from deployments.services import actions
from deployments.services.rollouts import rollout_record
from deployments.services.status import deployment_observe
from deployments.spec import spec_request_shape
from tests.factories import MembershipFactory, TeamFactory, UserFactory
from tests.support.fleet import count_queries
from tests.support.rollouts import rollout_at_step, rollout_started

pytestmark = pytest.mark.django_db

EVIDENCE = {"weight": 10, "verdict": "ok", "old": {"ttft_p50_ms": 80, "error_rate": 0.0},
            "new": {"ttft_p50_ms": 85, "error_rate": 0.0}}


@pytest.fixture
def rollout(team, team_admin, cluster):
    return rollout_started(team=team, cluster=cluster, admin=team_admin)


def url(r: Rollout, action: str = "") -> str:
    return f"/api/v1/deployments/{r.deployment_id}/rollouts/{r.pk}/" + (f"{action}/" if action else "")


def test_a_member_reads_the_rollout_with_its_steps_replicas_and_the_verdicts_reasons(api, member, rollout):
    rollout_at_step(rollout, 1, 50, replicas={"old": {"prefill": 1, "decode": 1}, "new": {"prefill": 1, "decode": 1}},
                    peak_surge={"prefill": 1, "decode": 1}, steps_log=[EVIDENCE])
    api.force_authenticate(member)
    body = api.get(url(rollout)).json()
    assert (body["mode"], body["state"], body["paused"], body["weight"], body["step"]) == (
        "side_by_side", "shifting", False, 50, 1)
    assert body["verdict"] == {"compatible": False,
                               "reasons": ["model.id changed (llama-3-8b → llama-3-8b-v2)"]}
    assert body["steps"] == [{"weight": 10, "state": "done"}, {"weight": 50, "state": "current"},
                             {"weight": 100, "state": "waiting"}]
    assert body["replicas"] == {"old": {"prefill": 1, "decode": 1}, "new": {"prefill": 1, "decode": 1}}
    assert body["peak_surge"] == {"prefill": 1, "decode": 1}
    assert body["steps_log"] == [EVIDENCE]
    assert (body["from_generation"], body["to_generation"], body["finished_at"]) == (1, 2, None)


def test_the_steps_are_the_deployments_own(api, team, team_admin, member, cluster):
    r = rollout_started(team=team, cluster=cluster, admin=team_admin, rollout={"steps": [25, 100]})
    api.force_authenticate(member)
    assert [s["weight"] for s in api.get(url(r)).json()["steps"]] == [25, 100]


def test_a_rollout_in_place_has_no_traffic_steps(api, team, team_admin, member, cluster):
    r = rollout_started(team=team, cluster=cluster, admin=team_admin, model_id="llama-3-8b",
                        engine={"max_model_len": 4096})
    assert r.mode == Rollout.Mode.IN_PLACE
    api.force_authenticate(member)
    body = api.get(url(r)).json()
    assert (body["mode"], body["verdict"], body["steps"]) == ("in_place", {"compatible": True, "reasons": []}, [])


def test_the_deployment_shows_its_rollout_while_it_runs_and_null_once_it_is_done(api, member, rollout):
    api.force_authenticate(member)
    d_url = f"/api/v1/deployments/{rollout.deployment_id}/"
    rollout_at_step(rollout, 0, 10)
    shown = api.get(d_url).json()["rollout"]
    assert (shown["id"], shown["weight"], shown["steps"][0]) == (rollout.pk, 10, {"weight": 10, "state": "current"})
    listed = api.get("/api/v1/deployments/").json()["results"]
    assert [d["rollout"]["weight"] for d in listed if d["id"] == rollout.deployment_id] == [10]
    rollout_record(rollout=rollout, state=Rollout.State.DONE, step=2, weight=100)
    assert api.get(d_url).json()["rollout"] is None
    assert [s["state"] for s in api.get(url(rollout)).json()["steps"]] == ["done", "done", "done"]


def test_the_list_is_newest_first(api, team_admin, member, rollout):
    rollout_record(rollout=rollout, state=Rollout.State.DONE, weight=100, step=2)
    d = rollout.deployment
    # As the reconciler ends the update: generation 2 serves.
    deployment_observe(deployment_id=d.pk, observed_generation=2, endpoint_generation=2)
    actions.deployment_transition(deployment=d, to=Status.RUNNING)
    newer = spec_request_shape(d.spec_typed)
    newer["model"]["id"] = "llama-3-8b-v3"
    actions.deployment_update(actor=team_admin, deployment=d, spec=newer)
    d.refresh_from_db()
    actions.deployment_approve(actor=UserFactory(is_superuser=True, is_staff=True), deployment=d,
                               generation=d.generation, proposed_hash=d.proposed_spec_hash)
    api.force_authenticate(member)
    body = api.get(f"/api/v1/deployments/{d.pk}/rollouts/").json()
    assert [(r["from_generation"], r["to_generation"], r["state"]) for r in body["results"]] == [
        (2, 3, "starting"), (1, 2, "done")]


def test_an_admin_pauses_resumes_and_aborts_with_a_reason_each_recorded(api, team_admin, rollout):
    rollout_at_step(rollout, 0, 10)
    api.force_authenticate(team_admin)
    r = api.post(url(rollout, "pause"))
    assert r.status_code == 200 and (r.json()["paused"], r.json()["weight"]) == (True, 10)
    assert api.get(f"/api/v1/deployments/{rollout.deployment_id}/").json()["rollout"]["paused"] is True
    r = api.post(url(rollout, "resume"))
    assert r.status_code == 200 and r.json()["paused"] is False
    r = api.post(url(rollout, "abort"), {"reason": "p95 looks off"}, format="json")
    assert r.status_code == 200
    assert (r.json()["state"], r.json()["reason"]) == ("rolling_back", f"Aborted by {team_admin.username}: "
                                                                       "p95 looks off")
    kinds = list(Event.objects.filter(deployment_id=rollout.deployment_id).order_by("pk").values_list(
        "kind", flat=True))
    assert kinds[-3:] == ["rollout_paused", "rollout_resumed", "rollout_aborted"]


@pytest.mark.parametrize("action", ["pause", "resume", "abort"])
def test_a_member_or_a_platform_stranger_cannot_change_a_rollout(api, member, rollout, action):
    rollout_at_step(rollout, 0, 10)
    api.force_authenticate(member)
    r = api.post(url(rollout, action), {}, format="json")
    assert r.status_code == 403 and r.json()["code"] == "not_allowed"
    rollout.refresh_from_db()
    assert (rollout.state, rollout.paused) == ("shifting", False)
    api.force_authenticate(MembershipFactory(team=TeamFactory(), role="admin").user)  # another team's admin
    assert api.post(url(rollout, action), {}, format="json").status_code == 404
    assert api.get(url(rollout)).status_code == 404


@pytest.mark.parametrize("action", ["pause", "resume", "abort"])
def test_a_rollout_that_ended_answers_409(api, team_admin, rollout, action):
    rollout_record(rollout=rollout, state=Rollout.State.DONE, weight=100, step=2)
    api.force_authenticate(team_admin)
    r = api.post(url(rollout, action), {}, format="json")
    assert r.status_code == 409 and "is done" in r.json()["detail"]


def test_a_rollout_rolling_back_cannot_be_paused(api, team_admin, rollout):
    rollout_at_step(rollout, 1, 50)
    api.force_authenticate(team_admin)
    api.post(url(rollout, "abort"), {"reason": "slow"}, format="json")
    r = api.post(url(rollout, "pause"))
    assert r.status_code == 409 and "rolling back already" in r.json()["detail"]
    rollout.refresh_from_db()
    assert (rollout.state, rollout.paused) == ("rolling_back", False)


def test_a_rollout_in_place_cannot_be_paused_only_aborted(api, team, team_admin, cluster):
    r = rollout_started(team=team, cluster=cluster, admin=team_admin, model_id="llama-3-8b",
                        engine={"max_model_len": 4096})
    api.force_authenticate(team_admin)
    answer = api.post(url(r, "pause"))
    assert answer.status_code == 409 and "abort it" in answer.json()["detail"]
    assert api.post(url(r, "abort"), {}, format="json").json()["reason"] == (
        f"Aborted by {team_admin.username}: no reason given")


def test_a_rollout_of_another_deployment_is_a_404_through_this_one(api, team, team_admin, cluster, rollout):
    team.gpu_quota = 32  # two rollouts side by side: their specs' 16 GPUs and their surges' 16
    team.save(update_fields=["gpu_quota"])
    other = rollout_started(team=team, cluster=cluster, admin=team_admin)
    api.force_authenticate(team_admin)
    wrong = f"/api/v1/deployments/{rollout.deployment_id}/rollouts/{other.pk}/"
    assert api.get(wrong).status_code == 404
    assert api.post(wrong + "abort/", {}, format="json").status_code == 404
    other.refresh_from_db()
    assert other.state == "starting"


@pytest.mark.parametrize("body", [{"reason": 5}, {"reason": None}, {"reason": "x" * 2001}, ["why"]])
def test_an_abort_whose_reason_is_not_text_is_a_400_and_changes_nothing(api, team_admin, rollout, body):
    api.force_authenticate(team_admin)
    assert api.post(url(rollout, "abort"), body, format="json").status_code == 400
    rollout.refresh_from_db()
    assert rollout.state == "starting"


def test_signed_out_is_a_401(api, rollout):
    assert api.get(url(rollout)).status_code == 401
    assert api.post(url(rollout, "pause")).status_code == 401


def test_a_page_of_rolling_deployments_costs_the_same_queries_as_one(api, team, team_admin, member, cluster):
    """Each deployment's rollout is loaded with the page (one query), not one per row: nor its steps, which read
    the deployment's spec."""
    team.gpu_quota = 64
    team.save(update_fields=["gpu_quota"])
    rollout_started(team=team, cluster=cluster, admin=team_admin)
    api.force_authenticate(member)
    count_queries(api.get, "/api/v1/deployments/")  # warm
    one = count_queries(api.get, "/api/v1/deployments/")
    for _ in range(3):
        rollout_started(team=team, cluster=cluster, admin=team_admin)
    many = count_queries(api.get, "/api/v1/deployments/")
    assert many == one
    assert [d["rollout"]["state"] for d in api.get("/api/v1/deployments/").json()["results"]] == ["starting"] * 4
