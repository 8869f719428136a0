"""Reads for the planner: what running deployments measured (observability.fleet_calibration's windows)."""
import datetime as dt

from django.db.models import Avg, Sum
from django.db.models.functions import TruncHour

from deployments.catalog import INSTANCE_TYPES
from deployments.lifecycle import Status
from deployments.models import Deployment
from deployments.selectors import deployments_visible_to
from deployments.spec import DeploymentSpec
from observability.fleet_calibration import LOOKBACK, MIN_REQUESTS, WINDOW, FleetWindow
from observability.models import StageRollup, ThroughputRollup, ValueRollup


def _per_hour(qs, **sums) -> dict:
    return {row["hour"]: row for row in qs.annotate(hour=TruncHour("minute", tzinfo=dt.UTC)).values("hour")
            .annotate(**sums)}


def _deployment_windows(d: Deployment, label: str, since: dt.datetime, until: dt.datetime) -> list[FleetWindow]:
    """The deployment's latest complete hour with MIN_REQUESTS requests at the gateway, per stage with engine data."""
    spec = d.spec_typed
    span = {"deployment": d, "minute__gte": since, "minute__lt": until}
    traffic = _per_hour(ThroughputRollup.objects.filter(**span), requests=Sum("requests"),
                        prompt=Sum("prompt_tokens"), output=Sum("completion_tokens"))
    engine = StageRollup.objects.filter(source=StageRollup.Source.ENGINE, **span)
    stages = {"prefill": _per_hour(engine.filter(stage="prefill", pool="prefill"), s=Sum("sum"), n=Sum("count")),
              "decode": _per_hour(engine.filter(stage="itl", pool="decode"), s=Sum("sum"), n=Sum("count"))}
    peaks = ValueRollup.objects.filter(name="running", pool="decode", kind=ValueRollup.Kind.PEAK, **span)
    running = _per_hour(peaks, v=Avg("value"))
    out = []
    for stage, hours in stages.items():
        pool = spec.pool(stage)
        for hour in sorted(hours, reverse=True):
            t, e = traffic.get(hour), hours[hour]
            if not t or t["requests"] < MIN_REQUESTS or not e["n"]:
                continue
            prompt, output = t["prompt"] / t["requests"], t["output"] / t["requests"]
            if stage == "decode" and hour not in running:
                continue  # the batch is not known: a ratio at a guessed batch would mislead
            seqs = max(running[hour]["v"] / pool.replicas_max, 1.0) if stage == "decode" else 0.0
            out.append(FleetWindow(stage=stage, deployment=label, gpu=INSTANCE_TYPES[pool.instance_type].gpu,
                                   tensor_parallel_size=pool.tensor_parallel_size, window_end=hour + WINDOW,
                                   requests=t["requests"], measured_ms=e["s"] / e["n"], prompt_tokens=prompt,
                                   sequences=seqs, context_tokens=prompt + output / 2))
            break
    return out


def fleet_windows(spec: DeploymentSpec, *, user=None, team=None, now: dt.datetime) -> list[FleetWindow]:
    """For each running deployment of the same weights (model source): its latest complete hour of enough traffic,
    per stage. Named are the deployments the user can see, or those of `team` (the advisor's lines, which the
    team reads and its events keep); any other only as another team's."""
    until = now.replace(minute=0, second=0, microsecond=0)
    running = Deployment.objects.filter(status=Status.RUNNING, model_source=spec.model_source) \
        .select_related("team")
    if user is not None:
        visible = set(deployments_visible_to(user).values_list("id", flat=True))
    else:
        visible = {d.pk for d in running if team is not None and d.team_id == team.pk}
    windows = []
    for d in running:
        label = f"{d.team.slug}/{d.name}" if d.pk in visible else "of another team"
        windows += _deployment_windows(d, label, until - LOOKBACK, until)
    return windows


def fleet_reader(*, user, now: dt.datetime):
    """What plan_for_spec / plan_with_facts take as `fleet`: one reader per request, reading each model source once
    however many plans it serves (the approvals queue plans a page of requests)."""
    seen: dict[str, list[FleetWindow]] = {}

    def read(spec: DeploymentSpec) -> list[FleetWindow]:
        if spec.model_source not in seen:
            seen[spec.model_source] = fleet_windows(spec, user=user, now=now)
        return seen[spec.model_source]

    return read
