"""What a write to a deployment did, as the write itself says it: previews, the portal and recommendations read
this instead of reading the row back to work out what happened."""
from dataclasses import dataclass

from django.db import models

from deployments.lifecycle import Status
from deployments.models import Deployment
from deployments.spec import DeploymentSpec
from deployments.spec_diff import FieldChange, spec_changes


class Outcome(models.TextChoices):
    CREATED = "created"  # a new request, waiting for approval
    UNCHANGED = "unchanged"  # nothing to do (a repeated apply)
    EDITED = "edited"  # the pending request changes; it still waits for approval
    UPDATED = "updated"  # applied at once: nothing in it needs an approver
    PROPOSED = "proposed"  # a proposed update waits for approval; the approved spec keeps running


@dataclass(frozen=True)
class UpdateOutcome:
    """What deployment_update did: the deployment as it left it, the spec before and the spec the change is about
    (the proposed one of a proposal; the spec before when no spec changed), and each changed field old → new with
    whether it needs an approver."""

    outcome: Outcome
    deployment: Deployment
    before: DeploymentSpec
    after: DeploymentSpec
    changes: tuple[FieldChange, ...]

    @property
    def waits_for_approval(self) -> bool:
        """A request waits as a whole; a running or failed deployment while a proposed update of it does."""
        return self.deployment.awaits_approval


def update_outcome(*, outcome: Outcome, deployment: Deployment, before: DeploymentSpec, after: DeploymentSpec,
                   purpose_before: str) -> UpdateOutcome:
    """The outcome of an update of `deployment` (as the update left it) from `before` to `after`; every change of
    a pending request needs its approval, as all of the request waits for it."""
    request_waits = deployment.status == Status.PENDING_APPROVAL
    changes = [FieldChange(c.field, c.old, c.new, c.needs_approval or request_waits)
               for c in spec_changes(before, after)]
    if deployment.purpose != purpose_before:
        changes.append(FieldChange("purpose", purpose_before, deployment.purpose, request_waits))
    return UpdateOutcome(outcome=outcome, deployment=deployment, before=before, after=after, changes=tuple(changes))
