"""What a request or an update of a deployment would do, without doing it: the server-side dry run behind
`POST /api/v1/deployments/preview/`, `POST /api/v1/deployments/<id>/preview/` and `tandemctl diff`.

A preview runs the real service (deployments.services.actions: spec parsing, model sources, quota, what needs
approval) inside a transaction it then rolls back, so there is one place for each rule and a preview refuses
exactly what the write would refuse, with the same error. What it reports is read from the rows as the write
left them, before the rollback. Nothing is kept: no row, no generation, no event, and no reconcile request (a
`transaction.on_commit` registered inside a rolled-back block is discarded).
"""
from dataclasses import asdict, dataclass

from django.db import models, transaction

from deployments.lifecycle import Status
from deployments.models import Cluster, Deployment, Team
from deployments.quota_rules import quota_gpus
from deployments.services.actions import _locked, deployment_request, deployment_update
from deployments.spec import DeploymentSpec, spec_load
from deployments.spec_diff import FieldChange, spec_changes, spec_created, spec_hourly_cost


class Outcome(models.TextChoices):
    CREATED = "created"  # a new request, waiting for approval
    UNCHANGED = "unchanged"  # nothing to do (a repeated apply)
    EDITED = "edited"  # the pending request changes; it still waits for approval
    UPDATED = "updated"  # applied at once: nothing in it needs an approver
    PROPOSED = "proposed"  # a proposed update waits for approval; the approved spec keeps running


@dataclass(frozen=True)
class Preview:
    """What the write would do: its outcome, each changed field old → new (and whether it needs an approver), the
    deployment's status and generation after it, cost per hour and GPUs against quota before and after."""

    outcome: str
    waits_for_approval: bool
    status: str
    generation: int
    changes: list[dict]
    hourly_usd_before: float | None
    hourly_usd_after: float | None
    gpus_before: int
    gpus_after: int


def _hourly(spec: DeploymentSpec) -> float | None:
    cost = spec_hourly_cost(spec)
    return None if cost is None else round(cost, 3)


def deployment_request_preview(*, actor, team: Team, cluster: Cluster, name: str, spec: dict,
                               purpose: str = "") -> Preview:
    """What deployment_request would do with these arguments; nothing is kept."""
    with transaction.atomic():
        d = deployment_request(actor=actor, team=team, cluster=cluster, name=name, spec=spec, purpose=purpose)
        typed = d.spec_typed
        changes = spec_created(typed) + ([FieldChange("purpose", None, d.purpose, True)] if d.purpose else [])
        preview = Preview(outcome=Outcome.CREATED, waits_for_approval=True, status=d.status, generation=d.generation,
                          changes=[asdict(c) for c in changes], hourly_usd_before=0.0, hourly_usd_after=_hourly(typed),
                          gpus_before=0, gpus_after=quota_gpus(typed, target_kind=cluster.kind))
        transaction.set_rollback(True)
    return preview


def _outcome(before: Deployment, after: Deployment) -> str:
    if before.status == Status.PENDING_APPROVAL:
        edited = (after.spec, after.purpose) != (before.spec, before.purpose)
        return Outcome.EDITED if edited else Outcome.UNCHANGED
    if after.proposed_spec is not None and (after.proposed_spec, after.proposed_by_id) != (
            before.proposed_spec, before.proposed_by_id):
        return Outcome.PROPOSED
    if after.generation != before.generation or after.purpose != before.purpose:
        return Outcome.UPDATED
    return Outcome.UNCHANGED


def deployment_update_preview(*, actor, deployment: Deployment, spec: dict | None = None,
                              purpose: str | None = None) -> Preview:
    """What deployment_update would do with these arguments (an edit, an update applied at once, a proposed
    update, or nothing); nothing is kept."""
    with transaction.atomic():
        before = _locked(deployment)  # as the update locks it: nothing changes it between the two reads
        deployment_update(actor=actor, deployment=deployment, spec=spec, purpose=purpose)
        after = Deployment.objects.select_related("cluster").get(pk=deployment.pk)
        outcome = _outcome(before, after)
        old = before.spec_typed
        new = spec_load(after.proposed_spec) if outcome == Outcome.PROPOSED else after.spec_typed
        request_waits = after.status == Status.PENDING_APPROVAL  # all of a pending request waits for its approval
        changes = [FieldChange(c.field, c.old, c.new, c.needs_approval or request_waits)
                   for c in spec_changes(old, new)]
        if after.purpose != before.purpose:
            changes.append(FieldChange("purpose", before.purpose, after.purpose, request_waits))
        preview = Preview(outcome=outcome, waits_for_approval=request_waits or after.proposed_spec is not None,
                          status=after.status, generation=after.generation, changes=[asdict(c) for c in changes],
                          hourly_usd_before=_hourly(old), hourly_usd_after=_hourly(new),
                          gpus_before=before.quota_gpus, gpus_after=quota_gpus(new, target_kind=after.cluster.kind))
        transaction.set_rollback(True)
    return preview
