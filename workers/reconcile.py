"""The reconciler: a level-triggered, idempotent pipeline that drives one deployment towards its spec.

1 load (stop if settled) → 2 deletion → 3 validate → 4 node pools → 5 desired objects → 6 observe →
7 apply if the hash differs → 8 derive conditions and status → 9 write status if changed → 10 requeue.
Calling it twice does what calling it once does.

One reconciler per deployment at a time: a PostgreSQL session advisory lock. Unlike a lock with a TTL in Redis,
it is released the moment its holder dies (a SIGKILLed worker's connection closes), so the redelivered message
continues at once instead of waiting out the TTL; and while it is held, its holder is alive and will requeue.

The lock dies with its connection, and a PostgreSQL restart closes every connection while passes run: a new
pass may take the lock while the old one is still between two calls. Writes to the database are fenced by that
too (the old pass's connection is gone, so its next write fails), but calls to the target are not: so each step
that calls the target first checks, on the connection that took the lock, that it still holds it (`_fence`), and
a pass that lost it stops before changing anything. What is left (the lock lost between the check and the call)
the target's own concurrency refuses: a create of what exists is a conflict, a replace carries resourceVersion.

A user's change can land between a pass's steps (a pause or a delete while it provisions). Each status change a
pass makes is made only from the status it read (`pipeline._move`): when the row has moved on, the pass stops, and
the pass the user's change enqueued (waiting for this lock) acts on the new status and removes what this one
applied meanwhile. So a pass in flight never writes `running` over a pause.

A holder that hangs (a stopped process keeps its connection, so its lock) leaves the others busy: once its session
has sent no query for TANDEM_STUCK_AFTER_SECONDS and the status has not changed for as long, they fail the
deployment as stuck, saying what happened (`pipeline.fail_if_stuck`).
"""
import logging

from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connection

from controlplane.redis_client import redis_client
from workers.pipeline import LockLost, fail_if_stuck, reconcile_pass

log = logging.getLogger(__name__)
LOCK_BUSY_RETRY_SECONDS = 2.0
LOCK_CLASS = 0x7A4D  # first key of the two-key advisory lock: "Tandem reconcile"; the second is the id
# The granted lock of (LOCK_CLASS, deployment id) in pg_locks (a two-key advisory lock has objsubid 2).
HELD = "l.locktype = 'advisory' AND l.classid = %s AND l.objid = %s AND l.objsubid = 2 AND l.granted"


def _try_lock(deployment_id: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [LOCK_CLASS, deployment_id])
        return bool(cursor.fetchone()[0])


def _holds_lock(deployment_id: int) -> bool:
    """This session still holds the lock (False when its connection is gone, e.g. PostgreSQL restarted)."""
    try:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT EXISTS (SELECT 1 FROM pg_locks l WHERE {HELD} AND l.pid = pg_backend_pid())",
                           [LOCK_CLASS, deployment_id])
            return bool(cursor.fetchone()[0])
    except DatabaseError:
        return False


def _holder_idle_seconds(deployment_id: int) -> float | None:
    """How long the session holding the lock has sent no query (None when none holds it or it is in one). A pass
    queries between steps, so a holder idle longer than the stuck limit is not making progress."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT extract(epoch FROM now() - a.state_change) FROM pg_locks l JOIN pg_stat_activity a "
                       f"ON a.pid = l.pid WHERE {HELD} AND a.state = 'idle'", [LOCK_CLASS, deployment_id])
        row = cursor.fetchone()
    return float(row[0]) if row else None


def _fence(deployment_id: int):
    """A check to run before each call to the target: raises LockLost once this pass no longer holds the lock."""
    def check() -> None:
        if not _holds_lock(deployment_id):
            raise LockLost(f"The reconcile lock of deployment {deployment_id} was lost (its database connection "
                           "closed); stopping this pass before it changes anything.")
    return check


def _release(deployment_id: int, *, lost: bool) -> None:
    if lost:  # nothing to release; the dead connection goes, the next pass opens a new one
        connection.close()
        return
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [LOCK_CLASS, deployment_id])
    except Exception:  # a broken connection has released it already
        log.warning("could not release the reconcile lock of %s", deployment_id)


def _claim_requeue(deployment_id: int, delay: float, *, marker: str = "next") -> bool:
    """True when no other pass has already scheduled the next one (keeps one chain of requeues per deployment).

    Status changes and the beat job enqueue extra passes; each would otherwise start a chain of its own.
    The marker lives a little shorter than the delay, so the scheduled pass itself can claim the next one.
    Retries of a busy lock claim a marker of their own (`marker="busy"`), see `reconcile`.
    """
    return bool(redis_client().set(f"tandem:reconcile:{marker}:{deployment_id}", 1, nx=True, px=max(int(delay * 800), 1)))


def reconcile(deployment_id: int) -> float | None:
    """Run one pass; return seconds until the next pass, or None when settled or another pass owns it."""
    try:
        locked = _try_lock(deployment_id)
    except (OperationalError, InterfaceError):  # PostgreSQL is restarting: look again shortly
        log.warning("cannot reach the database to reconcile deployment %s", deployment_id, exc_info=True)
        connection.close()
        return _busy_retry(deployment_id)
    if not locked:
        # The holder is alive (its connection is). It may be finishing a pass that read the state before the
        # change that enqueued us (a status change, a conformance result users wait on), so look again shortly,
        # even when the holder's chain has a next pass: that one may be a backoff a minute away. Busy retries
        # share a marker of their own, so a long pass collects one retry, not one per message.
        # A holder that never finishes (a hung worker) must not hold the deployment for ever.
        idle = _holder_idle_seconds(deployment_id)
        if idle is not None and idle > settings.TANDEM_STUCK_AFTER_SECONDS:
            fail_if_stuck(deployment_id, f"the worker holding it has not used the database for {int(idle)} s "
                                         "(a hung worker? restart it)")
        return _busy_retry(deployment_id)
    lost = False
    try:
        delay = reconcile_pass(deployment_id, fence=_fence(deployment_id))
    except (LockLost, OperationalError, InterfaceError) as e:
        # The connection, and the lock with it, is gone: this pass stops; whoever holds the lock now continues,
        # and if nobody does, the retry does.
        log.warning("reconcile of deployment %s stopped: %s", deployment_id, e)
        lost = True
    finally:
        _release(deployment_id, lost=lost)
    if lost:
        return _busy_retry(deployment_id)
    if delay is not None and not _claim_requeue(deployment_id, delay):
        return None
    return delay


def _busy_retry(deployment_id: int) -> float | None:
    retry = LOCK_BUSY_RETRY_SECONDS
    return retry if _claim_requeue(deployment_id, retry, marker="busy") else None
