"""How a deployment's status reads in the portal: badge tone, whether to keep polling, the step timeline."""
from deployments.lifecycle import TERMINAL, UNSETTLED, Status

TONES = {
    Status.PENDING_APPROVAL: "wait", Status.APPROVED: "info", Status.PROVISIONING: "info",
    Status.UPDATING: "info", Status.DELETING: "info", Status.RUNNING: "ok", Status.FAILED: "bad",
    Status.REJECTED: "bad", Status.WITHDRAWN: "mute", Status.DELETED: "mute", Status.PAUSING: "info",
    Status.PAUSED: "wait",
}


def deployment_state(d) -> dict:
    """Badge tone, whether work is in flight, and how often the status panel should poll."""
    in_flight = d.status in UNSETTLED
    waiting = d.awaits_approval
    poll = "every 2s" if in_flight else ("every 5s" if waiting and d.status not in TERMINAL else None)
    return {"tone": TONES.get(d.status, "mute"), "in_flight": in_flight, "settled": poll is None, "poll": poll,
            "label": Status(d.status).label}


def timeline(d) -> list[dict]:
    """The deployment's events, oldest first, as timeline steps (the newest one marked current), each labelled
    with its kind's words (deployments.event_kinds)."""
    events = list(d.events.select_related("actor").order_by("created_at", "id"))
    steps = []
    for i, e in enumerate(events):
        after = e.after if isinstance(e.after, dict) else {}
        steps.append({
            "label": e.get_kind_display(), "kind": e.kind, "message": e.message, "at": e.created_at,
            "actor": e.actor, "duration_ms": e.duration_ms, "status": after.get("status"),
            "current": i == len(events) - 1, "tone": TONES.get(after.get("status"), ""),
        })
    return steps
