"""On-demand conformance runs: each mints a key and holds a worker for about 30 s, so a member looping on
`POST /api/v1/deployments/<id>/conformance/` must not be able to hold everyone's workers.

Two limits, both kept in Redis so they hold across web processes: one pending run per deployment (a run the
reconciler started counts too), and at most TANDEM_CONFORMANCE_TEAM_RUNS on-demand runs per team in each
TANDEM_CONFORMANCE_TEAM_WINDOW_SECONDS. A refused request raises RateLimited (429 with Retry-After).
"""
from django.conf import settings
from django.utils import timezone

from controlplane.redis_client import redis_client
from deployments.errors import RateLimited
from deployments.event_kinds import EventKind
from deployments.models import Deployment
from deployments.services.events import event_record
from observability.conformance.pending import conformance_pending_key, conformance_request_done
from observability.tasks import run_conformance

RUN_SECONDS = 30  # about how long one run takes: the wait suggested while a run is pending


def _team_key(team_id: int) -> str:
    return f"tandem:conformance:team:{team_id}"


def _reconciler_run_pending(d: Deployment) -> int:
    """Seconds the reconciler's own run may still take (0: none pending): requested, with no run started since,
    and not yet overdue (the reconciler starts an overdue run again itself)."""
    requested = d.conformance_requested_at
    if requested is None:
        return 0
    latest = d.conformance_runs.order_by("-started_at").values_list("started_at", flat=True).first()
    if latest is not None and latest >= requested:
        return 0
    left = settings.TANDEM_CONFORMANCE_OVERDUE_SECONDS - (timezone.now() - requested).total_seconds()
    return max(0, int(left))


def _pending(d: Deployment, *, retry_after: int) -> RateLimited:
    return RateLimited(f"A conformance run of {d.name} is already pending; its result shows on the deployment "
                       "when it finishes. Ask again after that.", retry_after=min(max(retry_after, 1), RUN_SECONDS))


def _span(seconds: int) -> str:
    return f"{seconds // 60} minutes" if seconds >= 120 else f"{seconds} s"


def conformance_request(*, deployment: Deployment, actor) -> None:
    """Queue a conformance run of `deployment` unless one is pending or its team is over its rate."""
    d = deployment
    if left := _reconciler_run_pending(d):
        raise _pending(d, retry_after=left)
    redis = redis_client()
    # The marker lives until the run's task clears it, or for as long as the reconciler would wait for a run.
    if not redis.set(conformance_pending_key(d.pk), "1", nx=True, ex=settings.TANDEM_CONFORMANCE_OVERDUE_SECONDS):
        raise _pending(d, retry_after=redis.ttl(conformance_pending_key(d.pk)))
    limit, window = settings.TANDEM_CONFORMANCE_TEAM_RUNS, settings.TANDEM_CONFORMANCE_TEAM_WINDOW_SECONDS
    pipe = redis.pipeline(transaction=True)
    pipe.set(_team_key(d.team_id), 0, nx=True, ex=window)
    pipe.incr(_team_key(d.team_id))
    pipe.ttl(_team_key(d.team_id))
    _, count, ttl = pipe.execute()
    if count > limit:
        conformance_request_done(deployment_id=d.pk)
        raise RateLimited(f"{d.team.name} has asked for {limit} conformance runs in the last {_span(window)}, the "
                          f"most a team may (each holds a worker). Ask again in {ttl} s.", retry_after=ttl)
    event_record(kind=EventKind.CONFORMANCE_REQUESTED, deployment=d, actor=actor, message="Conformance run requested.")
    try:
        run_conformance.delay(d.pk, on_demand=True)
    except Exception:
        conformance_request_done(deployment_id=d.pk)  # never queued: do not hold the next request back
        raise
