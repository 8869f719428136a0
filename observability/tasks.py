"""Celery tasks for observability: thin, they take ids and call the modules that do the work."""
from celery import shared_task
from django.conf import settings
from django.utils import timezone

from deployments.lifecycle import SCRAPED, Status
from controlplane.http_client import http_client
from deployments.models import Deployment
from observability.conformance.pending import conformance_request_done
from observability.conformance.runner import conformance_run_for_deployment, conformance_runs_prune
from observability.rollups import gateway_rollup, rollups_prune
from observability.services.advice import recommendations_auto_apply
from observability.scraper import metrics_source, scrape_deployment


@shared_task(ignore_result=True)
def scrape_running_deployments() -> int:
    """Beat (every 30 s): enqueue a scrape of every running deployment whose cluster exposes metrics."""
    ids = [d.pk for d in Deployment.objects.select_related("cluster").filter(status__in=SCRAPED)
           if metrics_source(d.cluster)]
    for deployment_id in ids:
        scrape_deployment_task.delay(deployment_id)
    return len(ids)


@shared_task(acks_late=True, ignore_result=True, soft_time_limit=25, time_limit=30)
def scrape_deployment_task(deployment_id: int) -> dict:
    """Scrape one deployment's metrics into this minute's rollups."""
    with http_client() as client:
        return scrape_deployment(deployment_id=deployment_id, client=client, now=timezone.now())


@shared_task(ignore_result=True)
def rollup_gateway_timings() -> int:
    """Beat (every 60 s): recompute the last ten whole minutes of gateway timings and throughput."""
    now = timezone.now()
    return gateway_rollup(since=now - timezone.timedelta(minutes=10), until=now)


@shared_task(ignore_result=True)
def prune_rollups() -> int:
    """Beat (hourly): delete rollups older than TANDEM_ROLLUP_RETENTION_DAYS (default 14) and conformance runs
    older than TANDEM_CONFORMANCE_RETENTION_DAYS (default 30; each deployment's latest run stays)."""
    now = timezone.now()
    return rollups_prune(now=now) + conformance_runs_prune(now=now)


@shared_task(acks_late=True, ignore_result=True)
def run_conformance(deployment_id: int, on_demand: bool = False) -> int:
    """Run the conformance suite and PD-health probe through the gateway; returns the run's id. A run a user
    asked for (`on_demand`) lets the deployment be asked about again once it ends, however it ends."""
    try:
        return conformance_run_for_deployment(deployment_id=deployment_id,
                                              gateway_base_url=settings.TANDEM_GATEWAY_BASE_URL).pk
    finally:
        if on_demand:
            conformance_request_done(deployment_id=deployment_id)


@shared_task(ignore_result=True)
def apply_recommendations() -> int:
    """Beat (every 5 min): enqueue the advisor for each running deployment of a team that lets Tandem apply its
    recommendations."""
    ids = list(Deployment.objects.filter(status=Status.RUNNING, team__auto_apply_recommendations=True)
               .values_list("pk", flat=True))
    for deployment_id in ids:
        apply_recommendations_for.delay(deployment_id)
    return len(ids)


@shared_task(acks_late=True, ignore_result=True)
def apply_recommendations_for(deployment_id: int) -> str | None:
    """Apply one deployment's recommendation within its approved bounds, if the advisor has one."""
    return recommendations_auto_apply(deployment_id=deployment_id, now=timezone.now())
