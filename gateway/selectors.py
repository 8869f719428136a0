"""Reads of gateway usage for the REST API."""
import datetime as dt

from django.db.models import Count, Max, Q, Sum
from django.utils import timezone

from gateway.models import RequestRecord


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


def output_tokens(*, deployment, since: dt.datetime, until: dt.datetime) -> int:
    """Completion tokens the deployment generated through the gateway in [since, until)."""
    return RequestRecord.objects.filter(deployment=deployment, created_at__gte=since, created_at__lt=until) \
        .aggregate(n=Sum("completion_tokens"))["n"] or 0
