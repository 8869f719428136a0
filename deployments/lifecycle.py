"""The deployment state machine, as data, and every set of statuses derived from it.

`services.actions.deployment_transition` is the state machine's only writer. Every other module that asks
"is this deployment serving / settled / holding quota / ..." imports the set from here; the gateway's SQL
receives these sets as query parameters, never as literals.
"""
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
    PAUSING = "pausing"
    PAUSED = "paused"


S = Status
TRANSITIONS: dict[str, frozenset[str]] = {
    S.PENDING_APPROVAL: frozenset({S.APPROVED, S.REJECTED, S.WITHDRAWN}),
    # approved/provisioning/updating → pausing: stop paying for what is on its way (an EKS node group can wait a
    # long time for GPU capacity, billing); a pass in flight cannot undo it (workers.pipeline, `_move`).
    S.APPROVED: frozenset({S.PROVISIONING, S.FAILED, S.DELETING, S.PAUSING}),
    S.PROVISIONING: frozenset({S.RUNNING, S.FAILED, S.DELETING, S.PAUSING}),
    # running → provisioning: the app vanished out-of-band and the reconciler re-deploys it.
    S.RUNNING: frozenset({S.UPDATING, S.PROVISIONING, S.FAILED, S.DELETING, S.PAUSING}),
    S.UPDATING: frozenset({S.RUNNING, S.FAILED, S.DELETING, S.PAUSING}),
    # failed → approved is a retry: the reconciler starts again from what exists (failed → deleting, when it failed
    # on its way out: see DELETION).
    S.FAILED: frozenset({S.APPROVED, S.DELETING, S.PAUSING}),
    # Pausing tears the serving part down (deployments.services.pause); paused → provisioning is a resume, which
    # reconciles back to running as a new deployment does.
    S.PAUSING: frozenset({S.PAUSED, S.FAILED, S.DELETING}),
    S.PAUSED: frozenset({S.PROVISIONING, S.DELETING}),
    S.DELETING: frozenset({S.DELETED, S.FAILED}),
    S.REJECTED: frozenset(),
    S.WITHDRAWN: frozenset(),
    S.DELETED: frozenset(),
}
ALL = frozenset(S)
# Gone for good: nothing runs, the name can be reused, the gateway and key scopes ignore it.
TERMINAL = frozenset(s for s, nxt in TRANSITIONS.items() if not nxt)
# Not yet gone (the complement of TERMINAL): what the gateway routes by model id and a key may be scoped to. A
# paused deployment is live: its name, keys and endpoint stay, and the gateway answers it with a 503 that says
# how to resume it.
LIVE = ALL - TERMINAL
# The reconciler still has work to do: each status change into one of these enqueues a pass.
UNSETTLED = frozenset({S.APPROVED, S.PROVISIONING, S.UPDATING, S.DELETING, S.PAUSING})
# On its way to a settled status: with no status change for TANDEM_STUCK_AFTER_SECONDS it is failed as stuck (a
# deletion is not: failing it would leave what it created behind; a running deployment serves, nothing is stuck).
PROGRESSING = UNSETTLED - {S.DELETING}
# What beat's resync reconciles: the unsettled ones, and running ones (to notice drift such as an app removed
# out-of-band).
RECONCILED = UNSETTLED | {S.RUNNING}
# A reconcile pass has nothing to do for these and stops at once (a paused deployment among them: nothing of it
# runs, so there is no drift to notice).
SETTLED = ALL - RECONCILED
# Serve answers for these: the gateway routes traffic, the API shows the endpoint, metrics are scraped.
SERVING = frozenset({S.RUNNING, S.UPDATING})
SCRAPED = SERVING
# The deployment's GPUs count against the team's quota (while pausing too: its nodes are still there; once paused,
# it holds none and a resume checks the quota again).
HOLDS_QUOTA = frozenset({S.APPROVED, S.PROVISIONING, S.RUNNING, S.UPDATING, S.FAILED, S.DELETING, S.PAUSING})
# Nodes are (or may still be) provisioned for it: the cost report counts these intervals as node-hours, until a
# failed one's are released (below).
BILLED = HOLDS_QUOTA - {S.APPROVED}
# Nothing keeps running, and billing, for a deployment in these: whatever took it there (a cause no driver named,
# a deadline, a stuck pass, a refused manifest), the reconciler then releases what it runs on (as a pause does:
# node groups to zero nodes, kept for a retry; the RayService or Ray application removed) and records how long it
# ran and what that cost (`Deployment.released_at`; workers.pipeline). A retry brings it back.
RELEASES = frozenset({S.FAILED})
# Whoever may change the deployment may pause these: what holds quota and is not already leaving (on its way to
# running, running, updating, or failed: pausing frees what it holds).
PAUSABLE = frozenset(s for s in TRANSITIONS if S.PAUSING in TRANSITIONS[s])
# Paused, or on its way there: asking for a pause again changes nothing.
PAUSED_OR_PAUSING = frozenset({S.PAUSING, S.PAUSED})
# A rollout of an update cannot go on (deployments.services.rollouts): it ends where the deployment stops serving.
ROLLOUT_ENDS = frozenset({S.PAUSING, S.PAUSED, S.DELETING, S.DELETED, S.FAILED})
# On the way to running (after an approval, a retry or a resume): how long that takes is its ready estimate.
STARTING = frozenset({S.APPROVED, S.PROVISIONING})
# Runs on its cluster's nodes, or is about to: what the preflight measures a cluster's limits (vCPU quotas, the
# instance types its zone offers) against, beside what waits for approval. Failed and paused deployments wait for
# someone to retry or resume them.
WANTS_NODES = STARTING | SERVING
# A spec change is accepted: a pending request is edited, a running or failed one is updated.
EDITABLE = frozenset({S.PENDING_APPROVAL, S.RUNNING, S.FAILED})
UPDATABLE = EDITABLE - {S.PENDING_APPROVAL}
# A proposed update of the approved spec is decided (approved, rejected or withdrawn) only in these. The status
# writer drops one when the deployment leaves them: a deployment on its way out, pausing or starting again has
# nothing an approver could approve, and the proposal would wait in the queue for ever.
DECIDES_PROPOSAL = UPDATABLE
# Once its deletion was asked for (`Deployment.delete_requested_at`), a deployment only goes on out: a deletion that
# failed is retried as a deletion, never back to provisioning, an update or a pause (and a resume over the quota).
DELETION = frozenset({S.DELETING, S.DELETED, S.FAILED})


def can_transition(current: str, new: str, *, delete_requested: bool = False) -> bool:
    return new in TRANSITIONS[current] and (not delete_requested or new in DELETION)


def retry_status(*, delete_requested: bool) -> str:
    """Where a retry of a failed deployment goes: back to deleting when it failed on its way out, else to approved
    (the reconciler starts again from what exists)."""
    return S.DELETING if delete_requested else S.APPROVED


def proposal_waits(*, status: str, proposed: bool) -> bool:
    """A proposed update waits for an approver (stored as `Deployment.proposal_open`, which the approvals queue
    reads): there is one, and the deployment is where it can be decided."""
    return proposed and status in DECIDES_PROPOSAL


# What a deployment on its way back (resumed, woken, retried) is expected to take to serve when it has no history
# to go by: the ready estimate's default (deployments.cost) and the gateway's Retry-After (gateway.wake).
DEFAULT_READY_SECONDS = 300
