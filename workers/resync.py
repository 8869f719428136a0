"""Beat's resync: the safety net that re-enqueues deployments, so a lost message only delays work, sized so that one
tick never hands the workers more than they finish before the next one.

A tick enqueues at most `TANDEM_RESYNC_BATCH` passes, less the messages still waiting on the queue (work the workers
have not caught up with counts against the batch). Unsettled deployments come first, with failed ones whose nodes
are not released yet: they are work in flight, whose requeue chain is what a lost message breaks. Running ones
(looked at for drift, e.g. an app removed out-of-band) fill the rest from a cursor that moves through them by id and
wraps around, so N running deployments are all looked at within ceil(N / batch) ticks. Unsettled ones beyond a batch
rotate the same way.
"""
from celery import current_app
from django.conf import settings
from django.db.models import Q

from controlplane.redis_client import redis_client
from deployments.lifecycle import RECONCILED, RELEASES, UNSETTLED
from deployments.models import Deployment

IN_FLIGHT = Q(status__in=UNSETTLED) | Q(status__in=RELEASES, released_at__isnull=True)

CURSOR_KEY = "tandem:resync:after:{}"  # the last id a tick took, per group


def resync_slice(*, budget: int) -> list[int]:
    """The ids this tick re-enqueues: up to `budget`, unsettled first, then the next running ones."""
    unsettled = _rotating(IN_FLIGHT, group="unsettled", limit=budget)
    return unsettled + _rotating(Q(status__in=RECONCILED - UNSETTLED), group="running", limit=budget - len(unsettled))


def resync_budget() -> int:
    """What this tick may enqueue: the batch less what still waits on the queue from earlier ticks."""
    return max(0, settings.TANDEM_RESYNC_BATCH - queue_waiting())


def queue_waiting() -> int:
    """Messages on the default queue that no worker has taken yet."""
    with current_app.connection_for_read() as conn:
        return conn.default_channel.client.llen(current_app.conf.task_default_queue)


def _rotating(which: Q, *, group: str, limit: int) -> list[int]:
    """Up to `limit` ids of deployments `which` selects after the group's cursor, wrapping to the lowest; the cursor
    moves on."""
    if limit <= 0:
        return []
    ids = Deployment.objects.filter(which).order_by("pk").values_list("pk", flat=True)
    key = CURSOR_KEY.format(group)
    after = int(redis_client().get(key) or 0)
    taken = list(ids.filter(pk__gt=after)[:limit])
    if len(taken) < limit:
        taken += ids.filter(pk__lte=after)[:limit - len(taken)]
    if taken:
        redis_client().set(key, taken[-1])
    return taken
