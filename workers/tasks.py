"""Celery tasks: thin wrappers that take ids and call the reconciler."""
from celery import shared_task

from workers import reconcile


@shared_task(acks_late=True, ignore_result=True)
def reconcile_deployment(deployment_id: int) -> None:
    """Drive one deployment one step towards its spec; requeues itself while it is not settled."""
    delay = reconcile.reconcile(deployment_id)
    if delay is not None:
        reconcile_deployment.apply_async((deployment_id,), countdown=delay)


@shared_task(ignore_result=True)
def resync_deployments() -> int:
    """Beat: re-enqueue every unsettled deployment, so a lost message only delays work."""
    ids = reconcile.unsettled_deployment_ids()
    for deployment_id in ids:
        reconcile_deployment.delay(deployment_id)
    return len(ids)
