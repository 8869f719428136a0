"""The audit trail's only writer."""
from deployments.event_kinds import EventKind
from deployments.models import Event
from deployments.redaction import internal_redact


def event_record(*, kind: EventKind, team=None, deployment=None, actor=None, message: str = "",
                 before=None, after=None, duration_ms: int | None = None) -> Event:
    """Append one immutable audit event (a deployment's team is used when no team is given). What Tandem itself
    writes about a deployment (no actor: worker steps, errors) names its cluster, not the cluster's internals:
    every member of the team reads it. A kind not declared in deployments.event_kinds is a ValueError: clients
    read kinds from the schema's enum."""
    kind = EventKind(kind)
    if team is None and deployment is not None:
        team = deployment.team
    if actor is not None and not getattr(actor, "is_authenticated", False):
        actor = None
    if actor is None and deployment is not None:
        message = internal_redact(message, cluster=deployment.cluster)
    return Event.objects.create(
        kind=kind, team=team, deployment=deployment, actor=actor, message=message[:4000],
        before=before, after=after, duration_ms=duration_ms,
    )
