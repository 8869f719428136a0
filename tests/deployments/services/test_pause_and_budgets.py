"""Pause, resume, idle pause, wake, and budgets: who may, what is freed, what is audited, when approval tightens."""
import datetime as dt

import pytest
from django.utils import timezone

from deployments.budget_flag import OVER_BUDGET_KEY
from deployments.errors import Conflict, NotAllowed, QuotaExceeded
from deployments.lifecycle import Status
from deployments.models import Event, Membership
from deployments.services import actions
from deployments.services.budgets import budget_state, budgets_check
from deployments.services.pause import deployment_pause, deployment_resume, deployment_wake, deployments_pause_idle
from deployments.services.quota import team_gpus_held
from deployments.services.teams import team_update
from deployments.spec import spec_parse
from deployments.spend import team_month_to_date_usd
from tests.factories import DeploymentFactory, MembershipFactory, spec_input

pytestmark = pytest.mark.django_db


def running(team, cluster, *, pause=None, requested_by=None, status=Status.RUNNING, **kw):
    spec = spec_parse(spec_input(**({"pause": pause} if pause else {}))).to_dict()
    return DeploymentFactory(team=team, cluster=cluster, spec=spec, status=status,
                             requested_by=requested_by or MembershipFactory(team=team).user, **kw)


def test_the_requester_pauses_quota_is_freed_once_paused_and_a_resume_checks_it_again(team, cluster, team_admin):
    team.gpu_quota = 8
    team.save()
    d = running(team, cluster)
    assert team_gpus_held(team=team) == 8
    d = deployment_pause(actor=d.requested_by, deployment=d)
    assert d.status == Status.PAUSING and team_gpus_held(team=team) == 8  # its nodes are still there
    actions.deployment_transition(deployment=d, to=Status.PAUSED, reason="torn down")  # the reconciler's word
    assert team_gpus_held(team=team) == 0
    other = running(team, cluster, name="other")  # the freed GPUs are taken meanwhile
    with pytest.raises(QuotaExceeded, match="already holds 8"):
        deployment_resume(actor=team_admin, deployment=d)
    actions.deployment_delete(actor=other.requested_by, deployment=other)
    actions.deployment_transition(deployment=other, to=Status.DELETED)
    generation = d.generation
    d = deployment_resume(actor=team_admin, deployment=d)
    assert d.status == Status.PROVISIONING and d.generation == generation + 1  # checked again before users get it
    kinds = list(d.events.order_by("id").values_list("kind", flat=True))
    assert kinds[-3:] == ["pause_requested", "status_paused", "resumed"]


def test_only_the_requester_or_a_team_admin_pauses_and_only_live_ones(team, cluster, member):
    d = running(team, cluster)
    with pytest.raises(NotAllowed):
        deployment_pause(actor=member, deployment=d)
    pending = DeploymentFactory(team=team, cluster=cluster, status=Status.PENDING_APPROVAL, name="p",
                                requested_by=member)
    with pytest.raises(Conflict, match="on its way to running, running, updating or failed; this one is pending"):
        deployment_pause(actor=member, deployment=pending)
    with pytest.raises(Conflict, match="Only a paused deployment"):
        deployment_resume(actor=d.requested_by, deployment=d)


def test_idle_deployments_are_paused_with_the_reason_and_busy_ones_are_not(team, cluster):
    now = timezone.now()
    idle = running(team, cluster, pause={"idle_minutes": 30}, name="idle")
    busy = running(team, cluster, pause={"idle_minutes": 30}, name="busy")
    never = running(team, cluster, name="no-idle-time")
    type(idle).objects.filter(pk__in=[idle.pk, busy.pk, never.pk]).update(status_changed_at=now - dt.timedelta(hours=2))
    seen = {}

    def last_requests(ids):
        seen["ids"] = sorted(ids)
        return {busy.pk: now - dt.timedelta(minutes=5), idle.pk: now - dt.timedelta(minutes=45)}

    assert deployments_pause_idle(now=now, last_requests=last_requests) == [idle.pk]
    assert seen["ids"] == sorted([idle.pk, busy.pk])  # only those that set an idle time are looked up
    idle.refresh_from_db()
    assert idle.status == Status.PAUSING
    event = idle.events.get(kind="idle_paused")
    assert event.actor is None and "No request through the gateway for 30 minutes" in event.message


def test_a_wake_resumes_once_and_only_where_the_spec_allows_it(team, cluster):
    sleepy = running(team, cluster, pause={"wake_on_request": True}, name="sleepy", status=Status.PAUSED)
    closed = running(team, cluster, name="closed", status=Status.PAUSED)
    assert deployment_wake(deployment_id=closed.pk) is None
    assert deployment_wake(deployment_id=sleepy.pk).status == Status.PROVISIONING
    assert deployment_wake(deployment_id=sleepy.pk) is None  # a second request's message changes nothing
    assert sleepy.events.filter(kind="woken").count() == 1
    closed.refresh_from_db()
    assert closed.status == Status.PAUSED


def test_a_wake_the_quota_cannot_take_is_recorded_not_raised(team, cluster):
    team.gpu_quota = 8
    team.save()
    sleepy = running(team, cluster, pause={"wake_on_request": True}, name="sleepy", status=Status.PAUSED)
    running(team, cluster, name="hog")
    assert deployment_wake(deployment_id=sleepy.pk) is None
    assert "could not wake" in sleepy.events.get(kind="wake_refused").message


def _running_for_an_hour(d):
    """Its timeline says it was requested and has run for the last hour (the month's start cuts it, if sooner)."""
    for kind, after in (("requested", {"spec": d.spec}), ("status_running", {"status": "running"})):
        e = Event.objects.create(kind=kind, team=d.team, deployment=d, after=after)
        Event.objects.filter(pk=e.pk).update(created_at=timezone.now() - dt.timedelta(hours=1))


def test_budget_warns_the_admins_once_at_80_percent_and_past_100_only_a_platform_admin_approves_more(
        team, cluster, team_admin, platform_admin):
    cluster.config = {**cluster.config, "prices": {"g6e.12xlarge": 1000.0}}  # reserved, and dear
    cluster.save()
    d = running(team, cluster)
    _running_for_an_hour(d)
    assert budget_state(team=team).used is None  # no budget, nothing to warn about
    spent = team_month_to_date_usd(team=team, now=timezone.now())
    assert spent > 100
    team.monthly_budget_usd = int(spent / 0.9)
    team.save()
    assert budget_state(team=team).warn and not budget_state(team=team).over
    assert budgets_check(now=timezone.now()) == [team.slug]
    assert budgets_check(now=timezone.now()) == []  # once a month
    warning = Event.objects.get(kind="budget_warning", team=team)
    assert warning.after["admins"] == [team_admin.username]
    assert f"of its ${team.monthly_budget_usd:,} monthly budget" in warning.message

    team.monthly_budget_usd = int(spent * 0.9)
    team.save()
    requester = MembershipFactory(team=team, role=Membership.Role.MEMBER).user
    new = actions.deployment_request(actor=requester, team=team, cluster=cluster, name="more", spec=spec_input())
    with pytest.raises(NotAllowed, match="a platform admin has to approve it"):
        actions.deployment_approve(actor=team_admin, deployment=new, generation=new.generation)
    d.refresh_from_db()
    assert d.status == Status.RUNNING  # nothing running is stopped
    actions.deployment_reject(actor=team_admin, deployment=new, generation=new.generation)  # rejecting is theirs
    again = actions.deployment_request(actor=requester, team=team, cluster=cluster, name="again", spec=spec_input())
    assert actions.deployment_approve(actor=platform_admin, deployment=again,
                                      generation=again.generation).status == Status.APPROVED


def _over_budget(team, cluster):
    """The team has spent past its budget this month: a dear deployment ran for the last hour."""
    cluster.config = {**cluster.config, "prices": {"g6e.12xlarge": 1000.0}}
    cluster.save()
    _running_for_an_hour(running(team, cluster, name="dear"))
    team.monthly_budget_usd = int(team_month_to_date_usd(team=team, now=timezone.now()) * 0.9)
    team.save()
    assert budget_state(team=team).over


def test_past_the_budget_only_a_platform_admin_resumes_and_a_wake_is_refused_and_recorded(
        team, cluster, team_admin, platform_admin):
    _over_budget(team, cluster)
    sleepy = running(team, cluster, pause={"wake_on_request": True}, name="sleepy", status=Status.PAUSED)
    with pytest.raises(NotAllowed, match="past the budget, a platform admin has to resume it"):
        deployment_resume(actor=team_admin, deployment=sleepy)
    assert deployment_wake(deployment_id=sleepy.pk) is None
    sleepy.refresh_from_db()
    assert sleepy.status == Status.PAUSED and not sleepy.events.filter(kind__in=["resumed", "woken"]).exists()
    refused = sleepy.events.get(kind="wake_refused")
    assert refused.actor is None and f"of its ${team.monthly_budget_usd:,} monthly budget" in refused.message
    assert deployment_resume(actor=platform_admin, deployment=sleepy).status == Status.PROVISIONING


def test_the_budget_check_sets_the_gateway_s_over_budget_flag_and_a_new_budget_clears_it_at_once(
        team, cluster, platform_admin, redis_client, django_capture_on_commit_callbacks):
    flag = OVER_BUDGET_KEY.format(team.pk)
    _over_budget(team, cluster)
    assert not redis_client.exists(flag)  # nothing has checked yet
    budgets_check(now=timezone.now())
    assert redis_client.exists(flag)
    with django_capture_on_commit_callbacks(execute=True):
        team_update(actor=platform_admin, team=team, monthly_budget_usd=team.monthly_budget_usd * 10)
    assert not redis_client.exists(flag)
    budgets_check(now=timezone.now())
    assert not redis_client.exists(flag)  # within the new budget
