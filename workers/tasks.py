"""Celery tasks: thin wrappers that take ids and call the reconciler."""
from celery import current_app, shared_task
from django.utils import timezone

from deployments.services.budgets import budgets_check
from deployments.services.pause import deployment_wake, deployments_pause_idle
from deployments.services.status import reconcile_enqueue, reconcile_started
from usage.selectors import last_request_by_deployment
from workers import reconcile, resync
from workers.preflight import cluster_check_run


@shared_task(acks_late=True, ignore_result=True)
def reconcile_deployment(deployment_id: int) -> None:
    """Drive one deployment one step towards its spec; requeues itself while it is not settled."""
    reconcile_started(deployment_id=deployment_id)
    delay = reconcile.reconcile(deployment_id)
    if delay is not None:
        reconcile_deployment.apply_async((deployment_id,), countdown=delay)


@shared_task(ignore_result=True)
def resync_deployments() -> int:
    """Beat: re-enqueue unsettled deployments and a rotating slice of running ones, so a lost message only delays
    work; never more than the workers finish in one interval (workers.resync). One already queued is not queued
    again; returns how many were."""
    ids = resync.resync_slice(budget=resync.resync_budget())
    with current_app.producer_or_acquire() as producer:  # one connection for the batch, not one per message
        return sum(reconcile_enqueue(deployment_id=deployment_id, producer=producer) for deployment_id in ids)


@shared_task(acks_late=True, ignore_result=True)
def wake_deployment(deployment_id: int) -> None:
    """Sent by name by the gateway when a request reaches a paused deployment that wakes on request."""
    deployment_wake(deployment_id=deployment_id)


@shared_task(ignore_result=True)
def pause_idle_deployments() -> list[int]:
    """Beat: pause the running deployments that set an idle time and had no request through the gateway for it."""
    return deployments_pause_idle(now=timezone.now(), last_requests=last_request_by_deployment)


@shared_task(ignore_result=True)
def check_budgets() -> list[str]:
    """Beat: warn the admins of each team whose month so far reached 80% of its budget (once a month)."""
    return budgets_check(now=timezone.now())


@shared_task(acks_late=True, ignore_result=True)
def check_cluster(check_id: int) -> None:
    """Run a requested preflight (workers.preflight) and record its lines."""
    cluster_check_run(check_id=check_id)
