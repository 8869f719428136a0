"""A conformance run for one deployment: a short-lived service key, the suite through the gateway, PD health
from scrapes before and after, and the stored result. The reconciler derives the conditions from that result."""
import datetime as dt
import time

import httpx
from django.conf import settings
from django.db import transaction
from django.db.models import OuterRef, Subquery
from django.utils import timezone

from controlplane.http_client import http_client
from deployments.conditions import conformance_passed
from deployments.event_kinds import EventKind
from deployments.models import ApiKey, Deployment
from deployments.redaction import internal_redact
from deployments.services.api_keys import api_key_create_for_tandem, api_key_revoke
from deployments.services.events import event_record
from deployments.services.status import deployment_reconcile_request
from observability.conformance.suite import conformance_run
from observability.fabric import kv_fabric
from observability.models import ConformanceCheck, ConformanceRun
from observability.pd_health import pd_health
from observability.scraper import ScrapeError, scrape_snapshot
from workers.targets import target_for
from workers.targets.base import PermanentError, TransientError

SERVICE_KEY_NAME = "tandem-conformance"
SERVICE_KEY_TTL = dt.timedelta(minutes=15)


SERVICE_KEY_MESSAGE = "Service key for a conformance run."


def service_key_mint(*, deployment: Deployment) -> tuple[ApiKey, str]:
    """A key owned by Tandem itself (no user), scoped to one deployment, expiring soon; stored hashed."""
    return api_key_create_for_tandem(deployment=deployment, name=SERVICE_KEY_NAME, lifetime=SERVICE_KEY_TTL,
                                     message=SERVICE_KEY_MESSAGE)


def service_key_revoke(*, key: ApiKey) -> None:
    """Revoke the run's key at once, on every gateway replica."""
    api_key_revoke(actor=None, key=key, message=SERVICE_KEY_MESSAGE)


def _snapshot(d: Deployment, client: httpx.Client) -> tuple[dict | None, str]:
    try:
        return scrape_snapshot(d, client=client), ""
    except ScrapeError as e:  # kept in the run's PD health, which members read: the cluster, not its metrics URL
        return None, internal_redact(str(e), cluster=d.cluster)


def _snapshot_after(d: Deployment, client: httpx.Client, before: dict) -> tuple[dict | None, str]:
    """The scrape after the run, once the run's traffic shows in it: Ray exports engine metrics every few
    seconds, so an immediate scrape can miss the whole run and read as 'no traffic'."""
    deadline = time.monotonic() + settings.TANDEM_METRICS_SETTLE_SECONDS
    while True:
        after, error = _snapshot(d, client)
        settled = after is None or pd_health(before, after, instance_type=d.spec_typed.decode.instance_type)[
            "verdict"] != "no_traffic"
        if settled or time.monotonic() >= deadline:
            return after, error
        time.sleep(2)


def _engine_logs(d: Deployment) -> dict[str, str] | None:
    """The engines' logs where the target reads them; None (the fabric unconfirmed) when it cannot right now."""
    try:
        return target_for(d.cluster).engine_logs(d)
    except (PermanentError, TransientError):
        return None


def conformance_run_for_deployment(*, deployment_id: int, gateway_base_url: str,
                                   http: httpx.Client | None = None) -> ConformanceRun:
    """Run the suite through the gateway, record the result for the generation it checked, and ask for a
    reconcile pass: the pipeline, the one writer of conditions, derives ConformancePassed from this run and opens
    EndpointReady (and with it the gateway, for users' keys). A failing check leaves the deployment running,
    with a warning event naming the failed checks."""
    d = Deployment.objects.select_related("team", "cluster").get(pk=deployment_id)
    started = timezone.now()
    own_http = http is None
    http = http or http_client()
    try:
        before, before_err = _snapshot(d, http)
        key, raw = service_key_mint(deployment=d)
        try:
            results = conformance_run(base_url=gateway_base_url, api_key=raw, model=d.model_id)
        finally:
            service_key_revoke(key=key)
        after, after_err = _snapshot_after(d, http, before) if before is not None else (None, "")
    finally:
        if own_http:
            http.close()
    if before is not None and after is not None:
        health = pd_health(before, after, instance_type=d.spec_typed.decode.instance_type)
    else:
        health = {"verdict": "unknown", "ok": None,
                  "messages": [before_err or after_err or "The cluster has no metrics_url or prometheus_url."]}
    health["fabric"] = kv_fabric(spec=d.spec_typed, logs=_engine_logs(d), health=health)
    failed = [r.name for r in results if not r.passed]
    summary = (f"{len(results) - len(failed)}/{len(results)} checks passed"
               + (f"; failed: {', '.join(failed)}" if failed else "") + f". PD health: {health['verdict']}.")
    with transaction.atomic():
        run = ConformanceRun.objects.create(deployment=d, generation=d.generation, started_at=started,
                                            finished_at=timezone.now(), base_url=gateway_base_url,
                                            model=d.model_id, passed=not failed, summary=summary, pd_health=health)
        ConformanceCheck.objects.bulk_create(ConformanceCheck(run=run, position=i, name=r.name, passed=r.passed,
                                                              evidence=r.evidence[:4000])
                                             for i, r in enumerate(results))
        message = conformance_passed(passed=run.passed, summary=summary, pd_health=health)["message"]
        ok = run.passed and health.get("ok") is not False and health["fabric"]["ok"] is not False
        event_record(kind=EventKind.CONFORMANCE_PASSED if ok else EventKind.CONFORMANCE_WARNING, deployment=d,
                     message=message)
        # Users may be waiting on this run: the pass that opens the endpoint starts as soon as it is committed.
        deployment_reconcile_request(deployment_id=d.pk)
    return run


def conformance_runs_prune(*, now: dt.datetime, keep_days: int | None = None) -> int:
    """Delete runs older than TANDEM_CONFORMANCE_RETENTION_DAYS (default 30), keeping each deployment's latest
    run whatever its age (it is the one the deployment page shows); returns runs deleted."""
    keep = keep_days if keep_days is not None else settings.TANDEM_CONFORMANCE_RETENTION_DAYS
    latest = ConformanceRun.objects.filter(deployment=OuterRef("deployment")).order_by("-started_at", "-id")
    old = (ConformanceRun.objects.filter(started_at__lt=now - dt.timedelta(days=keep))
           .exclude(pk=Subquery(latest.values("pk")[:1])))
    return ConformanceRun.objects.filter(pk__in=list(old.values_list("pk", flat=True))).delete()[1].get(
        "observability.ConformanceRun", 0)
