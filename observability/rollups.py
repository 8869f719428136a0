"""Per-minute rollups: writing scrape increases and gateway timings, reading series for charts, retention."""
import datetime as dt
import math

from django.conf import settings
from django.db import transaction
from django.db.models import Q

from observability.histograms import Hist
from observability.models import StageRollup, ThroughputRollup, ValueRollup
from observability.snapshot import Increase
from usage.models import RequestRecord

# What the charts show: (stage, source) ← the stored (stage, pool) that answers it best.
STAGE_VIEW = [
    ("queue", "engine", "queue", "prefill"),
    ("prefill", "engine", "prefill", "prefill"),
    ("ttft", "engine", "ttft", "prefill"),
    ("kv_transfer", "engine", "kv_transfer", "decode"),
    ("decode", "engine", "decode", "decode"),
    ("itl", "engine", "itl", "decode"),
    ("e2e", "engine", "serve", "ingress"),
    ("ttft", "gateway", "ttft", "gateway"),
    ("itl", "gateway", "itl", "gateway"),
    ("e2e", "gateway", "e2e", "gateway"),
]
WINDOWS = {"15m": (900, 60), "1h": (3600, 60), "6h": (21600, 300), "24h": (86400, 900)}
# Upper bounds (ms) for gateway timings, which arrive as raw per-request values.
GATEWAY_BOUNDS_MS = [1, 2, 5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 400, 500, 750, 1000, 1500, 2000, 3000, 4000,
                     5000, 7500, 10000, 15000, 20000, 30000, 60000, 120000, 300000]


def minute_of(t: dt.datetime) -> dt.datetime:
    return t.replace(second=0, microsecond=0)


@transaction.atomic
def rollup_increase(*, deployment_id: int, minute: dt.datetime, inc: Increase) -> int:
    """Add one scrape's increase to the minute's rows (several scrapes a minute add up); returns rows touched."""
    touched = 0
    for (stage, pool), h in inc.hist.items():
        if not h.count:
            continue
        row, _ = StageRollup.objects.select_for_update().get_or_create(
            deployment_id=deployment_id, minute=minute, stage=stage, source=StageRollup.Source.ENGINE, pool=pool)
        merged = (Hist.from_json(_as_json(row)) if row.count else Hist()).add(h)
        _store(row, merged)
        touched += 1
    values = [(n, p, ValueRollup.Kind.INCREASE, v) for (n, p), v in inc.counter.items() if v]
    values += [(n, p, ValueRollup.Kind.PEAK, v) for (n, p), v in inc.gauge.items()]
    for name, pool, kind, v in values:
        row, created = ValueRollup.objects.select_for_update().get_or_create(
            deployment_id=deployment_id, minute=minute, name=name, pool=pool, defaults={"kind": kind, "value": v})
        if not created:
            row.value = row.value + v if kind == ValueRollup.Kind.INCREASE else max(row.value, v)
            row.save(update_fields=["value"])
        touched += 1
    return touched


def _as_json(row: StageRollup) -> dict:
    return {"bounds": row.bounds, "counts": row.counts, "sum": row.sum, "count": row.count}


def _store(row: StageRollup, h: Hist) -> None:
    data = h.to_json()
    row.bounds, row.counts, row.sum, row.count = data["bounds"], data["counts"], data["sum"], data["count"]
    row.save()


@transaction.atomic
def gateway_rollup(*, since: dt.datetime, until: dt.datetime) -> int:
    """Recompute gateway rollups for whole minutes in [since, until) from RequestRecord (idempotent: late rows
    drained from the gateway's stream are picked up by the next run over the same minutes)."""
    since, until = minute_of(since), minute_of(until)
    StageRollup.objects.filter(source=StageRollup.Source.GATEWAY, minute__gte=since, minute__lt=until).delete()
    ThroughputRollup.objects.filter(minute__gte=since, minute__lt=until).delete()
    rows = RequestRecord.objects.filter(created_at__gte=since, created_at__lt=until, deployment__isnull=False) \
        .values_list("deployment_id", "created_at", "status_code", "partial", "prompt_tokens",
                     "completion_tokens", "ttft_ms", "e2e_ms", "mean_itl_ms")
    grouped: dict[tuple[int, dt.datetime], list] = {}
    for r in rows.iterator():
        grouped.setdefault((r[0], minute_of(r[1])), []).append(r)
    stage_rows, tp_rows = [], []
    for (dep, minute), recs in grouped.items():
        tp_rows.append(ThroughputRollup(deployment_id=dep, minute=minute, requests=len(recs),
                                        prompt_tokens=sum(r[4] for r in recs),
                                        completion_tokens=sum(r[5] for r in recs)))
        ok = [r for r in recs if r[2] < 400 and not r[3]]  # latency of failed or cut-short requests misleads
        for stage, idx in (("ttft", 6), ("e2e", 7), ("itl", 8)):
            values = [r[idx] for r in ok if r[idx] is not None]
            if values:
                h = Hist.from_values(values, GATEWAY_BOUNDS_MS).to_json()
                stage_rows.append(StageRollup(deployment_id=dep, minute=minute, stage=stage,
                                              source=StageRollup.Source.GATEWAY, pool="gateway", count=h["count"],
                                              sum=h["sum"], bounds=h["bounds"], counts=h["counts"]))
    StageRollup.objects.bulk_create(stage_rows)
    ThroughputRollup.objects.bulk_create(tp_rows)
    return len(stage_rows) + len(tp_rows)


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def latency_series(*, deployment, window: str, now: dt.datetime) -> dict:
    """The charts' JSON: percentiles per stage and throughput per bucket over the window (contract in views)."""
    span, step = WINDOWS[window]
    end_epoch = math.ceil(now.timestamp() / step) * step
    start = dt.datetime.fromtimestamp(end_epoch - span, tz=dt.UTC)
    end = dt.datetime.fromtimestamp(end_epoch, tz=dt.UTC)
    n = span // step
    times = [start + dt.timedelta(seconds=i * step) for i in range(n)]

    def slot(minute: dt.datetime) -> int:
        return int((minute - start).total_seconds() // step)

    wanted = Q()
    for _, source, stage, pool in STAGE_VIEW:
        wanted |= Q(source=source, stage=stage, pool=pool)
    hists: dict[tuple[str, str, str], list[Hist]] = {}
    rows = StageRollup.objects.filter(wanted, deployment=deployment, minute__gte=start, minute__lt=end)
    for row in rows.iterator():
        per = hists.setdefault((row.stage, row.source, row.pool), [Hist() for _ in range(n)])
        per[slot(row.minute)].add(Hist.from_json(_as_json(row)))
    stages = []
    for view_stage, source, stage, pool in STAGE_VIEW:
        per = hists.get((stage, source, pool)) or [Hist() for _ in range(n)]
        stages.append({"stage": view_stage, "source": source, "unit": "ms", "points": [
            {"t": t.isoformat(), "count": h.count, "p50": _round(h.quantile(0.5)), "p95": _round(h.quantile(0.95)),
             "p99": _round(h.quantile(0.99))} for t, h in zip(times, per, strict=True)]})
    tp = [{"t": t.isoformat(), "requests": 0, "prompt_tokens": 0, "completion_tokens": 0} for t in times]
    for row in ThroughputRollup.objects.filter(deployment=deployment, minute__gte=start, minute__lt=end):
        p = tp[slot(row.minute)]
        p["requests"] += row.requests
        p["prompt_tokens"] += row.prompt_tokens
        p["completion_tokens"] += row.completion_tokens
    return {"window": window, "bucket_seconds": step, "stages": stages, "throughput": tp}


def rollups_prune(*, now: dt.datetime, keep_days: int | None = None) -> int:
    """Delete rollups older than the retention (TANDEM_ROLLUP_RETENTION_DAYS, default 14); returns rows deleted."""
    keep = keep_days if keep_days is not None else settings.TANDEM_ROLLUP_RETENTION_DAYS
    cutoff = now - dt.timedelta(days=keep)
    deleted = 0
    for model in (StageRollup, ValueRollup, ThroughputRollup):
        deleted += model.objects.filter(minute__lt=cutoff).delete()[0]
    return deleted
