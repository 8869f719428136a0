"""What a deployment costs, from its own timeline: pure functions over the status and spec changes it went through.

A deployment's timeline is its status changes (`deployment_transition`'s events, `after.status`), the specs it was
given (`after.spec`: the request, its edits, approved and applied updates) and the release of a failed one's nodes
(`after.released`, workers.pipeline). While its status is one of lifecycle.BILLED, and not released, its pools'
nodes are provisioned: each pool's nodes × hours × the instance's price per hour (the cluster's `Prices`). A paused
deployment costs nothing: on EKS its node groups are at zero, elsewhere nothing of it runs. What a spec costs per
hour is `spec_hourly_usd` at the cluster's prices, the one figure that cost, budgets, previews, approvals, the
planner, the advisor and the request form show, so what an approver sees is what the team is charged.
"""
import datetime as dt
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field

from deployments.catalog import INSTANCE_TYPES
from deployments.lifecycle import BILLED, DEFAULT_READY_SECONDS, STARTING, Status
from deployments.serve_config import STAGES
from deployments.spec import DeploymentSpec, spec_load
from deployments.surge import Surge

# Events a timeline is read from: only these carry a status, a spec or a release (a filter for the query).
TIMELINE_KEYS = ("status", "spec", "released")
READY_HISTORY = 5  # the latest this many starts decide the estimate


@dataclass(frozen=True)
class Mark:
    """One point of a deployment's timeline: a status change, or the spec in effect from then on, or both; or the
    release of what a failed deployment ran on (nothing billed from then until its next status change)."""

    at: dt.datetime
    status: str | None = None
    spec: dict | None = None
    released: bool = False


@dataclass(frozen=True)
class Segment:
    """One pool's nodes, provisioned from `start` to `end`."""

    start: dt.datetime
    end: dt.datetime
    stage: str
    instance_type: str
    nodes: int

    @property
    def node_hours(self) -> float:
        return self.nodes * (self.end - self.start).total_seconds() / 3600


def timeline_marks(rows) -> list[Mark]:
    """Marks from event rows ({"created_at", "after"} dicts, any order); rows with neither key are skipped."""
    marks = []
    for row in rows:
        after = row.get("after") if isinstance(row.get("after"), dict) else {}
        status, spec, released = after.get("status"), after.get("spec"), after.get("released") is True
        if status is None and not isinstance(spec, dict) and not released:
            continue
        marks.append(Mark(at=row["created_at"], status=status, spec=spec if isinstance(spec, dict) else None,
                          released=released))
    return sorted(marks, key=lambda m: m.at)


def provisioned_segments(marks: list[Mark], *, until: dt.datetime) -> list[Segment]:
    """Each pool's provisioned intervals up to `until`: while the status is billed and nothing released them, with
    the spec of the time."""
    segments: list[Segment] = []
    status, spec, released = None, None, False
    for i, mark in enumerate(marks):
        if mark.status is not None:
            status, released = mark.status, False
        released = released or mark.released
        spec = mark.spec or spec
        end = min(marks[i + 1].at if i + 1 < len(marks) else until, until)
        if status not in BILLED or released or spec is None or end <= mark.at:
            continue
        for stage in STAGES:
            pool = spec.get(stage) or {}
            if isinstance(pool.get("nodes"), int) and pool["nodes"] > 0:
                segments.append(Segment(mark.at, end, stage, str(pool.get("instance_type")), pool["nodes"]))
    return segments


@dataclass(frozen=True)
class Prices:
    """USD per node-hour by instance type: a cluster's own price where its config sets one (`prices`, for reserved
    or spot capacity), else the catalog's on-demand price. Built from a cluster only by `cluster_prices`."""

    own: dict[str, float] = field(default_factory=dict)

    def node_hour_usd(self, instance_type: str) -> float | None:
        """None for a type that neither the cluster nor the catalog prices."""
        if instance_type in self.own:
            return self.own[instance_type]
        instance = INSTANCE_TYPES.get(instance_type)
        return instance.hourly_usd if instance else None

    def pools_hourly_usd(self, pools: Iterable[tuple[object, object]]) -> float | None:
        """USD per hour of (instance type, nodes) pairs; None while one is not priced or its nodes are not a whole
        number (a half-typed request form)."""
        total = 0.0
        for instance_type, nodes in pools:
            price = self.node_hour_usd(instance_type) if isinstance(instance_type, str) else None
            if price is None or isinstance(nodes, bool) or not isinstance(nodes, int):
                return None
            total += price * nodes
        return total


# The catalog's on-demand prices alone: for a plan that names no cluster.
ON_DEMAND = Prices()


def cluster_prices(cluster) -> Prices:
    """The prices a cluster's deployments are charged at (its config's `prices` are checked on save:
    deployments.cluster_config.prices_errors)."""
    return Prices(own={t: float(usd) for t, usd in cluster.config_typed.prices.items()})


def spec_hourly_usd(spec: DeploymentSpec, *, prices: Prices) -> float | None:
    """USD per hour of the spec's nodes while they are provisioned (None for an instance type nobody prices)."""
    return prices.pools_hourly_usd((spec.pool(stage).instance_type, spec.pool(stage).nodes) for stage in STAGES)


def surge_hourly_usd(spec: DeploymentSpec, surge: Surge, *, prices: Prices) -> float:
    """USD per hour of the nodes a side-by-side rollout to `spec` adds (deployments.surge); nothing unpriced."""
    return prices.pools_hourly_usd((spec.pool(stage).instance_type, n) for stage, n in surge.nodes.items()) or 0.0


def surge_segments(marks: list[Mark], rollouts: Iterable[tuple[dt.datetime, dt.datetime | None]], *,
                   surge_of, until: dt.datetime) -> list[Segment]:
    """The nodes each side-by-side rollout added, from its start to its end (or `until`), for the spec in effect
    when it started (the update's, recorded just before it). `surge_of` maps a spec to its Surge (the
    deployment's cluster kind bound: deployments.surge.rollout_surge)."""
    segments = []
    for start, end in rollouts:
        end = min(end or until, until)
        spec = None
        for mark in marks:
            if mark.at > start:
                break
            spec = mark.spec or spec
        if spec is None or end <= start:
            continue
        for stage, nodes in surge_of(spec_load(spec)).nodes.items():
            if nodes > 0:
                segments.append(Segment(start, end, stage, str(spec[stage]["instance_type"]), nodes))
    return segments


def _day_start(t: dt.datetime) -> dt.datetime:
    return t.astimezone(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def daily_rows(segments: list[Segment], *, since: dt.datetime, until: dt.datetime,
               prices: Prices) -> list[dict]:
    """Node-hours and USD per UTC day, pool and instance type, within [since, until), in date order."""
    out: dict[tuple, dict] = {}
    for seg in segments:
        start, end = max(seg.start, since), min(seg.end, until)
        while start < end:
            day = _day_start(start)
            cut = min(end, day + dt.timedelta(days=1))
            key = (day.date(), seg.stage, seg.instance_type)
            row = out.setdefault(key, {"date": day.date(), "stage": seg.stage, "instance_type": seg.instance_type,
                                       "node_hours": 0.0, "usd": 0.0})
            hours = seg.nodes * (cut - start).total_seconds() / 3600
            row["node_hours"] += hours
            row["usd"] += hours * (prices.node_hour_usd(seg.instance_type) or 0.0)  # no price, no charge
            start = cut
    return [out[k] for k in sorted(out, key=lambda k: (k[0], STAGES.index(k[1]) if k[1] in STAGES else 9, k[2]))]


def billed_since(marks: list[Mark]) -> dt.datetime | None:
    """When the deployment's nodes last started to be billed without a break (None: they are not billed now)."""
    since, billed = None, False
    for mark in marks:
        if mark.released:
            since, billed = None, False
        elif mark.status is not None:
            now_billed = mark.status in BILLED
            since = since if billed and now_billed else (mark.at if now_billed else None)
            billed = now_billed
    return since


def ready_durations(marks: list[Mark]) -> list[float]:
    """Seconds from each start (approved, or resumed from paused) to the running that followed, oldest first."""
    durations, started, previous = [], None, None
    for mark in marks:
        if mark.status is None:
            continue
        if mark.status == Status.APPROVED or (mark.status == Status.PROVISIONING and previous == Status.PAUSED):
            started = mark.at
        elif mark.status == Status.RUNNING and started is not None:
            durations.append((mark.at - started).total_seconds())
            started = None
        elif mark.status not in STARTING:  # it failed, or was paused or deleted on the way
            started = None
        previous = mark.status
    return durations


def ready_estimate_seconds(marks: list[Mark], *, default: int = DEFAULT_READY_SECONDS) -> int:
    """Expected seconds from a resume to serving: the median of the latest starts, or `default` without any."""
    durations = ready_durations(marks)[-READY_HISTORY:]
    return max(1, round(statistics.median(durations))) if durations else default


def cost_per_million(usd: float, output_tokens: int) -> float | None:
    """USD per million output tokens (None when nothing was generated)."""
    return usd / output_tokens * 1_000_000 if output_tokens else None
