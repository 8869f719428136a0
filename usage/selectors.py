"""Reads of gateway usage for the REST API."""
import datetime as dt

from django.db.models import Count, Max, Q, Sum
from django.utils import timezone

from deployments.cost import cost_per_million
from deployments.spend import deployment_hourly_usd, deployment_spend_usd
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


# TEMPORARY (lead): replaced by the gw branch's generation_stats on merge.
from dataclasses import dataclass  # noqa: E402


@dataclass(frozen=True)
class GenerationStats:
    requests: int
    failed: int
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    attained: float | None


def generation_stats(*, deployment_id, generation, since, until=None, targets=None) -> GenerationStats:
    import statistics
    rows = RequestRecord.objects.filter(deployment_id=deployment_id, generation=generation, created_at__gte=since)
    if until is not None:
        rows = rows.filter(created_at__lte=until)
    rows = list(rows.values("status_code", "ttft_ms", "error_type"))
    ttfts = sorted(r["ttft_ms"] for r in rows if r["ttft_ms"] is not None and r["status_code"] < 400)
    return GenerationStats(requests=len(rows), failed=sum(r["status_code"] >= 500 for r in rows),
                           ttft_p50_ms=statistics.median(ttfts) if ttfts else None,
                           ttft_p95_ms=ttfts[int(0.95 * (len(ttfts) - 1))] if ttfts else None, attained=None)
