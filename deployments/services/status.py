"""Writes of what workers observe (conditions, endpoint, observed generation, the reconciler's own counters),
only when it changed, told to the gateways when it opens or closes the endpoint; and the request for a reconcile
pass."""
from celery import current_app
from django.db import transaction
from django.utils import timezone

from controlplane.redis_client import redis_client

from deployments.conditions import condition_set, endpoint_access
from deployments.models import Deployment
from deployments.redaction import internal_redact
from deployments.services.announcements import route_change_announce

# By name, not by import: the domain imports nothing from the workers (they import it). It is the name
# `workers.tasks.reconcile_deployment` registers under, and it goes to the default queue, as `.delay()` does.
RECONCILE_TASK = "workers.tasks.reconcile_deployment"
# Set while a pass of the deployment waits on the queue, not started: further requests need no message of their
# own (that pass reads the row when it starts). It expires, so a lost message does not hold requests back for long.
QUEUED_KEY = "tandem:reconcile:queued:{}"
QUEUED_SECONDS = 120


OBSERVATION_TIMES = {"serving_seen_at"}
# What the gateway routes by, of what is observed: a change opens or closes the endpoint (a conformance result sets
# ConformancePassed and EndpointReady, and with them `endpoint_access`), so every gateway is told at once.
ROUTED = {"endpoint_access", "endpoint_access_message", "endpoint_url", "endpoint_generation", "next_endpoint_url",
          "next_generation", "next_weight"}


@transaction.atomic
def deployment_observe(*, deployment_id: int, condition_updates: dict[str, dict] | None = None, **fields) -> bool:
    """Store observed fields; returns True when anything changed.

    The reconcile pipeline is its one caller for conditions and its own counters (`transient_errors`,
    `conformance_requested_at`). `condition_updates` ({type: condition_set's status, reason, message and
    generation}) is merged into the conditions as they are now, under the row lock: a pass sets only the
    conditions it looked at and keeps the others."""
    d = Deployment.objects.select_for_update().select_related("cluster").get(pk=deployment_id)
    if condition_updates:
        conditions = fields.get("conditions", d.conditions)
        for type, update in condition_updates.items():
            # Members read conditions: a driver's message names the cluster, not its internals.
            update = update | {"message": internal_redact(update.get("message", ""), cluster=d.cluster)}
            conditions = condition_set(conditions, type=type, now=timezone.now(), **update)
        fields["conditions"] = conditions
    if "conditions" in fields:
        fields["endpoint_access"], fields["endpoint_access_message"] = endpoint_access(fields["conditions"])
    changed = {k: v for k, v in fields.items() if getattr(d, k) != v}
    if not changed:
        return False
    for k, v in changed.items():
        setattr(d, k, v)
    # A reading that only says when it was seen serving is no change to the deployment: `updated_at` (the API's
    # ordering, the gateway's `created`) stays.
    d.save(update_fields=[*changed] if set(changed) <= OBSERVATION_TIMES else [*changed, "updated_at"])
    if ROUTED & set(changed):
        route_change_announce(deployment=d)
    return True


def deployment_reconcile_request(*, deployment_id: int) -> None:
    """Ask for a reconcile pass once the current transaction commits, so the worker sees what was written."""
    transaction.on_commit(lambda: reconcile_enqueue(deployment_id=deployment_id))


def reconcile_enqueue(*, deployment_id: int, producer=None) -> bool:
    """Queue a reconcile pass unless one is queued and not started yet; True when a message was sent.

    The pass clears the flag as it starts (`reconcile_started`), so a request made during a pass still queues
    one more: that pass may have read the row before the change the request is about."""
    key = QUEUED_KEY.format(deployment_id)
    if not redis_client().set(key, 1, nx=True, ex=QUEUED_SECONDS):
        return False
    try:
        current_app.send_task(RECONCILE_TASK, (deployment_id,), producer=producer)
    except Exception:
        redis_client().delete(key)  # nothing was queued: the next request must send one
        raise
    return True


def reconcile_started(*, deployment_id: int) -> None:
    """A pass of the deployment has started: the next request queues a new one."""
    redis_client().delete(QUEUED_KEY.format(deployment_id))
