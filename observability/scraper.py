"""Scraping a deployment's metrics (Ray's metrics export, or a Prometheus HTTP API) into per-minute rollups."""
import datetime as dt

import httpx
from django.db import transaction

from deployments.models import Cluster, Deployment
from deployments.serve_config import serve_app_name
from deployments.services.status import deployment_reconcile_request
from observability.models import ScrapeState
from observability.pd_health import KV_FAILING, KV_MOVING, kv_reads
from observability.promtext import Sample, parse_prometheus_api, parse_text
from observability.rollups import minute_of, rollup_increase
from observability.snapshot import snapshot_build, snapshot_increase

PROMETHEUS_QUERY = '{__name__=~"ray_vllm_.+|ray_serve_deployment_.+|ray_serve_replica_.+"}'


class ScrapeError(Exception):
    """The metrics endpoint could not be read or parsed."""


def metrics_source(cluster: Cluster) -> tuple[str, list[str]] | None:
    """("prometheus", [api base]) when the cluster names a Prometheus, ("text", [urls]) for Ray's metrics
    export (one URL per node, comma-separated), or None when it has neither."""
    config = cluster.config_typed
    if config.prometheus_url:
        return "prometheus", [config.prometheus_url.rstrip("/")]
    if config.metrics_url:
        return "text", [u.strip() for u in config.metrics_url.split(",") if u.strip()]
    return None


def scrape_samples(source: tuple[str, list[str]], *, client: httpx.Client) -> list[Sample]:
    kind, urls = source
    samples: list[Sample] = []
    try:
        for url in urls:
            if kind == "prometheus":
                r = client.get(f"{url}/api/v1/query", params={"query": PROMETHEUS_QUERY})
                r.raise_for_status()
                samples += parse_prometheus_api(r.json())
            else:
                r = client.get(url)
                r.raise_for_status()
                samples += parse_text(r.text)
    except (httpx.HTTPError, ValueError) as e:
        raise ScrapeError(f"{kind} metrics at {url}: {e}") from e
    return samples


def scrape_snapshot(deployment: Deployment, *, client: httpx.Client) -> dict | None:
    """This deployment's series now, or None when its cluster has no metrics source."""
    source = metrics_source(deployment.cluster)
    if source is None:
        return None
    app = serve_app_name(deployment_id=deployment.pk, name=deployment.name, target_kind=deployment.cluster.kind,
                         app_generation=deployment.app_generation)
    return snapshot_build(scrape_samples(source, client=client), deployment.model_id, application=app)


def scrape_deployment(*, deployment_id: int, client: httpx.Client, now: dt.datetime) -> dict:
    """Scrape once, add the increase since the last scrape to this minute's rollups, keep the new baseline.

    The first scrape only sets the baseline: counts from before it have no time to be placed in.
    """
    d = Deployment.objects.select_related("cluster").get(pk=deployment_id)
    try:
        snap = scrape_snapshot(d, client=client)
    except ScrapeError as e:
        ScrapeState.objects.update_or_create(deployment=d, defaults={"last_error": str(e)[:2000],
                                                                     "last_error_at": now})
        return {"ok": False, "error": str(e)}
    if snap is None:
        return {"ok": False, "error": "The cluster has no metrics_url or prometheus_url."}
    with transaction.atomic():
        state, _ = ScrapeState.objects.select_for_update().get_or_create(deployment=d)
        touched = 0
        if state.scraped_at is not None and state.snapshot:
            touched = rollup_increase(deployment_id=d.pk, minute=minute_of(now),
                                      inc=snapshot_increase(state.snapshot, snap))
            if _kv_reads_follow(state, kv_reads(state.snapshot, snap), now=now):
                deployment_reconcile_request(deployment_id=d.pk)  # the pipeline restarts or reports recovery
        state.snapshot, state.scraped_at, state.last_error = snap, now, ""
        state.save()
    return {"ok": True, "series": sum(len(v) for v in snap.values()), "rows": touched}


def _kv_reads_follow(state: ScrapeState, reads: dict, *, now: dt.datetime) -> bool:
    """Keep the decode's KV reads on `state`: a failing spell starts at the first scrape whose reads all failed and
    ends at the first whose reads all succeeded (one with neither, or both, leaves it as it is). True when the
    spell started or ended."""
    state.kv_reads = reads
    if reads["state"] == KV_FAILING and state.kv_failing_since is None:
        state.kv_failing_since = now
        return True
    if reads["state"] == KV_MOVING and state.kv_failing_since is not None:
        state.kv_failing_since = None
        return True
    return False
