"""Writes to deployments: request, edit, approve, reject, withdraw, retry, update, delete, and the status writer.

Each is one transaction: lock the row, return early when nothing changes, write an audit event, and enqueue
reconcile work with `transaction.on_commit` so a worker never sees uncommitted rows.
"""
from functools import partial

from django.db import IntegrityError, transaction
from django.utils import timezone

from deployments.errors import ActionError, Conflict, NotAllowed, StatusMoved
from deployments.event_kinds import EventKind, status_kind
from deployments.lifecycle import RELEASES, UNSETTLED, UPDATABLE, Status, can_transition, proposal_waits, retry_status
from deployments.model_sources import source_roots_of
from deployments.models import Cluster, Deployment, Team
from deployments.outcomes import Outcome, UpdateOutcome, update_outcome
from deployments.permissions import deployment_may_change, deployment_may_decide, team_role
from deployments.quota_rules import quota_gpus
from deployments.redaction import internal_redact
from deployments.runtime_images import runtime_image_errors
from deployments.services.announcements import route_change_announce
from deployments.services.budgets import budget_require_approver
from deployments.services.cluster_checks import cluster_check_require_clear
from deployments.services.events import event_record
from deployments.services.node_groups import nodegroup_quota_check
from deployments.services.quota import quota_check
from deployments.services.rollouts import (rollout_begin, rollout_end_by_status, rollout_require_none,
                                           rollout_surge_needed)
from deployments.services.spec_store import deployment_proposal_set, deployment_spec_set
from deployments.services.status import deployment_reconcile_request
from deployments.spec import DeploymentSpec, SpecError, name_errors, spec_check, spec_load, spec_parse_field
from deployments.spec_diff import changes_needing_approval


def _enqueue_reconcile(deployment_id: int) -> None:
    deployment_reconcile_request(deployment_id=deployment_id)


def _locked(deployment: Deployment) -> Deployment:
    """The deployment's row, locked; its team and cluster are read, not locked. Whoever needs the team locked (an
    approval, a resume: quota) locks it first, and team locks are FOR NO KEY UPDATE, which an event's foreign key
    to the team does not wait for: approve against withdraw deadlocked on the team row before."""
    return Deployment.objects.select_for_update(of=("self",)).select_related("team", "cluster").get(pk=deployment.pk)


def _validated_spec(data, cluster: Cluster, team: Team) -> DeploymentSpec:
    """The typed spec of a request's `spec`, or a SpecError whose paths start at `spec.` as the request's do; a
    cluster with no image for its runtime is one (deployments.runtime_images)."""
    typed = spec_parse_field(data, target_kind=cluster.kind, source_roots=source_roots_of(cluster=cluster, team=team))
    if problems := runtime_image_errors(cluster=cluster, spec=typed):
        raise SpecError({"spec.runtime": problems})
    return typed


def _recheck(stored: dict, cluster: Cluster, team: Team) -> DeploymentSpec:
    """A stored spec must still pass today's catalog (a runtime found broken since is refused at approval), the
    model sources the cluster allows the team today, and have an image on the cluster."""
    typed = spec_check(spec_load(stored), target_kind=cluster.kind,
                       source_roots=source_roots_of(cluster=cluster, team=team))
    if problems := runtime_image_errors(cluster=cluster, spec=typed):
        raise SpecError({"runtime": problems})
    return typed


def _require_editor(*, actor, deployment: Deployment) -> None:
    if not deployment_may_change(user=actor, deployment=deployment):
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
        errors.update(e.errors)
    if errors:
        raise SpecError(errors)
    quota_check(team=team, gpus=quota_gpus(typed, target_kind=cluster.kind))
    deployment = Deployment(team=team, cluster=cluster, name=name, requested_by=actor, proposed_by=actor,
                            purpose=purpose)
    deployment_spec_set(deployment=deployment, spec=typed)
    try:
        with transaction.atomic():
            deployment.save()
    except IntegrityError:
        raise Conflict(f"Team {team.slug} already has a deployment named {name!r}.", field="name") from None
    event_record(kind=EventKind.REQUESTED, deployment=deployment, actor=actor,
                 after={"name": name, "cluster": cluster.name, "spec": deployment.spec})
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
    quota_check(team=d.team, gpus=quota_gpus(typed, target_kind=d.cluster.kind), exclude_id=d.pk)
    spec_fields = []
    if new_spec != d.spec:
        d.generation += 1
        d.proposed_by = actor  # whoever changed what waits is one of its authors: four-eyes counts them
        spec_fields = deployment_spec_set(deployment=d, spec=typed)
    d.purpose = new_purpose
    d.save(update_fields=[*spec_fields, "purpose", "generation", "proposed_by", "updated_at"])
    event_record(kind=EventKind.EDITED, deployment=d, actor=actor, before=before,
                 after={"spec": new_spec, "purpose": new_purpose})
    return d


def _proposal_waits(d: Deployment) -> bool:
    return d.proposal_open


def _proposal_drop(*, d: Deployment, actor, kind: EventKind, message: str = "") -> None:
    """The proposed update waits no more (rejected, withdrawn, or dropped as the deployment moved): cleared, and
    the event keeps what it was."""
    before = d.proposed_spec
    d.save(update_fields=[*deployment_proposal_set(deployment=d, spec=None, by=None), "updated_at"])
    event_record(kind=kind, deployment=d, actor=actor, message=message, before={"proposed_spec": before})


def _authors(d: Deployment) -> set[int]:
    """Who wrote what waits for a decision: the proposer of an update, or a request's requester and whoever
    edited it since. Read at decision time from the row, so a role change in between changes nothing."""
    if _proposal_waits(d):
        return {d.proposed_by_id}
    return {d.requested_by_id, d.proposed_by_id} - {None}


def _require_approver(*, actor, deployment: Deployment) -> None:
    """Team admins and platform admins decide; nobody decides what they wrote themselves, whatever their role
    is now, unless the team allows self-approval."""
    if not deployment_may_decide(user=actor, deployment=deployment):
        raise NotAllowed(f"Only admins of team {deployment.team.slug} or platform admins can approve or reject.")
    if actor.pk in _authors(deployment) and not deployment.team.allow_self_approval:
        what = "proposed this update" if _proposal_waits(deployment) else "requested or edited this deployment"
        raise NotAllowed(f"You {what}; another admin of the team must approve or reject it.")


def _require_reviewed(*, deployment: Deployment, generation: int, proposed_hash: str | None) -> None:
    """The decision is about what the approver saw: this generation and, for an update, this proposed spec."""
    d = deployment
    if _proposal_waits(d) and not proposed_hash:
        raise ActionError("An update of this deployment is proposed: pass the proposed_spec_hash you reviewed.",
                          field="proposed_spec_hash")
    if generation != d.generation or (proposed_hash and proposed_hash != d.proposed_spec_hash):
        raise Conflict(f"The request changed since you opened it (it is now at generation {d.generation}"
                       f"{', with a different proposed update' if _proposal_waits(d) else ''}). Reload it, review "
                       "what changed and decide again.")


@transaction.atomic
def deployment_approve(*, actor, deployment: Deployment, generation: int, proposed_hash: str | None = None,
                       comment: str = "") -> Deployment:
    """Approve the pending request or the proposed update the approver reviewed (`generation`, and the proposed
    spec's hash), and start the reconciler."""
    team = Team.objects.select_for_update(no_key=True).get(pk=deployment.team_id)  # serializes approvals per team
    d = _locked(deployment)
    _require_approver(actor=actor, deployment=d)
    _require_reviewed(deployment=d, generation=generation, proposed_hash=proposed_hash)
    waits = _proposal_waits(d)
    budget_require_approver(actor=actor, deployment=d, new_spec=d.proposed_spec if waits else d.spec,
                            old_spec=d.spec if waits else None)
    if waits:
        proposed = _recheck(d.proposed_spec, d.cluster, d.team)
        cluster_check_require_clear(actor=actor, cluster=d.cluster, spec=proposed)
        quota_check(team=team, gpus=quota_gpus(proposed, target_kind=d.cluster.kind), exclude_id=d.pk,
                    surge=rollout_surge_needed(deployment=d, old_spec=d.spec_typed, new_spec=proposed))
        rollout_require_none(d)
        before, proposer = d.spec, d.proposed_by
        fields = deployment_spec_set(deployment=d, spec=proposed) + deployment_proposal_set(deployment=d, spec=None,
                                                                                            by=None)
        d.generation += 1
        d.save(update_fields=[*fields, "generation", "updated_at"])
        event_record(kind=EventKind.UPDATE_APPROVED, deployment=d, actor=actor, message=comment,
                     before={"spec": before},
                     after={"spec": d.spec, "proposed_by": proposer.get_username() if proposer else None})
        if d.status == Status.RUNNING:
            rollout_begin(deployment=d, old_spec=spec_load(before), new_spec=d.spec_typed, actor=actor)
        return deployment_transition(deployment=d, to=Status.UPDATING if d.status == Status.RUNNING else Status.APPROVED,
                                     actor=actor, reason="Update approved.")
    if d.status != Status.PENDING_APPROVAL:
        raise Conflict(f"Nothing to approve: the deployment is {d.status}.")
    approved = _recheck(d.spec, d.cluster, d.team)
    cluster_check_require_clear(actor=actor, cluster=d.cluster, spec=approved)
    quota_check(team=team, gpus=quota_gpus(approved, target_kind=d.cluster.kind), exclude_id=d.pk)
    nodegroup_quota_check(cluster=d.cluster, exclude_id=d.pk)
    d.proposed_by = None
    d.save(update_fields=["proposed_by", "updated_at"])
    return deployment_transition(deployment=d, to=Status.APPROVED, actor=actor, reason=comment,
                                 event_kind=EventKind.APPROVED)


@transaction.atomic
def deployment_reject(*, actor, deployment: Deployment, generation: int, proposed_hash: str | None = None,
                      comment: str = "") -> Deployment:
    """Reject the pending request or the proposed update the approver reviewed, with a comment the requester
    sees."""
    d = _locked(deployment)
    _require_approver(actor=actor, deployment=d)
    _require_reviewed(deployment=d, generation=generation, proposed_hash=proposed_hash)
    if _proposal_waits(d):
        _proposal_drop(d=d, actor=actor, kind=EventKind.UPDATE_REJECTED, message=comment)
        return d
    if d.status != Status.PENDING_APPROVAL:
        raise Conflict(f"Nothing to reject: the deployment is {d.status}.")
    return deployment_transition(deployment=d, to=Status.REJECTED, actor=actor, reason=comment,
                                 event_kind=EventKind.REJECTED)


@transaction.atomic
def deployment_withdraw(*, actor, deployment: Deployment) -> Deployment:
    """The requester takes back a pending request (or a proposed update)."""
    d = _locked(deployment)
    _require_editor(actor=actor, deployment=d)
    if _proposal_waits(d):
        _proposal_drop(d=d, actor=actor, kind=EventKind.UPDATE_WITHDRAWN)
        return d
    if d.status != Status.PENDING_APPROVAL:
        raise Conflict(f"Only a pending request can be withdrawn; this one is {d.status}. Delete it instead.")
    return deployment_transition(deployment=d, to=Status.WITHDRAWN, actor=actor, event_kind=EventKind.WITHDRAWN)


@transaction.atomic
def deployment_retry(*, actor, deployment: Deployment) -> Deployment:
    """Start a failed deployment's reconcile again from what exists; one that failed while being deleted is
    deleted again."""
    d = _locked(deployment)
    _require_editor(actor=actor, deployment=d)
    if d.status != Status.FAILED:
        raise Conflict(f"Only a failed deployment can be retried; this one is {d.status}.")
    to = retry_status(delete_requested=d.delete_requested_at is not None)
    return deployment_transition(deployment=d, to=to, actor=actor, event_kind=EventKind.RETRIED,
                                 reason="Retry of the deletion requested." if to == Status.DELETING
                                 else "Retry requested.")


@transaction.atomic
def deployment_update(*, actor, deployment: Deployment, spec: dict | None = None,
                      purpose: str | None = None) -> UpdateOutcome:
    """Change a running or failed deployment. Applied at once only when it changes nothing that costs or that an
    approver judged (deployments.spec_diff); anything else becomes a proposed spec that waits for approval while
    the approved spec keeps running. Says what it did (deployments.outcomes)."""
    d = _locked(deployment)
    _require_editor(actor=actor, deployment=d)
    old_spec, old_purpose = d.spec_typed, d.purpose
    said = partial(update_outcome, before=old_spec, purpose_before=old_purpose)
    if d.status == Status.PENDING_APPROVAL:
        edited = deployment_edit(actor=actor, deployment=d, spec=spec, purpose=purpose)
        changed = (edited.spec, edited.purpose) != (d.spec, old_purpose)
        return said(outcome=Outcome.EDITED if changed else Outcome.UNCHANGED, deployment=edited,
                    after=edited.spec_typed)
    if d.status not in UPDATABLE:
        # Asking for what it already has is no change in any state (a repeated `tandemctl apply`).
        if (purpose is None or purpose == d.purpose) and (
                spec is None or _validated_spec(spec, d.cluster, d.team).to_dict() == d.spec):
            return said(outcome=Outcome.UNCHANGED, deployment=d, after=old_spec)
        rollout_require_none(d)  # the reason it is updating, where that is a rollout
        raise Conflict(f"A deployment can be updated when running or failed; this one is {d.status}.")
    if purpose is not None and purpose != d.purpose:
        before, d.purpose = d.purpose, purpose
        d.save(update_fields=["purpose", "updated_at"])
        event_record(kind=EventKind.PURPOSE_CHANGED, deployment=d, actor=actor, before={"purpose": before},
                     after={"purpose": purpose})
    # While the spec stays as it runs, at most the purpose changed.
    kept = partial(said, outcome=Outcome.UPDATED if d.purpose != old_purpose else Outcome.UNCHANGED, deployment=d,
                   after=old_spec)
    if spec is None:
        return kept()
    typed = _validated_spec(spec, d.cluster, d.team)
    if typed.to_dict() == d.spec:
        return kept()
    needs = changes_needing_approval(old_spec, typed)
    # Applied at once or proposed, it takes the place of what waits for approval: only its own proposer may do that.
    _require_no_other_proposal(actor=actor, d=d)
    if not needs:
        return said(outcome=Outcome.UPDATED, deployment=_update_apply(actor=actor, d=d, new_spec=typed),
                    after=typed)
    if _update_propose(actor=actor, d=d, typed=typed, fields=needs):
        return said(outcome=Outcome.PROPOSED, deployment=d, after=typed)
    return kept()  # the same proposal of theirs already waits


def _require_no_other_proposal(*, actor, d: Deployment) -> None:
    """Someone else's proposed update waits for approval: a change applied at once, or proposed in its place, would
    discard it unseen. Its proposer may replace their own; anyone else (Tandem too: `actor=None`) waits until it is
    decided or withdrawn."""
    proposer = d.proposed_by
    if not _proposal_waits(d) or (actor is not None and proposer.pk == actor.pk):
        return
    who = proposer.get_username()
    raise Conflict(f"{who}'s proposed update of this deployment waits for approval, and your change would "
                   f"discard it. Ask an admin of team {d.team.slug} to approve or reject it (or {who} to withdraw "
                   "it), then apply your change.")


def _update_apply(*, actor, d: Deployment, new_spec: DeploymentSpec, message: str = "") -> Deployment:
    """Apply a change that needs no approval: the new spec runs at the next generation."""
    rollout_require_none(d)
    if surge := rollout_surge_needed(deployment=d, old_spec=d.spec_typed, new_spec=new_spec):
        quota_check(team=d.team, gpus=quota_gpus(new_spec, target_kind=d.cluster.kind), exclude_id=d.pk,
                    surge=surge)
    before, dropped = d.spec, d.proposed_spec
    fields = deployment_spec_set(deployment=d, spec=new_spec) + deployment_proposal_set(deployment=d, spec=None,
                                                                                        by=None)
    d.generation += 1
    d.save(update_fields=[*fields, "generation", "updated_at"])
    if dropped:
        message = " ".join(filter(None, [message, "Replaces the update that was waiting for approval."]))
    event_record(kind=EventKind.UPDATED, deployment=d, actor=actor, before={"spec": before, "proposed_spec": dropped},
                 after={"spec": d.spec}, message=message)
    if d.status == Status.RUNNING:
        rollout_begin(deployment=d, old_spec=spec_load(before), new_spec=new_spec, actor=actor)
    to = Status.UPDATING if d.status == Status.RUNNING else Status.APPROVED
    return deployment_transition(deployment=d, to=to, actor=actor, reason="Update applied.")


@transaction.atomic
def deployment_update_by_tandem(*, deployment: Deployment, spec: DeploymentSpec, reason: str) -> Deployment:
    """Tandem applies a change of its own (an accepted recommendation, for a team that allows it): only to a
    running deployment and only within what was approved; anything needing an approver is refused."""
    d = _locked(deployment)
    if d.status != Status.RUNNING:
        raise Conflict(f"Tandem changes only a running deployment; this one is {d.status}.")
    typed = _recheck(spec.to_dict(), d.cluster, d.team)
    if needs := changes_needing_approval(d.spec_typed, typed):
        raise NotAllowed(f"Changes {', '.join(needs)}: beyond what was approved, so only a person may ask for it.")
    if typed.to_dict() == d.spec:
        return d
    _require_no_other_proposal(actor=None, d=d)
    return _update_apply(actor=None, d=d, new_spec=typed, message=reason)


def _update_propose(*, actor, d: Deployment, typed: DeploymentSpec, fields: list[str]) -> bool:
    """Keep the approved spec running; the change waits as the proposed spec, its author recorded. False: this
    proposal of theirs waits already."""
    new_spec = typed.to_dict()
    if d.proposed_spec == new_spec and d.proposed_by_id == actor.pk:
        return False
    gpus, now = quota_gpus(typed, target_kind=d.cluster.kind), d.quota_gpus
    if gpus > now:
        quota_check(team=d.team, gpus=gpus, exclude_id=d.pk)
    d.save(update_fields=[*deployment_proposal_set(deployment=d, spec=new_spec, by=actor), "updated_at"])
    event_record(kind=EventKind.UPDATE_REQUESTED, deployment=d, actor=actor, before={"spec": d.spec},
                 after={"proposed_spec": new_spec, "needs_approval": fields},
                 message=f"Changes {', '.join(fields)}: waiting for approval; the approved spec keeps running.")
    return True


@transaction.atomic
def deployment_delete(*, actor, deployment: Deployment) -> Deployment:
    """Tear a deployment down (or withdraw it while it is still a request)."""
    d = _locked(deployment)
    _require_editor(actor=actor, deployment=d)
    if d.status == Status.PENDING_APPROVAL:
        return deployment_transition(deployment=d, to=Status.WITHDRAWN, actor=actor, event_kind=EventKind.WITHDRAWN)
    if d.status == Status.DELETING:
        return d
    if not can_transition(d.status, Status.DELETING):
        raise Conflict(f"The deployment is already {d.status}.")
    return deployment_transition(deployment=d, to=Status.DELETING, actor=actor, event_kind=EventKind.DELETE_REQUESTED)


def deployment_transition(*, deployment: Deployment, to: str, actor=None, reason: str = "",
                          event_kind: EventKind | None = None, expected: str | None = None) -> Deployment:
    """The only writer of `status`: lock, no-op when unchanged, refuse what the state machine forbids,
    record an event, tell the gateways (a status change opens or closes the endpoint) and enqueue the reconciler
    when there is work left.

    `expected`: the status the caller acted on (a reconcile pass's). When someone moved the deployment since (a
    pause, a delete), StatusMoved and nothing is written: the pass must not act on what it read."""
    with transaction.atomic():
        d = _locked(deployment)
        if expected is not None and d.status != expected:
            raise StatusMoved(f"The deployment is {d.status} now, not {expected}: it was not moved to {to}.")
        if actor is None:  # the reconciler's words, often a driver's: members read them (deployments.redaction)
            reason = internal_redact(reason, cluster=d.cluster)
        if d.status == to and d.status_reason == reason:
            return d
        delete_requested = d.delete_requested_at is not None
        if d.status != to and not can_transition(d.status, to, delete_requested=delete_requested):
            raise Conflict(f"A deployment cannot go from {d.status} to {to}"
                           + ("; its deletion was requested, so it can only be deleted (a retry deletes it again)."
                              if delete_requested else "."))
        before = {"status": d.status, "reason": d.status_reason}
        if d.status != to:  # a new start: its own serving deadline, and nothing released yet
            d.serve_deadline_at = d.released_at = None
        d.status, d.status_reason = to, reason
        d.status_changed_at = timezone.now()
        if to == Status.DELETING and not delete_requested:
            d.delete_requested_at = d.status_changed_at
        d.save(update_fields=["status", "status_reason", "status_changed_at", "delete_requested_at",
                              "serve_deadline_at", "released_at", "updated_at"])
        event_record(kind=event_kind or status_kind(to), deployment=d, actor=actor, message=reason,
                     before=before, after={"status": to, "reason": reason})
        if d.proposed_spec is not None and not proposal_waits(status=to, proposed=True):
            _proposal_drop(d=d, actor=actor, kind=EventKind.UPDATE_WITHDRAWN,
                           message=f"Dropped: the deployment is {to} now, where an update cannot be decided; ask "
                                   "for it again once it runs.")
        rollout_end_by_status(deployment=d, actor=actor)
        route_change_announce(deployment=d)
        if to in UNSETTLED or (to in RELEASES and d.released_at is None):
            _enqueue_reconcile(d.pk)
    return d
