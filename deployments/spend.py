"""Reads of what deployments cost: a team's spend per day and deployment, a month so far, one deployment's rate.

The arithmetic is deployments.cost's; this module only loads the timelines (one query per team) and the prices.
"""
import datetime as dt
from collections import defaultdict
from dataclasses import dataclass

from django.db.models import Q

from deployments.cost import (TIMELINE_KEYS, billed_since, cluster_prices, daily_rows, provisioned_segments,
                              ready_estimate_seconds, surge_hourly_usd, surge_segments, timeline_marks)
from deployments.lifecycle import BILLED
from deployments.models import Deployment, Event, Rollout, Team
from deployments.services.rollouts import rollout_surge_held
from deployments.surge import rollout_surge

_TIMELINE = Q(after__has_any_keys=list(TIMELINE_KEYS))


def month_bounds(month: str | None, *, now: dt.datetime) -> tuple[dt.datetime, dt.datetime]:
    """[first instant, first instant of the next month) of "YYYY-MM" (None: this month), in UTC."""
    if month is None:
        start = now.astimezone(dt.UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    else:
        start = dt.datetime.strptime(month, "%Y-%m").replace(tzinfo=dt.UTC)
    return start, (start + dt.timedelta(days=32)).replace(day=1)


def _surging(deployments, *, until: dt.datetime) -> dict[int, list[tuple]]:
    """Each deployment's side-by-side rollouts begun before `until`, as (start, end or None) intervals."""
    spans = defaultdict(list)
    for row in (Rollout.objects.filter(deployment__in=deployments, mode=Rollout.Mode.SIDE_BY_SIDE,
                                       created_at__lt=until).values("deployment_id", "created_at", "finished_at")):
        spans[row["deployment_id"]].append((row["created_at"], row["finished_at"]))
    return spans


def _segments(d: Deployment, events_of, rollouts, *, until: dt.datetime) -> list:
    """The deployment's provisioned nodes up to `until`: its specs' over its billed time, and its rollouts' surges."""
    marks = timeline_marks(events_of)
    return provisioned_segments(marks, until=until) + surge_segments(
        marks, rollouts, until=until, surge_of=lambda spec: rollout_surge(spec, target_kind=d.cluster.kind))


def team_spend_rows(*, team: Team, since: dt.datetime, until: dt.datetime) -> list[dict]:
    """One row per UTC day, deployment, pool and instance type: node-hours provisioned and USD, for chargeback."""
    deployments = {d.pk: d for d in Deployment.objects.filter(team=team).select_related("cluster")}
    timelines = defaultdict(list)
    events = (Event.objects.filter(deployment__team=team, created_at__lt=until).filter(_TIMELINE)
              .values("deployment_id", "created_at", "after"))
    for row in events:
        timelines[row["deployment_id"]].append(row)
    surging = _surging(Deployment.objects.filter(team=team), until=until)
    rows = []
    for pk, events_of in timelines.items():
        d = deployments[pk]
        prices = cluster_prices(d.cluster)
        segments = _segments(d, events_of, surging.get(pk, []), until=until)
        for r in daily_rows(segments, since=since, until=until, prices=prices):
            rows.append({**r, "deployment_id": pk, "deployment": d.name, "cluster": d.cluster.name})
    return sorted(rows, key=lambda r: (r["date"], r["deployment"], r["deployment_id"]))


@dataclass(frozen=True)
class TeamSpend:
    """A team's spend over a period: per day by deployment (for the chart), per deployment, and the rows."""

    since: dt.datetime
    until: dt.datetime
    rows: list[dict]

    @property
    def total_usd(self) -> float:
        return sum(r["usd"] for r in self.rows)

    def by_day(self) -> list[dict]:
        days: dict = {}
        for r in self.rows:
            day = days.setdefault(r["date"], {"date": r["date"], "usd": 0.0, "by_deployment": {}})
            day["usd"] += r["usd"]
            day["by_deployment"][r["deployment"]] = day["by_deployment"].get(r["deployment"], 0.0) + r["usd"]
        return [days[k] for k in sorted(days)]

    def by_deployment(self) -> list[dict]:
        out: dict = {}
        for r in self.rows:
            d = out.setdefault(r["deployment_id"], {"id": r["deployment_id"], "name": r["deployment"],
                                                    "usd": 0.0, "node_hours": 0.0})
            d["usd"] += r["usd"]
            d["node_hours"] += r["node_hours"]
        return sorted(out.values(), key=lambda d: (-d["usd"], d["name"]))


def team_spend(*, team: Team, since: dt.datetime, until: dt.datetime) -> TeamSpend:
    return TeamSpend(since=since, until=until, rows=team_spend_rows(team=team, since=since, until=until))


def team_month_to_date_usd(*, team: Team, now: dt.datetime) -> float:
    """What the team's deployments have cost since the first of this month (UTC)."""
    since, _ = month_bounds(None, now=now)
    return team_spend(team=team, since=since, until=now).total_usd


def deployment_hourly_usd(d: Deployment) -> float:
    """What the deployment costs per hour now: its pools' price (stored with its spec) while they are provisioned,
    and the nodes its side-by-side rollout adds while one is in progress, else nothing."""
    if d.status not in BILLED or d.released_at is not None:
        return 0.0
    surge = rollout_surge_held(d)
    extra = surge_hourly_usd(d.spec_typed, surge, prices=cluster_prices(d.cluster)) if surge else 0.0
    return (d.hourly_usd or 0.0) + extra


def deployment_spend_usd(*, deployment: Deployment, since: dt.datetime, until: dt.datetime) -> float:
    """What one deployment cost over [since, until)."""
    events = deployment.events.filter(_TIMELINE, created_at__lt=until).values("created_at", "after")
    rollouts = _surging([deployment], until=until).get(deployment.pk, [])
    segments = _segments(deployment, events, rollouts, until=until)
    return sum(r["usd"] for r in daily_rows(segments, since=since, until=until,
                                            prices=cluster_prices(deployment.cluster)))


@dataclass(frozen=True)
class BilledStretch:
    """How long a deployment's nodes have been billed without a break, and what that cost."""

    since: dt.datetime
    hours: float
    usd: float


def deployment_billed_stretch(*, deployment: Deployment, now: dt.datetime) -> BilledStretch | None:
    """Its nodes' current stretch of billing (None when nothing is billed now): what a release reports."""
    since = billed_since(timeline_marks(deployment.events.filter(_TIMELINE, created_at__lt=now)
                                        .values("created_at", "after")))
    if since is None:
        return None
    return BilledStretch(since=since, hours=(now - since).total_seconds() / 3600,
                         usd=deployment_spend_usd(deployment=deployment, since=since, until=now))


def deployment_ready_estimate(deployment: Deployment) -> int:
    """Seconds a resume of this deployment is expected to take, from its own history (deployments.cost)."""
    events = deployment.events.filter(after__has_key="status").values("created_at", "after")
    return ready_estimate_seconds(timeline_marks(events))
