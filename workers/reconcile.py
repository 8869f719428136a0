"""The reconciler: a level-triggered, idempotent pipeline that drives one deployment towards its spec.

1 load (stop if settled) → 2 deletion → 3 validate → 4 node pools → 5 desired objects → 6 observe →
7 apply if the hash differs → 8 derive conditions and status → 9 write status if changed → 10 requeue.
Calling it twice does what calling it once does.

One reconciler per deployment at a time: a PostgreSQL session advisory lock. Unlike a lock with a TTL in Redis,
it is released the moment its holder dies (a SIGKILLed worker's connection closes), so the redelivered message
continues at once instead of waiting out the TTL; and while it is held, its holder is alive and will requeue.
"""
import logging

from django.db import connection

from controlplane.redis_client import redis_client
from workers.pipeline import reconcile_pass

log = logging.getLogger(__name__)
LOCK_BUSY_RETRY_SECONDS = 2.0
LOCK_CLASS = 0x7A4D  # first key of the two-key advisory lock: "Tandem reconcile"; the second is the id


def _try_lock(deployment_id: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [LOCK_CLASS, deployment_id])
        return bool(cursor.fetchone()[0])


def _unlock(deployment_id: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [LOCK_CLASS, deployment_id])


def _claim_requeue(deployment_id: int, delay: float, *, marker: str = "next") -> bool:
    """True when no other pass has already scheduled the next one (keeps one chain of requeues per deployment).

    Status changes and the beat job enqueue extra passes; each would otherwise start a chain of its own.
    The marker lives a little shorter than the delay, so the scheduled pass itself can claim the next one.
    Retries of a busy lock claim a marker of their own (`marker="busy"`), see `reconcile`.
    """
    return bool(redis_client().set(f"tandem:reconcile:{marker}:{deployment_id}", 1, nx=True, px=max(int(delay * 800), 1)))


def reconcile(deployment_id: int) -> float | None:
    """Run one pass; return seconds until the next pass, or None when settled or another pass owns it."""
    if not _try_lock(deployment_id):
        # The holder is alive (its connection is). It may be finishing a pass that read the state before the
        # change that enqueued us (a status change, a conformance result users wait on), so look again shortly,
        # even when the holder's chain has a next pass: that one may be a backoff a minute away. Busy retries
        # share a marker of their own, so a long pass collects one retry, not one per message.
        retry = LOCK_BUSY_RETRY_SECONDS
        return retry if _claim_requeue(deployment_id, retry, marker="busy") else None
    try:
        delay = reconcile_pass(deployment_id)
    finally:
        try:
            _unlock(deployment_id)
        except Exception:  # a broken connection has released it already
            log.warning("could not release the reconcile lock of %s", deployment_id)
    if delay is not None and not _claim_requeue(deployment_id, delay):
        return None
    return delay
