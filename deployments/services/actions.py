"""Writes to deployments: request, edit, approve, reject, withdraw, retry, update, delete, and the status writer.

Each is one transaction: lock the row, return early when nothing changes, write an audit event, and enqueue
reconcile work with `transaction.on_commit` so a worker never sees uncommitted rows.
"""
from django.db import IntegrityError, transaction
from django.utils import timezone

from deployments.errors import Conflict, NotAllowed
from deployments.lifecycle import UNSETTLED, UPDATABLE, Status, can_transition
from deployments.model_sources import source_roots_of
from deployments.models import Cluster, Deployment, Membership, Team
from deployments.services.events import event_record
from deployments.services.quota import quota_check
from deployments.services.status import deployment_reconcile_request
from deployments.services.teams import is_platform_admin, team_role
from deployments.spec import DeploymentSpec, SpecError, name_errors, spec_check, spec_load, spec_parse


def _enqueue_reconcile(deployment_id: int) -> None:
    deployment_reconcile_request(deployment_id=deployment_id)


def _locked(deployment: Deployment) -> Deployment:
    return Deployment.objects.select_for_update().select_related("team", "cluster").get(pk=deployment.pk)


def _validated_spec(data, cluster: Cluster, team: Team) -> DeploymentSpec:
    return spec_parse(data, target_kind=cluster.kind, source_roots=source_roots_of(cluster=cluster, team=team))


def _recheck(stored: dict, cluster: Cluster, team: Team) -> DeploymentSpec:
    """A stored spec must still pass today's catalog (a runtime found broken since is refused at approval) and
    the model sources the cluster allows the team today."""
    return spec_check(spec_load(stored), target_kind=cluster.kind,
                      source_roots=source_roots_of(cluster=cluster, team=team))


def _require_editor(*, actor, deployment: Deployment) -> None:
    if actor != deployment.requested_by and team_role(user=actor, team=deployment.team) != Membership.Role.ADMIN:
        raise NotAllowed("Only the requester or an admin of the team can change this deployment.")


@transaction.atomic
def deployment_request(*, actor, team: Team, cluster: Cluster, name: str, spec: dict, purpose: str = "") -> Deployment:
    """A team member asks for a deployment; it waits for approval."""
    if team_role(user=actor, team=team) is None:
        raise NotAllowed(f"You are not a member of team {team.slug}.")
    errors = {}
    if problems := name_errors(name):
        errors["name"] = problems
    try:
        typed = _validated_spec(spec, cluster, team)
    except SpecError as e:
        errors.update({f"spec.{k}": v for k, v in e.errors.items()})
    if errors:
        raise SpecError(errors)
    quota_check(team=team, gpus=typed.gpus)
    parsed = typed.to_dict()
    try:
        with transaction.atomic():
            deployment = Deployment.objects.create(
                team=team, cluster=cluster, name=name, requested_by=actor, spec=parsed, purpose=purpose
            )
    except IntegrityError:
        raise Conflict(f"Team {team.slug} already has a deployment named {name!r}.", field="name") from None
    event_record(kind="requested", deployment=deployment, actor=actor,
                 after={"name": name, "cluster": cluster.name, "spec": parsed})
    return deployment


@transaction.atomic
def deployment_edit(*, actor, deployment: Deployment, spec: dict | None = None, purpose: str | None = None) -> Deployment:
    """Change a request that is still waiting for approval."""
    d = _locked(deployment)
    _require_editor(actor=actor, deployment=d)
    if d.status != Status.PENDING_APPROVAL:
        raise Conflict(f"Only a pending request can be edited; this one is {d.status}. "
                       "Ask for an update instead.")
    before = {"spec": d.spec, "purpose": d.purpose}
    typed = d.spec_typed if spec is None else _validated_spec(spec, d.cluster, d.team)
    new_spec = d.spec if spec is None else typed.to_dict()
    new_purpose = d.purpose if purpose is None else purpose
    if new_spec == d.spec and new_purpose == d.purpose:
        return d
    quota_check(team=d.team, gpus=typed.gpus, exclude_id=d.pk)
    if new_spec != d.spec:
        d.generation += 1
    d.spec, d.purpose = new_spec, new_purpose
    d.save(update_fields=["spec", "purpose", "generation", "updated_at"])
    event_record(kind="edited", deployment=d, actor=actor, before=before, after={"spec": new_spec, "purpose": new_purpose})
    return d


def _require_approver(*, actor, deployment: Deployment) -> None:
    if is_platform_admin(actor):
        return
    if team_role(user=actor, team=deployment.team) != Membership.Role.ADMIN:
        raise NotAllowed(f"Only admins of team {deployment.team.slug} or platform admins can approve or reject.")
    if actor == deployment.requested_by and not deployment.team.allow_self_approval:
        raise NotAllowed("You requested this deployment; another admin of the team must approve or reject it.")


@transaction.atomic
def deployment_approve(*, actor, deployment: Deployment, comment: str = "") -> Deployment:
    """Approve a pending request (or a proposed update that needs more GPUs) and start the reconciler."""
    team = Team.objects.select_for_update().get(pk=deployment.team_id)  # serializes approvals per team
    d = _locked(deployment)
    _require_approver(actor=actor, deployment=d)
    if d.proposed_spec is not None and d.status in UPDATABLE:
        proposed = _recheck(d.proposed_spec, d.cluster, d.team)
        quota_check(team=team, gpus=proposed.gpus, exclude_id=d.pk)
        before = d.spec
        d.spec, d.proposed_spec, d.generation = d.proposed_spec, None, d.generation + 1
        d.save(update_fields=["spec", "proposed_spec", "generation", "updated_at"])
        event_record(kind="update_approved", deployment=d, actor=actor, message=comment, before={"spec": before},
                     after={"spec": d.spec})
        return deployment_transition(deployment=d, to=Status.UPDATING if d.status == Status.RUNNING else Status.APPROVED,
                                     actor=actor, reason="Update approved.")
    if d.status != Status.PENDING_APPROVAL:
        raise Conflict(f"Nothing to approve: the deployment is {d.status}.")
    approved = _recheck(d.spec, d.cluster, d.team)
    quota_check(team=team, gpus=approved.gpus, exclude_id=d.pk)
    return deployment_transition(deployment=d, to=Status.APPROVED, actor=actor, reason=comment, event_kind="approved")


@transaction.atomic
def deployment_reject(*, actor, deployment: Deployment, comment: str = "") -> Deployment:
    """Reject a pending request or a proposed update, with a comment the requester sees."""
    d = _locked(deployment)
    _require_approver(actor=actor, deployment=d)
    if d.proposed_spec is not None and d.status != Status.PENDING_APPROVAL:
        before, d.proposed_spec = d.proposed_spec, None
        d.save(update_fields=["proposed_spec", "updated_at"])
        event_record(kind="update_rejected", deployment=d, actor=actor, message=comment, before={"proposed_spec": before})
        return d
    if d.status != Status.PENDING_APPROVAL:
        raise Conflict(f"Nothing to reject: the deployment is {d.status}.")
    return deployment_transition(deployment=d, to=Status.REJECTED, actor=actor, reason=comment, event_kind="rejected")


@transaction.atomic
def deployment_withdraw(*, actor, deployment: Deployment) -> Deployment:
    """The requester takes back a pending request (or a proposed update)."""
    d = _locked(deployment)
    _require_editor(actor=actor, deployment=d)
    if d.proposed_spec is not None and d.status != Status.PENDING_APPROVAL:
        before, d.proposed_spec = d.proposed_spec, None
        d.save(update_fields=["proposed_spec", "updated_at"])
        event_record(kind="update_withdrawn", deployment=d, actor=actor, before={"proposed_spec": before})
        return d
    if d.status != Status.PENDING_APPROVAL:
        raise Conflict(f"Only a pending request can be withdrawn; this one is {d.status}. Delete it instead.")
    return deployment_transition(deployment=d, to=Status.WITHDRAWN, actor=actor, event_kind="withdrawn")


@transaction.atomic
def deployment_retry(*, actor, deployment: Deployment) -> Deployment:
    """Start a failed deployment's reconcile again from what exists."""
    d = _locked(deployment)
    _require_editor(actor=actor, deployment=d)
    if d.status != Status.FAILED:
        raise Conflict(f"Only a failed deployment can be retried; this one is {d.status}.")
    return deployment_transition(deployment=d, to=Status.APPROVED, actor=actor, reason="Retry requested.",
                                 event_kind="retried")


@transaction.atomic
def deployment_update(*, actor, deployment: Deployment, spec: dict) -> Deployment:
    """Change a running deployment: applied at once unless it needs more GPUs, which goes back to approval."""
    d = _locked(deployment)
    _require_editor(actor=actor, deployment=d)
    if d.status == Status.PENDING_APPROVAL:
        return deployment_edit(actor=actor, deployment=d, spec=spec)
    if d.status not in UPDATABLE:
        raise Conflict(f"A deployment can be updated when running or failed; this one is {d.status}.")
    typed = _validated_spec(spec, d.cluster, d.team)
    new_spec = typed.to_dict()
    if new_spec == d.spec:
        return d
    if typed.gpus > d.spec_typed.gpus:
        quota_check(team=d.team, gpus=typed.gpus, exclude_id=d.pk)
        d.proposed_spec = new_spec
        d.save(update_fields=["proposed_spec", "updated_at"])
        event_record(kind="update_requested", deployment=d, actor=actor, before={"spec": d.spec},
                     after={"proposed_spec": new_spec},
                     message=f"Needs {typed.gpus} GPUs (now {d.spec_typed.gpus}): waiting for approval.")
        return d
    before = d.spec
    d.spec, d.proposed_spec, d.generation = new_spec, None, d.generation + 1
    d.save(update_fields=["spec", "proposed_spec", "generation", "updated_at"])
    event_record(kind="updated", deployment=d, actor=actor, before={"spec": before}, after={"spec": new_spec})
    to = Status.UPDATING if d.status == Status.RUNNING else Status.APPROVED
    return deployment_transition(deployment=d, to=to, actor=actor, reason="Update applied.")


@transaction.atomic
def deployment_delete(*, actor, deployment: Deployment) -> Deployment:
    """Tear a deployment down (or withdraw it while it is still a request)."""
    d = _locked(deployment)
    _require_editor(actor=actor, deployment=d)
    if d.status == Status.PENDING_APPROVAL:
        return deployment_transition(deployment=d, to=Status.WITHDRAWN, actor=actor, event_kind="withdrawn")
    if d.status == Status.DELETING:
        return d
    if not can_transition(d.status, Status.DELETING):
        raise Conflict(f"The deployment is already {d.status}.")
    return deployment_transition(deployment=d, to=Status.DELETING, actor=actor, event_kind="delete_requested")


def deployment_transition(*, deployment: Deployment, to: str, actor=None, reason: str = "",
                          event_kind: str | None = None) -> Deployment:
    """The only writer of `status`: lock, no-op when unchanged, refuse what the state machine forbids,
    record an event and enqueue the reconciler when there is work left."""
    with transaction.atomic():
        d = _locked(deployment)
        if d.status == to and d.status_reason == reason:
            return d
        if d.status != to and not can_transition(d.status, to):
            raise Conflict(f"A deployment cannot go from {d.status} to {to}.")
        before = {"status": d.status, "reason": d.status_reason}
        d.status, d.status_reason = to, reason
        d.status_changed_at = timezone.now()
        d.save(update_fields=["status", "status_reason", "status_changed_at", "updated_at"])
        event_record(kind=event_kind or f"status_{to}", deployment=d, actor=actor, message=reason,
                     before=before, after={"status": to, "reason": reason})
        if to in UNSETTLED:
            _enqueue_reconcile(d.pk)
    return d
