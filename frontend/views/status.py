"""How a deployment's status reads in the portal: badge tone, whether to keep polling, the step timeline."""
from deployments.lifecycle import TERMINAL, UNSETTLED, Status

TONES = {
    Status.PENDING_APPROVAL: "wait", Status.APPROVED: "info", Status.PROVISIONING: "info",
    Status.UPDATING: "info", Status.DELETING: "info", Status.RUNNING: "ok", Status.FAILED: "bad",
    Status.REJECTED: "bad", Status.WITHDRAWN: "mute", Status.DELETED: "mute", Status.PAUSING: "info",
    Status.PAUSED: "wait",
}
# Event kinds written by services; anything else (worker steps) is shown with its kind made readable.
STEP_LABELS = {
    "requested": "Requested", "edited": "Request edited", "approved": "Approved", "rejected": "Rejected",
    "withdrawn": "Withdrawn", "retried": "Retry requested", "delete_requested": "Deletion requested",
    "update_requested": "Update requested", "update_approved": "Update approved",
    "update_rejected": "Update rejected", "update_withdrawn": "Update withdrawn", "updated": "Updated",
    "pause_requested": "Pause requested", "idle_paused": "Paused for idleness", "resumed": "Resume requested",
    "woken": "Woken by a request", "pause": "Pause",
    # Steps the reconcile worker records.
    "node_pools": "Node pools", "applied": "Applied to the cluster", "serve_status": "Serve status",
    "endpoint": "Endpoint check", "transient_error": "Retrying after an error", "teardown": "Teardown",
    "conformance_passed": "Conformance passed", "conformance_warning": "Conformance warning",
    "conformance_requested": "Conformance run requested",
}


def deployment_state(d) -> dict:
    """Badge tone, whether work is in flight, and how often the status panel should poll."""
    in_flight = d.status in UNSETTLED
    waiting = d.status == Status.PENDING_APPROVAL or d.proposed_spec is not None
    poll = "every 2s" if in_flight else ("every 5s" if waiting and d.status not in TERMINAL else None)
    return {"tone": TONES.get(d.status, "mute"), "in_flight": in_flight, "settled": poll is None, "poll": poll,
            "label": Status(d.status).label}


def step_label(kind: str) -> str:
    if kind in STEP_LABELS:
        return STEP_LABELS[kind]
    if kind.startswith("status_"):
        return Status(kind.removeprefix("status_")).label if kind.removeprefix("status_") in Status.values \
            else kind.removeprefix("status_").replace("_", " ").capitalize()
    return kind.replace("_", " ").replace(".", " · ").capitalize()


def timeline(d) -> list[dict]:
    """The deployment's events, oldest first, as timeline steps (the newest one marked current)."""
    events = list(d.events.select_related("actor").order_by("created_at", "id"))
    steps = []
    for i, e in enumerate(events):
        after = e.after if isinstance(e.after, dict) else {}
        steps.append({
            "label": step_label(e.kind), "kind": e.kind, "message": e.message, "at": e.created_at,
            "actor": e.actor, "duration_ms": e.duration_ms, "status": after.get("status"),
            "current": i == len(events) - 1, "tone": TONES.get(after.get("status"), ""),
        })
    return steps
