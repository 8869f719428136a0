"""Pause, resume, idle pause and wake on request.

A pause tears the serving part down on the target (the reconciler's `pausing` step) while the deployment, its
spec, keys, history and endpoint name stay; a paused deployment holds no quota. A resume checks the quota again
and reconciles back to running; the gateway lets users in only after the conformance suite has checked it, as
for a new deployment. Neither needs an approver (the spec does not change), except that a team past its monthly
budget needs a platform admin to resume (deployments.services.budgets), so a wake on request is refused then.
"""
import datetime as dt
from collections.abc import Callable

from django.db import transaction

from deployments.errors import Conflict, NotAllowed, QuotaExceeded
from deployments.event_kinds import EventKind
from deployments.lifecycle import PAUSABLE, PAUSED_OR_PAUSING, Status
from deployments.models import Deployment, Team
from deployments.quota_rules import quota_gpus
from deployments.services.actions import _locked, _recheck, _require_editor, deployment_transition
from deployments.services.budgets import budget_require_approver
from deployments.services.events import event_record
from deployments.services.quota import quota_check


@transaction.atomic
def deployment_pause(*, actor, deployment: Deployment, reason: str = "",
                     event_kind: EventKind = EventKind.PAUSE_REQUESTED) -> Deployment:
    """Tear the serving part down and keep the rest (the requester or a team admin; `actor=None`: Tandem).

    Also while it is provisioning or updating: what is on its way stops costing (on EKS the node groups go to
    zero). A reconcile pass in flight for it stops at its next status change (`workers.pipeline`), and the
    pausing pass, which waits for its lock, removes whatever it applied meanwhile."""
    d = _locked(deployment)
    if actor is not None:
        _require_editor(actor=actor, deployment=d)
    if d.status in PAUSED_OR_PAUSING:
        return d
    if d.status not in PAUSABLE:
        raise Conflict(f"A deployment can be paused while it is on its way to running, running, updating or "
                       f"failed; this one is {d.status}.")
    return deployment_transition(deployment=d, to=Status.PAUSING, actor=actor, event_kind=event_kind,
                                 reason=reason or "Pause requested: the serving part is being removed.")


@transaction.atomic
def deployment_resume(*, actor, deployment: Deployment, event_kind: EventKind = EventKind.RESUMED,
                      reason: str = "Resume requested.") -> Deployment:
    """Bring a paused deployment back: the quota and the budget are checked again (past the budget, only a
    platform admin resumes: it restarts spending), then it provisions and runs as before.

    The generation moves on (as `kubectl rollout restart` does) so that the conformance suite checks this
    rollout before users get it."""
    team = Team.objects.select_for_update(no_key=True).get(pk=deployment.team_id)  # serializes quota checks per team
    d = _locked(deployment)
    if actor is not None:
        _require_editor(actor=actor, deployment=d)
    if d.status != Status.PAUSED:
        raise Conflict(f"Only a paused deployment can be resumed; this one is {d.status}.")
    budget_require_approver(actor=actor, deployment=d, new_spec=d.spec, old_spec=None, action="resume it")
    typed = _recheck(d.spec, d.cluster, d.team)
    quota_check(team=team, gpus=quota_gpus(typed, target_kind=d.cluster.kind), exclude_id=d.pk)
    d.generation += 1
    d.save(update_fields=["generation", "updated_at"])
    return deployment_transition(deployment=d, to=Status.PROVISIONING, actor=actor, reason=reason,
                                 event_kind=event_kind)


def deployment_wake(*, deployment_id: int) -> Deployment | None:
    """A request through the gateway reached a paused deployment that allows it: resume it (once; a deployment
    already on its way back is left alone). A quota that no longer fits, or a team past its budget, is
    recorded, not raised."""
    d = Deployment.objects.select_related("team", "cluster").filter(pk=deployment_id).first()
    if d is None or d.status != Status.PAUSED or not d.wake_on_request:
        return None
    try:
        return deployment_resume(actor=None, deployment=d, event_kind=EventKind.WOKEN,
                                 reason="A request through the gateway woke it.")
    except (QuotaExceeded, Conflict, NotAllowed) as e:
        event_record(kind=EventKind.WAKE_REFUSED, deployment=d, message=f"A request could not wake it: {e}")
        return None


def deployments_pause_idle(*, now: dt.datetime,
                           last_requests: Callable[[list[int]], dict[int, dt.datetime]]) -> list[int]:
    """Pause each running deployment that sets `pause.idle_minutes` and has had no request through the gateway
    for that long, recording why; `last_requests(ids)` says when each last had one (the gateway's records, which
    the domain does not import). Returns the ids paused."""
    paused = []
    candidates = list(Deployment.objects.filter(status=Status.RUNNING, idle_minutes__isnull=False)
                      .select_related("team", "cluster"))
    last_request_at = last_requests([d.pk for d in candidates]) if candidates else {}
    for d in candidates:
        idle = d.idle_minutes
        # Since the last request, or since it started running when none came after that.
        last = max(filter(None, (last_request_at.get(d.pk), d.status_changed_at)))
        if now - last < dt.timedelta(minutes=idle):
            continue
        try:
            deployment_pause(actor=None, deployment=d, event_kind=EventKind.IDLE_PAUSED,
                             reason=f"No request through the gateway for {idle} minutes (since "
                                    f"{last:%Y-%m-%d %H:%M} UTC): paused to stop paying for idle GPUs.")
        except Conflict:  # its status moved on since it was read
            continue
        paused.append(d.pk)
    return paused
