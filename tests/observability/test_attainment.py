"""Attainment counted in PostgreSQL from the gateway's request records, the advice API, and recommendations
turned into updates through the normal path: by a member (one API call) and by Tandem where the team allows it."""
import datetime as dt

import pytest
from django.utils import timezone

from deployments.models import Deployment, Event
from deployments.spec import spec_parse
from observability.attainment import attainment
from observability.histograms import Hist
from observability.models import StageRollup
from observability.services.advice import recommendations_auto_apply
from tests.factories import DeploymentFactory, spec_input
from usage.models import RequestRecord

POOL = {"instance_type": "g6e.12xlarge", "nodes": 2, "gpus_per_node": 4, "tensor_parallel_size": 4}


def _deployment(team, *, prefill_replicas=(1, 2), targets=None, **kw):
    pmin, pmax = prefill_replicas
    spec = spec_parse(spec_input(prefill={**POOL, "replicas_min": pmin, "replicas_max": pmax},
                                 decode={**POOL, "replicas_min": 2, "replicas_max": 2},
                                 targets=targets or {"ttft_p95_ms": 500, "itl_p95_ms": 50}))
    return DeploymentFactory(team=team, status="running", spec=spec.to_dict(), **kw)


def _records(d, now, ttfts, *, itl=20.0, **kw):
    RequestRecord.objects.bulk_create(RequestRecord(
        request_id=f"{d.pk}-{i}-{kw.get('status_code', 200)}-{kw.get('partial', False)}", deployment=d,
        created_at=now - dt.timedelta(minutes=5), endpoint="chat.completions", stream=True,
        status_code=kw.get("status_code", 200), partial=kw.get("partial", False), ttft_ms=t, e2e_ms=1000,
        mean_itl_ms=itl) for i, t in enumerate(ttfts))


def _queue_growing(d, now):
    """Engine rollups of the last hour: prefill's queue p95 near 50 ms in the first half, 400 ms in the second."""
    for minutes, queue_ms in ((50, 50), (10, 400)):
        h = Hist.from_values([queue_ms] * 5, [10, 50, 100, 200, 400, 800]).to_json()
        StageRollup.objects.create(deployment=d, minute=now - dt.timedelta(minutes=minutes), stage="queue",
                                   source="engine", pool="prefill", count=h["count"], sum=h["sum"],
                                   bounds=h["bounds"], counts=h["counts"])


def test_attainment_counts_answered_requests_of_the_window_in_one_query(team, django_assert_num_queries):
    now = timezone.now()
    d = _deployment(team)
    other = _deployment(team)
    _records(d, now, [100, 200, 300, 600, 700], itl=30)  # 3 of 5 within 500 ms
    _records(d, now, [50], status_code=500)  # failed: its latency says nothing
    _records(other, now, [10000] * 3)
    RequestRecord.objects.create(request_id="old", deployment=d, created_at=now - dt.timedelta(hours=2),
                                 endpoint="chat.completions", status_code=200, ttft_ms=10, e2e_ms=10)
    with django_assert_num_queries(1):
        a = attainment(deployment=d, targets=d.spec_typed.targets, window="1h", now=now)
    ttft, itl = a.of("ttft"), a.of("itl")
    assert a.requests == 5 and (ttft.requests, ttft.met, ttft.share, ttft.ok) == (5, 3, 0.6, False)
    assert ttft.observed_p95_ms == pytest.approx(680)  # percentile_cont over 100..700
    assert (itl.met, itl.ok) == (5, True)


def test_the_advice_api_shows_attainment_and_the_diagnosis_with_its_evidence(team, member, api):
    now = timezone.now()
    d = _deployment(team)
    _records(d, now, [100, 900, 900, 900])
    _queue_growing(d, now)
    api.force_authenticate(member)
    body = api.get(f"/api/v1/deployments/{d.pk}/attainment/?window=1h").json()
    assert body["attainment"]["targets"][0] | {"observed_p95_ms": None} == {
        "measure": "ttft", "target_ms": 500.0, "required_share": 0.95, "requests": 4, "met": 1, "share": 0.25,
        "ok": False, "observed_p95_ms": None}
    [diag] = body["diagnoses"]
    assert diag["kind"] == "prefill_short" and diag["window"] == "1h"
    assert {e["name"]: e["value"] for e in diag["evidence"]}["prefill queue p95, second half"] == 390  # in 200..400
    assert diag["recommendation"]["summary"] == "prefill replicas 1–2 → 2"
    assert api.get(f"/api/v1/deployments/{d.pk}/attainment/?window=2d").status_code == 400
    stranger = _deployment(DeploymentFactory().team)
    assert api.get(f"/api/v1/deployments/{stranger.pk}/attainment/").status_code == 404


@pytest.mark.parametrize(("replicas", "applied"), [((1, 2), True), ((2, 2), False)])
def test_a_member_applies_a_recommendation_with_one_call_through_the_update_path(team, member, api, replicas,
                                                                                 applied):
    now = timezone.now()
    team.gpu_quota = 64  # room for one more node
    team.save()
    d = _deployment(team, prefill_replicas=replicas, requested_by=member)
    _records(d, now, [900] * 4)
    _queue_growing(d, now)
    api.force_authenticate(d.requested_by)
    rec = api.get(f"/api/v1/deployments/{d.pk}/attainment/").json()["diagnoses"][0]["recommendation"]
    r = api.post(f"/api/v1/deployments/{d.pk}/recommendations/{rec['id']}/apply/")
    assert r.status_code == 200, r.content
    d.refresh_from_db()
    if applied:  # within the approved replica bounds: applied at once, the reconciler rolls it out
        assert (d.status, d.spec["prefill"]["replicas_min"], d.proposed_spec) == ("updating", 2, None)
    else:  # one more node: waits for an approver while the approved spec keeps running
        assert d.status == "running" and d.proposed_spec["prefill"]["nodes"] == 3 and r.json()["proposed"]
        assert rec["gpus_delta"] == 4 and rec["hourly_usd_delta"] == pytest.approx(10.493)
    assert Event.objects.filter(deployment=d, kind="recommendation_accepted", actor=member).count() == 1
    again = api.post(f"/api/v1/deployments/{d.pk}/recommendations/{rec['id']}/apply/")
    if applied:  # the spec it was made for is gone
        assert again.status_code == 409 and "not among the current ones" in again.json()["detail"]
    else:  # the same proposal already waits
        assert again.status_code == 200 and Event.objects.filter(kind="recommendation_accepted").count() == 1


def test_a_recommendation_is_priced_at_the_deployment_s_cluster_prices(team, member, api):
    now = timezone.now()
    d = _deployment(team, prefill_replicas=(2, 2), requested_by=member)  # one more replica needs one more node
    d.cluster.config = {**d.cluster.config, "prices": {"g6e.12xlarge": 8.0}}  # the cluster's reserved price
    d.cluster.save()
    _records(d, now, [900] * 4)
    _queue_growing(d, now)
    api.force_authenticate(member)
    rec = api.get(f"/api/v1/deployments/{d.pk}/attainment/").json()["diagnoses"][0]["recommendation"]
    assert (rec["gpus_delta"], rec["hourly_usd_delta"]) == (4, 8.0)


def test_tandem_applies_within_the_approved_bounds_only_for_a_team_that_allows_it(team, team_admin, api):
    now = timezone.now()
    d = _deployment(team)
    _records(d, now, [900] * 4)
    _queue_growing(d, now)
    Deployment.objects.filter(pk=d.pk).update(status_changed_at=now - dt.timedelta(hours=2))
    assert recommendations_auto_apply(deployment_id=d.pk, now=now) is None  # the team has not allowed it
    api.force_authenticate(team_admin)
    assert api.patch(f"/api/v1/teams/{team.slug}/", {"auto_apply_recommendations": True},
                     format="json").status_code == 200
    assert recommendations_auto_apply(deployment_id=d.pk, now=now) == "prefill replicas 1–2 → 2"
    d.refresh_from_db()
    assert d.status == "updating" and d.spec["prefill"]["replicas_min"] == 2
    event = Event.objects.get(deployment=d, kind="recommendation_auto_applied")
    assert event.actor is None and event.after["recommendation"]["needs_approval"] == []
    beyond = _deployment(team, prefill_replicas=(2, 2))
    _records(beyond, now, [900] * 4)
    _queue_growing(beyond, now)
    Deployment.objects.filter(pk=beyond.pk).update(status_changed_at=now - dt.timedelta(hours=2))
    assert recommendations_auto_apply(deployment_id=beyond.pk, now=now) is None  # needs an approver


def test_the_beat_job_sends_the_advisor_to_each_running_deployment_of_teams_that_allow_it(team, redis_client):
    """Beat's `apply-recommendations` entry names a registered task; that task enqueues one advisor pass per
    running deployment whose team allows auto-apply, and none for a team that does not or a deployment that is not
    running. The pass it enqueues applies what the advisor recommends (the test above)."""
    from celery import current_app
    from django.conf import settings

    from observability.tasks import apply_recommendations, apply_recommendations_for
    from tests.factories import TeamFactory
    from tests.support.broker import queued

    entry = settings.CELERY_BEAT_SCHEDULE["apply-recommendations"]
    assert entry["task"] == apply_recommendations.name and entry["task"] in current_app.tasks
    assert entry["schedule"] == 300.0
    team.auto_apply_recommendations = True
    team.save()
    allowed = _deployment(team)
    paused = _deployment(team)
    Deployment.objects.filter(pk=paused.pk).update(status="paused")
    _deployment(TeamFactory(slug="careful"))  # auto_apply_recommendations is off by default
    assert apply_recommendations() == 1
    assert queued(redis_client, task=apply_recommendations_for.name) == [[allowed.pk]]


def test_tandem_leaves_someone_s_waiting_proposal_alone_and_says_why_once(team, member, redis_client):
    """An auto-apply would replace the proposed update a person waits on an approver for: it is skipped, with an
    event (once: the beat asks again every five minutes while the proposal waits)."""
    from deployments.services.actions import deployment_update
    from deployments.spec import spec_request_shape

    now = timezone.now()
    team.auto_apply_recommendations = True
    team.save()
    d = _deployment(team, requested_by=member)
    _records(d, now, [900] * 4)
    _queue_growing(d, now)
    Deployment.objects.filter(pk=d.pk).update(status_changed_at=now - dt.timedelta(hours=2))
    change = spec_request_shape(d.spec_typed)
    change["engine"] = {**change["engine"], "dtype": "float16"}  # needs an approver
    proposed = deployment_update(actor=member, deployment=d, spec=change).deployment.proposed_spec
    assert proposed is not None
    assert recommendations_auto_apply(deployment_id=d.pk, now=now) is None
    assert recommendations_auto_apply(deployment_id=d.pk, now=now) is None  # the next beat's pass
    d.refresh_from_db()
    assert (d.status, d.proposed_spec, d.proposed_by, d.spec["prefill"]["replicas_min"]) == (
        "running", proposed, member, 1)
    [event] = Event.objects.filter(deployment=d, kind="recommendation_not_applied")
    assert event.actor is None and event.message.startswith("Not applied: prefill replicas 1–2 → 2. ")
    assert f"{member.username}'s proposed update of this deployment waits for approval" in event.message
    assert event.after["recommendation"]["summary"] == "prefill replicas 1–2 → 2"
    assert not Event.objects.filter(deployment=d, kind__in=["updated", "recommendation_auto_applied"]).exists()
