"""The Redis pub/sub channels on which the control plane tells every gateway replica what changed, declared once:
the services publish on them after commit (deployments.services.announcements) and the gateway subscribes
(gateway.announcements). Each replica caches keys and routes; these drop an entry at once, and the cache's expiry
is only the fallback for an announcement Redis lost."""

# A revoked (or otherwise changed) API key: the message is its key id.
KEY_EVENTS_CHANNEL = "tandem:keys:changed"
# A change that opens or closes a deployment's endpoint (a status change, a conformance result): the message is
# `<team id>:<deployment id>` (the gateway caches routes per team).
ROUTE_EVENTS_CHANNEL = "tandem:routes:changed"


def route_event(*, team_id: int, deployment_id: int) -> str:
    return f"{team_id}:{deployment_id}"


def route_event_team(message: bytes) -> int | None:
    """The team whose routes a route event concerns; None for a message that is not one."""
    team, _, deployment = message.partition(b":")
    return int(team) if team.isdigit() and deployment.isdigit() else None
