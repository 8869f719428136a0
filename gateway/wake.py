"""Wake on request: the first request to a paused deployment that allows it starts its resume, once.

The claim is a Redis key shared by every replica (SET NX) holding when the wake started: the replica that sets it
sends the wake task by name (as deployments.services.status sends the reconcile task); the others, and later
requests, only answer with the time left (`ready_in`, which the 503s of a deployment provisioning on its way back
use too). The claim outlives the route cache's staleness, so a replica that still sees the deployment paused does
not wake it twice; the worker's resume is itself a no-op unless the deployment is paused.

A team past its monthly budget (the budget service's flag, deployments.budget_flag) needs a platform admin to
resume: the request is told so, and the wake is still sent, once per OVER_BUDGET_CLAIM_SECONDS, so that the
worker refuses it by the budget rule itself and records why (`wake_refused`) without a client that keeps retrying
filling the audit trail.
"""
import asyncio
import logging
import math
import time

from kombu.exceptions import OperationalError
from redis.exceptions import RedisError

from deployments.budget_flag import OVER_BUDGET_KEY
from deployments.lifecycle import DEFAULT_READY_SECONDS

log = logging.getLogger(__name__)

WAKE_TASK = "workers.tasks.wake_deployment"
CLAIM_SECONDS = 60
OVER_BUDGET_CLAIM_SECONDS = 600  # the budget check's beat interval: a refusal is recorded once per check


def ready_in(*, since: float, estimate: int | None, now: float) -> int:
    """Seconds until a deployment that set off on its way to serving at `since` (epoch seconds) should serve: its
    ready estimate from then (the default for one paused before estimates were kept), at least 1.
    A client's Retry-After, whether its request woke the deployment or it is still provisioning."""
    return max(1, math.ceil(since + (estimate or DEFAULT_READY_SECONDS) - now))


def _send(deployment_id: int) -> None:
    from controlplane.celery import app

    app.send_task(WAKE_TASK, (deployment_id,))


class Waker:
    """Claims a wake in Redis and sends the task; answers how many seconds are left until it should serve."""

    def __init__(self, redis, *, send=_send):
        self._redis = redis
        self._send = send

    async def wake(self, deployment_id: int, *, team_id: int, estimate: int | None) -> int | None:
        """Seconds until it should serve (`estimate`: its ready estimate); None: its team is over budget, so it is
        not woken."""
        key = f"tandem:wake:{deployment_id}"
        now = since = int(time.time())
        try:
            if await self._redis.exists(OVER_BUDGET_KEY.format(team_id)):
                if await self._redis.set(f"{key}:over-budget", 1, nx=True, ex=OVER_BUDGET_CLAIM_SECONDS):
                    await asyncio.to_thread(self._send, deployment_id)
                return None
            if await self._redis.set(key, now, nx=True, ex=CLAIM_SECONDS):
                await asyncio.to_thread(self._send, deployment_id)
                log.info("deployment %s: woken by a request", deployment_id)
            else:
                since = int(await self._redis.get(key) or now)
        except (RedisError, OperationalError, OSError, ValueError):
            # The next request tries again: a wake is worth a retry, never a 500.
            log.warning("deployment %s: could not start a wake", deployment_id, exc_info=True)
        return ready_in(since=since, estimate=estimate, now=now)
