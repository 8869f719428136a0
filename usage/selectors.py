"""Reads of gateway usage for the REST API and for the rollout's judge."""
import datetime as dt
from dataclasses import dataclass

from django.db.models import Count, Max, Q, Sum
from django.utils import timezone

from deployments.cost import cost_per_million
from deployments.spec import TargetsSpec
from deployments.spend import deployment_hourly_usd, deployment_spend_usd
from observability.attainment import Percentile, targets_attainment
from usage.models import RequestRecord


def usage_by_key(*, deployment, window: dt.timedelta) -> list[dict]:
    """Per-key totals for one deployment over the last `window`, busiest key first."""
    since = timezone.now() - window
    rows = (RequestRecord.objects.filter(deployment=deployment, created_at__gte=since)
            .values("api_key__key_id", "api_key__name")
            .annotate(requests=Count("id"), prompt_tokens=Sum("prompt_tokens"),
                      completion_tokens=Sum("completion_tokens"), partial=Count("id", filter=Q(partial=True)))
            .order_by("-requests", "api_key__key_id"))
    return [{"api_key": r["api_key__key_id"], "name": r["api_key__name"], "requests": r["requests"],
             "prompt_tokens": r["prompt_tokens"] or 0, "completion_tokens": r["completion_tokens"] or 0,
             "partial": r["partial"]} for r in rows]


def last_request_by_deployment(ids) -> dict[int, dt.datetime]:
    """When each of these deployments last had a request through the gateway (from the drained records)."""
    rows = (RequestRecord.objects.filter(deployment_id__in=list(ids)).values("deployment_id")
            .annotate(last=Max("created_at")))
    return {r["deployment_id"]: r["last"] for r in rows}


def deployment_cost(*, deployment, window: dt.timedelta) -> dict:
    """What the deployment costs per hour now, what it cost over the window, its output tokens there and the cost
    per million of them; each key's tokens and its share of the cost (by output tokens) for chargeback."""
    now = timezone.now()
    usd = deployment_spend_usd(deployment=deployment, since=now - window, until=now)
    keys = usage_by_key(deployment=deployment, window=window)
    output = sum(k["completion_tokens"] for k in keys)
    per_million = cost_per_million(usd, output)
    return {
        "deployment": deployment.pk, "currency": "USD", "hourly_usd": round(deployment_hourly_usd(deployment), 4),
        "window_seconds": int(window.total_seconds()), "usd": round(usd, 4), "output_tokens": output,
        "usd_per_million_output_tokens": None if per_million is None else round(per_million, 4),
        "keys": [{**k, "usd": round(usd * k["completion_tokens"] / output, 4) if output else 0.0} for k in keys],
    }


@dataclass(frozen=True)
class GenerationStats:
    """What users felt of one generation of a deployment over a window.

    `failed`: answered 5xx, or a stream upstream cut short (a client that left is not a failure). The TTFT
    percentiles are over streamed successes (None: none). `attained`: the lowest share of requests meeting a
    latency target, by observability.attainment's rule (None: no targets, or no request measured)."""

    requests: int
    failed: int
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    attained: float | None

    @property
    def error_rate(self) -> float | None:
        return self.failed / self.requests if self.requests else None


def generation_stats(*, deployment_id: int, generation: int, since: dt.datetime, until: dt.datetime | None = None,
                     targets: TargetsSpec | None = None) -> GenerationStats:
    """GenerationStats of the requests `generation` of the deployment served from `since` to `until` (None: now):
    two aggregate queries."""
    rows = RequestRecord.objects.filter(deployment_id=deployment_id, generation=generation, created_at__gte=since)
    if until is not None:
        rows = rows.filter(created_at__lt=until)
    streamed = Q(stream=True, status_code__lt=400, partial=False, ttft_ms__isnull=False)
    got = rows.aggregate(
        requests=Count("id"),
        # A partial record is a stream cut short: by upstream (a failure) or by its client (error_type below).
        failed=Count("id", filter=Q(status_code__gte=500) | (Q(partial=True) & ~Q(error_type="client_disconnected"))),
        ttft_p50=Percentile("ttft_ms", fraction=0.5, filter=streamed),
        ttft_p95=Percentile("ttft_ms", fraction=0.95, filter=streamed))
    shares = [t.share for t in targets_attainment(rows, targets)[1] if t.requests] if targets else []
    return GenerationStats(requests=got["requests"], failed=got["failed"], ttft_p50_ms=got["ttft_p50"],
                           ttft_p95_ms=got["ttft_p95"], attained=min(shares) if shares else None)
