"""The REST API for pause and resume, a team's spend (JSON and CSV for chargeback), and a deployment's cost."""
import csv
import datetime as dt
import io

import pytest
from django.utils import timezone

from deployments.lifecycle import Status
from deployments.models import Event, Membership
from deployments.services.api_keys import api_key_create
from tests.factories import DeploymentFactory, MembershipFactory, TeamFactory
from usage.models import RequestRecord

pytestmark = pytest.mark.django_db


@pytest.fixture
def llama(team, cluster, member):
    """Running for the last two hours on two g6e.12xlarge nodes (its timeline says so)."""
    d = DeploymentFactory(team=team, cluster=cluster, name="llama", status=Status.RUNNING, requested_by=member)
    started = max(timezone.now() - dt.timedelta(hours=2),
                  timezone.now().replace(day=1, hour=0, minute=0, second=0, microsecond=0))
    for kind, after in (("requested", {"spec": d.spec}), ("status_running", {"status": "running"})):
        e = Event.objects.create(kind=kind, team=team, deployment=d, after=after)
        Event.objects.filter(pk=e.pk).update(created_at=started)
    d.hours = (timezone.now() - started).total_seconds() / 3600
    return d


def test_the_requester_pauses_and_resumes_through_the_api_and_others_may_not(api, llama, member):
    api.force_authenticate(MembershipFactory(team=llama.team, role=Membership.Role.MEMBER).user)
    r = api.post(f"/api/v1/deployments/{llama.pk}/pause/")
    assert r.status_code == 403 and "requester or an admin" in r.json()["detail"]
    llama.refresh_from_db()
    assert llama.status == Status.RUNNING and not llama.events.filter(kind__contains="paus").exists()
    api.force_authenticate(member)
    r = api.post(f"/api/v1/deployments/{llama.pk}/resume/")
    assert r.status_code == 409 and "Only a paused deployment" in r.json()["detail"]
    r = api.post(f"/api/v1/deployments/{llama.pk}/pause/")
    assert r.status_code == 202 and r.json()["status"] == "pausing"
    api.force_authenticate(MembershipFactory(team=TeamFactory(slug="other")).user)
    assert api.post(f"/api/v1/deployments/{llama.pk}/pause/").status_code == 404


def test_past_the_budget_a_team_admin_s_resume_is_a_403_that_says_why_and_a_platform_admin_s_is_not(
        api, llama, cluster, team_admin, platform_admin):
    cluster.config = {**cluster.config, "prices": {"g6e.12xlarge": 8.0}}
    cluster.save()
    team = llama.team
    team.monthly_budget_usd = 1  # two hours of two $8 nodes spent it
    team.save()
    asleep = DeploymentFactory(team=team, cluster=cluster, name="asleep", status=Status.PAUSED,
                               requested_by=llama.requested_by)
    api.force_authenticate(team_admin)
    r = api.post(f"/api/v1/deployments/{asleep.pk}/resume/")
    assert r.status_code == 403, r.json()
    assert r.json()["detail"].startswith("Team ml-research has spent $")
    assert "past the budget, a platform admin has to resume it" in r.json()["detail"]
    asleep.refresh_from_db()
    assert asleep.status == Status.PAUSED and not asleep.events.exists()
    api.force_authenticate(platform_admin)
    r = api.post(f"/api/v1/deployments/{asleep.pk}/resume/")
    assert r.status_code == 202 and r.json()["status"] == "provisioning"


def test_a_retry_of_a_paused_deployment_whose_deletion_failed_deletes_it_again(api, team, cluster, member):
    from deployments.services.actions import deployment_transition

    d = DeploymentFactory(team=team, cluster=cluster, name="asleep", status=Status.PAUSED, requested_by=member)
    api.force_authenticate(member)
    assert api.delete(f"/api/v1/deployments/{d.pk}/").json()["status"] == "deleting"
    deployment_transition(deployment=d, to=Status.FAILED, reason="Teardown failed.")  # the reconciler's word
    r = api.post(f"/api/v1/deployments/{d.pk}/retry/")
    assert r.status_code == 200 and r.json()["status"] == "deleting"


@pytest.mark.parametrize("status", [Status.PROVISIONING, Status.UPDATING])
def test_a_deployment_on_its_way_is_paused_too_and_holds_no_quota_once_paused(api, team, cluster, member, status):
    """Waiting for GPU capacity (or rolling out) costs node-hours: the requester stops that as from running."""
    d = DeploymentFactory(team=team, cluster=cluster, name="llama", status=status, requested_by=member)
    api.force_authenticate(member)
    r = api.post(f"/api/v1/deployments/{d.pk}/pause/")
    assert r.status_code == 202 and r.json()["status"] == "pausing"
    assert [e.kind for e in Event.objects.filter(deployment=d)] == ["pause_requested"]
    assert api.post(f"/api/v1/deployments/{d.pk}/pause/").status_code == 202  # asking again changes nothing
    assert Event.objects.filter(deployment=d).count() == 1


def test_team_spend_by_day_and_deployment_as_json_and_as_csv_for_chargeback(api, llama, member, cluster):
    cluster.config = {**cluster.config, "prices": {"g6e.12xlarge": 8.0}}  # the cluster's reserved price
    cluster.save()
    api.force_authenticate(member)
    body = api.get(f"/api/v1/teams/{llama.team.slug}/spend/").json()
    assert body["month"] == f"{timezone.now():%Y-%m}" and body["monthly_budget_usd"] is None
    assert body["total_usd"] == pytest.approx(2 * 8.0 * llama.hours, rel=1e-3)
    assert [d["name"] for d in body["deployments"]] == ["llama"]
    assert sum(day["usd"] for day in body["days"]) == pytest.approx(body["total_usd"], abs=1e-3)

    r = api.get(f"/api/v1/teams/{llama.team.slug}/spend/?format=csv")
    assert r.status_code == 200 and r["Content-Type"].startswith("text/csv")
    assert f'filename="tandem-{llama.team.slug}-{timezone.now():%Y-%m}.csv"' in r["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(r.content.decode())))
    assert {(row["deployment"], row["stage"], row["instance_type"]) for row in rows} == {
        ("llama", "prefill", "g6e.12xlarge"), ("llama", "decode", "g6e.12xlarge")}
    assert sum(float(row["usd"]) for row in rows) == pytest.approx(body["total_usd"], abs=1e-2)

    assert api.get(f"/api/v1/teams/{llama.team.slug}/spend/?month=2026-13").status_code == 400
    api.force_authenticate(MembershipFactory(team=TeamFactory(slug="other")).user)
    assert api.get(f"/api/v1/teams/{llama.team.slug}/spend/").status_code == 404


def test_a_deployments_cost_per_hour_per_million_output_tokens_and_per_key(api, llama, member):
    a, _ = api_key_create(actor=member, team=llama.team, name="app-a")
    b, _ = api_key_create(actor=member, team=llama.team, name="app-b")
    for i, (key, tokens) in enumerate([(a, 3000), (a, 1000), (b, 4000)]):
        RequestRecord.objects.create(request_id=f"r{i}", deployment=llama, api_key=key, created_at=timezone.now(),
                                     endpoint="chat.completions", status_code=200, completion_tokens=tokens,
                                     e2e_ms=100)
    api.force_authenticate(member)
    body = api.get(f"/api/v1/deployments/{llama.pk}/cost/?window=24h").json()
    hourly = 2 * 10.493
    assert body["hourly_usd"] == pytest.approx(hourly)
    assert body["usd"] == pytest.approx(hourly * llama.hours, rel=1e-3)
    assert body["output_tokens"] == 8000
    assert body["usd_per_million_output_tokens"] == pytest.approx(body["usd"] / 8000 * 1e6, rel=1e-3)
    shares = {k["name"]: k["usd"] for k in body["keys"]}
    assert shares["app-a"] == pytest.approx(shares["app-b"], rel=1e-3)  # 4000 output tokens each
    assert api.get(f"/api/v1/deployments/{llama.pk}/cost/?window=forever").status_code == 400
