"""Attainment: the share of a deployment's requests in a window that met each latency target of its spec.

Counted in PostgreSQL from the gateway's per-request records (COUNT ... FILTER and percentile_cont), never by
loading rows. Only answered requests count (status below 400, not cut short), as in the gateway rollups: the
latency of a failed request says nothing about the stage that served it. A request meets the TTFT target when
its time to first token is at most the target, and the ITL target when its mean gap between tokens is (requests
of one chunk have no gap and do not count for ITL).
"""
import datetime as dt
from dataclasses import dataclass

from django.db.models import Aggregate, Count, FloatField, Q

from deployments.spec import TargetsSpec
from observability.rollups import WINDOWS
from usage.models import RequestRecord


class Percentile(Aggregate):
    """PostgreSQL's percentile_cont: the `fraction` percentile of a column over the rows its `filter` keeps
    (`Percentile("ttft_ms", fraction=0.95, filter=Q(...))`). The template must place Django's `%(filter)s`:
    without it the FILTER clause is silently left out (its parameters still passed)."""

    function = "percentile_cont"
    template = "%(function)s(%(fraction)s) WITHIN GROUP (ORDER BY %(expressions)s)%(filter)s"
    output_field = FloatField()

    def __init__(self, expression, *, fraction: float, **extra):
        super().__init__(expression, fraction=float(fraction), **extra)


@dataclass(frozen=True)
class TargetAttainment:
    """One target over one window: how many requests were measured, how many met it, and whether the share that
    did reaches the spec's `share` (None: no request measured)."""

    measure: str  # "ttft" or "itl"
    target_ms: float
    required_share: float
    requests: int
    met: int
    observed_p95_ms: float | None

    @property
    def share(self) -> float | None:
        return self.met / self.requests if self.requests else None

    @property
    def ok(self) -> bool | None:
        return None if not self.requests else self.share >= self.required_share

    def to_json(self) -> dict:
        share = self.share
        return {"measure": self.measure, "target_ms": self.target_ms, "required_share": self.required_share,
                "requests": self.requests, "met": self.met, "share": None if share is None else round(share, 4),
                "ok": self.ok, "observed_p95_ms": None if self.observed_p95_ms is None
                else round(self.observed_p95_ms, 3)}


@dataclass(frozen=True)
class Attainment:
    """Every target of a deployment over one window (`targets` empty when the spec names none)."""

    window: str
    since: dt.datetime
    until: dt.datetime
    requests: int
    targets: tuple[TargetAttainment, ...]

    def of(self, measure: str) -> TargetAttainment | None:
        return next((t for t in self.targets if t.measure == measure), None)

    def to_json(self) -> dict:
        return {"window": self.window, "since": self.since.isoformat(), "until": self.until.isoformat(),
                "requests": self.requests, "targets": [t.to_json() for t in self.targets]}


MEASURES = (("ttft", "ttft_p95_ms", "ttft_ms"), ("itl", "itl_p95_ms", "mean_itl_ms"))


def attainment(*, deployment, targets: TargetsSpec | None, window: str, now: dt.datetime) -> Attainment:
    """Attainment of `targets` by `deployment`'s requests in the `window` (a key of rollups.WINDOWS) up to
    `now`: one aggregate query."""
    since = now - dt.timedelta(seconds=WINDOWS[window][0])
    requests, each = targets_attainment(
        RequestRecord.objects.filter(deployment=deployment, created_at__gte=since, created_at__lt=now), targets)
    return Attainment(window=window, since=since, until=now, requests=requests, targets=each)


def targets_attainment(records, targets: TargetsSpec | None) -> tuple[int, tuple[TargetAttainment, ...]]:
    """How many of `records` (a RequestRecord queryset) were answered, and each target's attainment among them:
    one aggregate query."""
    rows = records.filter(status_code__lt=400, partial=False)
    wanted = {"requests": Count("id")}
    named = []
    for measure, spec_field, column in MEASURES:
        limit = getattr(targets, spec_field) if targets else None
        if limit is None:
            continue
        named.append((measure, limit))
        measured = Q(**{f"{column}__isnull": False})
        wanted |= {f"{measure}_n": Count("id", filter=measured),
                   f"{measure}_met": Count("id", filter=Q(**{f"{column}__lte": limit})),
                   f"{measure}_p95": Percentile(column, fraction=0.95, filter=measured)}
    got = rows.aggregate(**wanted)
    return got["requests"], tuple(
        TargetAttainment(measure=m, target_ms=limit, required_share=targets.share, requests=got[f"{m}_n"],
                         met=got[f"{m}_met"], observed_p95_ms=got[f"{m}_p95"]) for m, limit in named)
