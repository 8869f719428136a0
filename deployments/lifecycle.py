"""The deployment state machine, as data. `services.lifecycle.deployment_transition` is its only writer."""
from django.db import models


class Status(models.TextChoices):
    PENDING_APPROVAL = "pending_approval"
    APPROVED = "approved"
    REJECTED = "rejected"
    WITHDRAWN = "withdrawn"
    PROVISIONING = "provisioning"
    RUNNING = "running"
    UPDATING = "updating"
    FAILED = "failed"
    DELETING = "deleting"
    DELETED = "deleted"


S = Status
TRANSITIONS: dict[str, frozenset[str]] = {
    S.PENDING_APPROVAL: frozenset({S.APPROVED, S.REJECTED, S.WITHDRAWN}),
    S.APPROVED: frozenset({S.PROVISIONING, S.FAILED, S.DELETING}),
    S.PROVISIONING: frozenset({S.RUNNING, S.FAILED, S.DELETING}),
    # running → provisioning: the app vanished out-of-band and the reconciler re-deploys it.
    S.RUNNING: frozenset({S.UPDATING, S.PROVISIONING, S.FAILED, S.DELETING}),
    S.UPDATING: frozenset({S.RUNNING, S.FAILED, S.DELETING}),
    # failed → approved is a retry: the reconciler starts again from what exists.
    S.FAILED: frozenset({S.APPROVED, S.DELETING}),
    S.DELETING: frozenset({S.DELETED, S.FAILED}),
    S.REJECTED: frozenset(),
    S.WITHDRAWN: frozenset(),
    S.DELETED: frozenset(),
}
TERMINAL = frozenset(s for s, nxt in TRANSITIONS.items() if not nxt)
# Statuses a reconciler still has work for (the beat job re-enqueues these).
UNSETTLED = frozenset({S.APPROVED, S.PROVISIONING, S.UPDATING, S.DELETING})
# Statuses whose deployments hold GPUs against the team's quota.
HOLDS_QUOTA = frozenset({S.APPROVED, S.PROVISIONING, S.RUNNING, S.UPDATING, S.FAILED, S.DELETING})


def can_transition(current: str, new: str) -> bool:
    return new in TRANSITIONS[current]
