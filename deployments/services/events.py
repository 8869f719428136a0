"""The audit trail's only writer."""
from deployments.models import Event


def event_record(*, kind: str, team=None, deployment=None, actor=None, message: str = "",
                 before=None, after=None, duration_ms: int | None = None) -> Event:
    """Append one immutable audit event (a deployment's team is used when no team is given)."""
    if team is None and deployment is not None:
        team = deployment.team
    if actor is not None and not getattr(actor, "is_authenticated", False):
        actor = None
    return Event.objects.create(
        kind=kind, team=team, deployment=deployment, actor=actor, message=message[:4000],
        before=before, after=after, duration_ms=duration_ms,
    )
