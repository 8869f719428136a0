"""On-demand conformance runs cannot be used to hold everyone's workers: one pending run per deployment, and a
per-team rate; the rest get 429 with Retry-After and a message that says why."""
import base64
import datetime as dt
import json

import pytest
from django.utils import timezone

from deployments.models import Event
from observability.tasks import run_conformance
from tests.factories import DeploymentFactory, MembershipFactory, TeamFactory, UserFactory
from tests.observability.mock_openai import MockUpstream

pytestmark = pytest.mark.django_db


def conformance(api, d):
    return api.post(f"/api/v1/deployments/{d.pk}/conformance/")


def queued_runs(redis_client) -> list[tuple[int, dict]]:
    """The run_conformance messages waiting in the Celery queue (no worker runs in these tests)."""
    runs = []
    for raw in redis_client.lrange("celery", 0, -1):
        message = json.loads(raw)
        if message["headers"]["task"] == "observability.tasks.run_conformance":
            args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
            runs.append((args[0], kwargs))
    return runs


@pytest.fixture
def running(team, member):
    return DeploymentFactory(team=team, requested_by=member, status="running", name="chat-8b")


def test_one_pending_run_per_deployment(api, member, running, redis_client):
    api.force_authenticate(member)
    first = conformance(api, running)
    assert first.status_code == 202 and first.json() == {"deployment": running.pk, "queued": True}
    again = conformance(api, running)
    assert again.status_code == 429 and 1 <= int(again["Retry-After"]) <= 30
    assert again.json()["detail"].startswith("A conformance run of chat-8b is already pending")
    assert queued_runs(redis_client) == [(running.pk, {"on_demand": True})]
    assert Event.objects.filter(deployment=running, kind="conformance_requested", actor=member).count() == 1


def test_a_run_the_reconciler_started_counts_as_pending(api, member, running, redis_client):
    running.conformance_requested_at = timezone.now() - dt.timedelta(seconds=5)
    running.save(update_fields=["conformance_requested_at"])
    api.force_authenticate(member)
    refused = conformance(api, running)
    assert refused.status_code == 429 and refused["Retry-After"] == "30" and queued_runs(redis_client) == []


def test_when_the_run_ends_the_deployment_can_be_checked_again(api, member, running, redis_client, settings):
    api.force_authenticate(member)
    assert conformance(api, running).status_code == 202
    with MockUpstream() as upstream:
        settings.TANDEM_GATEWAY_BASE_URL = upstream.base_url
        run_conformance(running.pk, on_demand=True)  # what the worker runs for the queued message
    assert running.conformance_runs.count() == 1
    assert conformance(api, running).status_code == 202


def test_a_team_over_its_rate_waits_for_the_window(api, member, team, redis_client, settings):
    settings.TANDEM_CONFORMANCE_TEAM_RUNS = 3
    settings.TANDEM_CONFORMANCE_TEAM_WINDOW_SECONDS = 3600
    deployments = [DeploymentFactory(team=team, requested_by=member, status="running") for _ in range(4)]
    api.force_authenticate(member)
    assert [conformance(api, d).status_code for d in deployments[:3]] == [202, 202, 202]
    refused = conformance(api, deployments[3])
    assert refused.status_code == 429 and 3590 <= int(refused["Retry-After"]) <= 3600
    assert "has asked for 3 conformance runs in the last 60 minutes" in refused.json()["detail"]
    assert len(queued_runs(redis_client)) == 3
    # The refusal did not leave the fourth deployment marked pending, and other teams keep their own rate.
    other = DeploymentFactory(team=TeamFactory(), status="running")
    api.force_authenticate(MembershipFactory(team=other.team).user)
    assert conformance(api, other).status_code == 202
    redis_client.delete(f"tandem:conformance:team:{team.pk}")  # as when the window ends
    api.force_authenticate(member)
    assert conformance(api, deployments[3]).status_code == 202


def test_only_the_team_can_ask(api, running, redis_client):
    api.force_authenticate(UserFactory())
    assert conformance(api, running).status_code == 404 and queued_runs(redis_client) == []
