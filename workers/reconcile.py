"""The reconciler: a level-triggered, idempotent pipeline that drives one deployment towards its spec.

1 load (stop if settled) → 2 deletion → 3 validate → 4 node pools → 5 desired objects → 6 observe →
7 apply if the hash differs → 8 derive conditions and status → 9 write status if changed → 10 requeue.
Calling it twice does what calling it once does; one reconciler per deployment runs at a time (Redis lock).
"""
import logging

import redis
from django.conf import settings

from deployments.lifecycle import Status
from deployments.models import Deployment

log = logging.getLogger(__name__)
LOCK_SECONDS = 600


def unsettled_deployment_ids() -> list[int]:
    """Deployments with work left, and running ones (to notice drift such as an app removed out-of-band)."""
    live = [Status.APPROVED, Status.PROVISIONING, Status.UPDATING, Status.DELETING, Status.RUNNING]
    return list(Deployment.objects.filter(status__in=live).values_list("pk", flat=True))


def reconcile(deployment_id: int) -> float | None:
    """Run one pass; return seconds until the next pass, or None when the deployment is settled."""
    lock = redis.Redis.from_url(settings.REDIS_URL).lock(f"tandem:reconcile:{deployment_id}", timeout=LOCK_SECONDS,
                                                         blocking=False)
    if not lock.acquire():
        return None  # another worker holds it and requeues itself
    try:
        from workers.pipeline import reconcile_pass

        return reconcile_pass(deployment_id)
    finally:
        try:
            lock.release()
        except redis.exceptions.LockError:
            log.warning("reconcile lock for %s expired before release", deployment_id)
