"""Every kind of audit event, declared once, with the words the portal's timeline shows for it.

`services.events.event_record` (the audit trail's only writer) takes an `EventKind` and refuses anything else;
the API publishes the enum for `Event.kind` and its `?kind=` filter. Kinds are stored in rows and read by
clients: a kind is added here, never renamed (tests/deployments/test_one_source.py checks every writer).
"""
from django.db import models

from deployments.lifecycle import Status


class EventKind(models.TextChoices):
    # What people ask of a deployment (deployments.services.actions, .pause).
    REQUESTED = "requested", "Requested"
    EDITED = "edited", "Request edited"
    APPROVED = "approved", "Approved"
    REJECTED = "rejected", "Rejected"
    WITHDRAWN = "withdrawn", "Withdrawn"
    RETRIED = "retried", "Retry requested"
    DELETE_REQUESTED = "delete_requested", "Deletion requested"
    UPDATE_REQUESTED = "update_requested", "Update requested"
    UPDATE_APPROVED = "update_approved", "Update approved"
    UPDATE_REJECTED = "update_rejected", "Update rejected"
    UPDATE_WITHDRAWN = "update_withdrawn", "Update withdrawn"
    UPDATED = "updated", "Updated"
    PURPOSE_CHANGED = "purpose_changed", "Purpose changed"
    PAUSE_REQUESTED = "pause_requested", "Pause requested"
    RESUMED = "resumed", "Resume requested"
    CONFORMANCE_REQUESTED = "conformance_requested", "Conformance run requested"
    RECOMMENDATION_ACCEPTED = "recommendation_accepted", "Recommendation accepted"

    # What Tandem does to a deployment on its own (pause, advice, conformance).
    IDLE_PAUSED = "idle_paused", "Paused for idleness"
    WOKEN = "woken", "Woken by a request"
    WAKE_REFUSED = "wake_refused", "Wake refused"
    RECOMMENDATION_AUTO_APPLIED = "recommendation_auto_applied", "Recommendation applied by Tandem"
    RECOMMENDATION_NOT_APPLIED = "recommendation_not_applied", "Recommendation not applied by Tandem"
    CONFORMANCE_PASSED = "conformance_passed", "Conformance passed"
    CONFORMANCE_WARNING = "conformance_warning", "Conformance warning"
    CONFORMANCE_REQUEUED = "conformance_requeued", "Conformance run started again"

    # Rollouts of an update (deployments.services.rollouts): started with the verdict, each step, how it ended.
    ROLLOUT_STARTED = "rollout_started", "Rollout started"
    ROLLOUT_STEP = "rollout_step", "Rollout step"
    ROLLOUT_PAUSED = "rollout_paused", "Rollout paused"
    ROLLOUT_RESUMED = "rollout_resumed", "Rollout resumed"
    ROLLOUT_ABORTED = "rollout_aborted", "Rollout aborted"
    ROLLOUT_ROLLED_BACK = "rollout_rolled_back", "Rollout rolled back"
    ROLLOUT_DONE = "rollout_done", "Rollout done"

    # A dead replica (workers.pipeline): Serve running again after it, a decode whose KV reads from prefill all
    # fail restarted, KV moving again; each with how long it took.
    SERVE_RECOVERED = "serve_recovered", "Serving again"
    DECODE_RESTARTED = "decode_restarted", "Decode restarted"
    KV_RECOVERED = "kv_recovered", "KV transfer recovered"

    # Why a deployment does not serve, as the cluster reports it (workers.diagnosis), and the release of what a
    # failed deployment ran on, with how long it ran and what that cost (workers.pipeline).
    NOT_SERVING = "not_serving", "Not serving"
    RELEASED = "released", "Released after a failure"

    # A status change that names no action of its own (deployment_transition): `status_<status>` (status_kind).
    STATUS_APPROVED = "status_approved", Status.APPROVED.label
    STATUS_REJECTED = "status_rejected", Status.REJECTED.label
    STATUS_WITHDRAWN = "status_withdrawn", Status.WITHDRAWN.label
    STATUS_PROVISIONING = "status_provisioning", Status.PROVISIONING.label
    STATUS_RUNNING = "status_running", Status.RUNNING.label
    STATUS_UPDATING = "status_updating", Status.UPDATING.label
    STATUS_FAILED = "status_failed", Status.FAILED.label
    STATUS_DELETING = "status_deleting", Status.DELETING.label
    STATUS_DELETED = "status_deleted", Status.DELETED.label
    STATUS_PAUSING = "status_pausing", Status.PAUSING.label
    STATUS_PAUSED = "status_paused", Status.PAUSED.label

    # The reconcile worker's steps (workers.pipeline), each with its duration.
    NODE_POOLS = "node_pools", "Node pools"
    APPLIED = "applied", "Applied to the cluster"
    SERVE_STATUS = "serve_status", "Serve status"
    ENDPOINT = "endpoint", "Endpoint check"
    TEARDOWN = "teardown", "Teardown"
    PAUSE = "pause", "Pause"
    TRANSIENT_ERROR = "transient_error", "Retrying after an error"

    # Teams, people, clusters and credentials (no deployment).
    TEAM_CREATED = "team_created", "Team created"
    TEAM_UPDATED = "team_updated", "Team updated"
    MEMBER_ADDED = "member_added", "Member added"
    MEMBER_ROLE_CHANGED = "member_role_changed", "Member's role changed"
    MEMBER_REMOVED = "member_removed", "Member removed"
    PLATFORM_ADMIN_GRANTED = "platform_admin_granted", "Made a platform admin"
    PLATFORM_ADMIN_REVOKED = "platform_admin_revoked", "No longer a platform admin"
    USER_CREATED = "user_created", "User created"
    USER_UPDATED = "user_updated", "User's details changed"
    USER_DEACTIVATED = "user_deactivated", "User deactivated"
    USER_REACTIVATED = "user_reactivated", "User reactivated"
    USER_DELETED = "user_deleted", "User deleted"
    SCIM_GROUP_CREATED = "scim_group_created", "Directory group created"
    SCIM_GROUP_UPDATED = "scim_group_updated", "Directory group changed"
    SCIM_GROUP_DELETED = "scim_group_deleted", "Directory group deleted"
    SCIM_TOKEN_CREATED = "scim_token_created", "SCIM token created"
    SCIM_TOKEN_REVOKED = "scim_token_revoked", "SCIM token revoked"
    SIGN_IN_MAPPING_UNKNOWN_TEAM = "sign_in_mapping_unknown_team", "Sign-in maps to an unknown team"
    SIGN_IN_REFUSED = "sign_in_refused", "Sign-in refused"
    IDENTITY_LINKED = "identity_linked", "Company identity linked"
    BUDGET_WARNING = "budget_warning", "Budget warning"
    CLUSTER_REGISTERED = "cluster_registered", "Cluster registered"
    CLUSTER_UPDATED = "cluster_updated", "Cluster edited"
    API_KEY_CREATED = "api_key_created", "API key created"
    API_KEY_REVOKED = "api_key_revoked", "API key revoked"
    API_KEY_TRANSFERRED = "api_key_transferred", "API key moved to the team"
    ACCESS_TOKEN_CREATED = "access_token_created", "Access token created"
    ACCESS_TOKEN_REVOKED = "access_token_revoked", "Access token revoked"


def status_kind(status: str) -> EventKind:
    """The kind of a change to `status` that names no action of its own (ValueError for a status nothing moves
    to)."""
    return EventKind(f"status_{status}")
