"""A paused deployment through the real gateway: an OpenAI-shaped 503 that says how to resume it, and, where the
spec allows it, one wake for however many requests arrive, with a Retry-After from its own history; none for a team
past its monthly budget."""
import datetime as dt

import openai
import pytest
from django.utils import timezone

from deployments.lifecycle import Status
from deployments.models import Deployment, Event
from deployments.services.budgets import budgets_check
from gateway.wake import WAKE_TASK
from tests.factories import spec_restore
from tests.gateway.test_errors import CHAT, assert_openai_error, post
from tests.support.broker import queued
from tests.support.processes import wait_for
from workers.tasks import wake_deployment


def sleeping(world, model: str, *, ready_estimate_seconds: int | None = None):
    """A paused deployment whose spec lets a request wake it."""
    dep = world.deployment(model, status=Status.PAUSED)
    dep.spec["pause"] = {"idle_minutes": None, "wake_on_request": True}
    spec_restore(dep)
    dep.ready_estimate_seconds = ready_estimate_seconds
    dep.save()
    return dep


def test_a_paused_deployment_answers_503_deployment_paused_and_says_how_to_resume(world, gateway, openai_client,
                                                                                  redis_client):
    dep = world.deployment("asleep", status=Status.PAUSED)
    _, raw = world.key()
    error = assert_openai_error(post(gateway, raw, {"model": "asleep", **CHAT}), 503, "deployment_paused")
    assert error["type"] == "service_unavailable"
    assert f"POST /api/v1/deployments/{dep.pk}/resume/" in error["message"]
    with pytest.raises(openai.InternalServerError) as e:  # the official client sees the same
        openai_client(raw).chat.completions.create(model="asleep", **CHAT)
    assert e.value.status_code == 503 and e.value.body["code"] == "deployment_paused"
    assert queued(redis_client, task=WAKE_TASK) == []  # its spec does not allow waking it


def test_requests_to_a_deployment_that_wakes_on_request_start_one_resume(world, gateway, redis_client):
    dep = sleeping(world, "sleepy", ready_estimate_seconds=95)
    _, raw = world.key()
    first = post(gateway, raw, {"model": "sleepy", **CHAT})
    error = assert_openai_error(first, 503, "deployment_paused")
    assert "waking it" in error["message"] and int(first.headers["retry-after"]) == 95
    later = [post(gateway, raw, {"model": "sleepy", **CHAT}) for _ in range(3)]
    assert all(r.status_code == 503 and 0 < int(r.headers["retry-after"]) <= 95 for r in later)
    assert queued(redis_client, task=WAKE_TASK) == [[dep.pk]]  # one wake, whatever the number of requests
    assert wake_deployment.name == WAKE_TASK
    [args] = queued(redis_client, task=WAKE_TASK)
    wake_deployment(*args)  # what the worker does with that message
    assert Deployment.objects.get(pk=dep.pk).status == Status.PROVISIONING


def test_a_team_past_its_budget_is_told_a_request_does_not_wake_it_and_the_refusal_is_recorded(
        world, gateway, openai_client, redis_client):
    world.cluster.config = {**world.cluster.config, "prices": {"g6e.12xlarge": 1000.0}}
    world.cluster.save()
    dear = world.deployment("dear")
    for kind, after in (("requested", {"spec": dear.spec}), ("status_running", {"status": "running"})):
        e = Event.objects.create(kind=kind, team=world.team, deployment=dear, after=after)
        Event.objects.filter(pk=e.pk).update(created_at=max(
            timezone.now() - dt.timedelta(hours=1),
            timezone.now().replace(day=1, hour=0, minute=0, second=0, microsecond=0)))
    world.team.monthly_budget_usd = 1  # two $1,000 nodes for an hour (or since the month began) spent it
    world.team.save()
    dep = sleeping(world, "sleepy")
    assert budgets_check(now=timezone.now()) == [world.team.slug]  # the beat's pass: warned, and the flag set
    _, raw = world.key()
    first = post(gateway, raw, {"model": "sleepy", **CHAT})
    error = assert_openai_error(first, 503, "deployment_over_budget")
    assert error["type"] == "service_unavailable" and "retry-after" not in first.headers
    assert error["message"] == (
        "The deployment serving `sleepy` is paused, and its team has spent its monthly budget: a request does not "
        f"wake it. A platform admin can resume it in the portal or with POST /api/v1/deployments/{dep.pk}/resume/.")
    with pytest.raises(openai.InternalServerError) as e:  # the official client sees the same
        openai_client(raw).chat.completions.create(model="sleepy", **CHAT)
    assert e.value.status_code == 503 and e.value.body["code"] == "deployment_over_budget"
    # One message for however many requests: the worker refuses it by the budget rule and records why.
    assert queued(redis_client, task=WAKE_TASK) == [[dep.pk]]
    [args] = queued(redis_client, task=WAKE_TASK)
    wake_deployment(*args)
    dep.refresh_from_db()
    assert dep.status == Status.PAUSED
    refused = dep.events.get(kind="wake_refused")
    assert refused.actor is None and "past the budget, a platform admin has to resume it" in refused.message


def test_a_woken_deployment_answers_503_with_retry_after_from_its_estimate_until_it_serves(world, gateway,
                                                                                         redis_client):
    sleeping(world, "waking", ready_estimate_seconds=95)
    _, raw = world.key()
    woke = post(gateway, raw, {"model": "waking", **CHAT})
    assert_openai_error(woke, 503, "deployment_paused")
    [args] = queued(redis_client, task=WAKE_TASK)
    wake_deployment(*args)  # the worker resumes it: provisioning from now

    provisioning = wait_for(lambda: (lambda r: r if "deployment_not_running" in r.text else None)(
        post(gateway, raw, {"model": "waking", **CHAT})), timeout=5, what="the gateway seeing it provisioning")
    error = assert_openai_error(provisioning, 503, "deployment_not_running")
    assert "provisioning" in error["message"]
    assert 0 < int(provisioning.headers["retry-after"]) <= int(woke.headers["retry-after"]) == 95
