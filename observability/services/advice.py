"""The advisor on stored data: attainment and per-stage rollups of a window in, diagnoses out; and turning a
recommendation into an update through the normal path (a member's, or Tandem's where the team allows it)."""
import datetime as dt
from dataclasses import dataclass, replace

from django.db import transaction
from django.db.models import Sum
from redis.exceptions import RedisError

from controlplane.redis_client import redis_client
from deployments.cost import cluster_prices
from deployments.errors import ActionError, Conflict
from deployments.event_kinds import EventKind
from deployments.lifecycle import Status
from deployments.model_sources import source_roots_of
from deployments.models import Deployment
from deployments.outcomes import Outcome
from deployments.services.actions import deployment_update, deployment_update_by_tandem
from deployments.services.events import event_record
from deployments.spec import spec_request_shape
from observability.advisor import Diagnosis, Recommendation, StageMetrics, advise, stage_metrics_from
from observability.advisor_expected import ModelBasis
from observability.attainment import Attainment, attainment
from observability.histograms import Hist
from observability.models import StageRollup, ThroughputRollup, ValueRollup
from observability.planner import model_facts_read
from observability.selectors import fleet_windows
from observability.rollups import WINDOWS
from observability.snapshot import Increase

AUTO_WINDOW = "1h"  # what Tandem judges by when it applies recommendations itself
# Set once Tandem has said why it left a recommendation alone (deployment, recommendation, proposed spec's hash).
NOT_APPLIED_KEY = "tandem:advice:not-applied:{}:{}:{}"
NOT_APPLIED_SECONDS = 7 * 24 * 3600


@dataclass(frozen=True)
class Advice:
    attainment: Attainment
    diagnoses: tuple[Diagnosis, ...]

    def recommendation(self, rec_id: str) -> Recommendation | None:
        return next((d.recommendation for d in self.diagnoses
                     if d.recommendation is not None and d.recommendation.id == rec_id), None)

    def to_json(self) -> dict:
        return {"attainment": self.attainment.to_json(), "diagnoses": [d.to_json() for d in self.diagnoses]}


def stage_metrics_read(*, deployment, window: str, now: dt.datetime) -> StageMetrics:
    """The engines' rollups of the window, merged per half (so a growing queue shows), as StageMetrics."""
    seconds = WINDOWS[window][0]
    since, middle = now - dt.timedelta(seconds=seconds), now - dt.timedelta(seconds=seconds / 2)
    halves = (Increase(), Increase())
    for row in StageRollup.objects.filter(deployment=deployment, source=StageRollup.Source.ENGINE,
                                          minute__gte=since, minute__lt=now):
        half = halves[row.minute >= middle]
        stored = {"bounds": row.bounds, "counts": row.counts, "sum": row.sum, "count": row.count}
        half.hist.setdefault((row.stage, row.pool), Hist()).add(Hist.from_json(stored))
    for row in ValueRollup.objects.filter(deployment=deployment, kind=ValueRollup.Kind.PEAK,
                                          minute__gte=since, minute__lt=now):
        half = halves[row.minute >= middle]
        half.gauge[(row.name, row.pool)] = max(half.gauge.get((row.name, row.pool), row.value), row.value)
    traffic = ThroughputRollup.objects.filter(deployment=deployment, minute__gte=since, minute__lt=now).aggregate(
        requests=Sum("requests"), prompt=Sum("prompt_tokens"), output=Sum("completion_tokens"))
    return replace(stage_metrics_from(*halves, window=window, seconds=seconds), requests=traffic["requests"] or 0,
                   prompt_tokens=traffic["prompt"] or 0, output_tokens=traffic["output"] or 0)


def model_basis_read(*, deployment: Deployment, now: dt.datetime) -> ModelBasis:
    """What the advisor predicts with: the facts of the model's config.json where the cluster's model sources let
    Tandem read it (the one source of a stored deployment's facts; else why not), at the engine's dtype, and what
    running deployments of the same model measured (this one included; the team's named, others not)."""
    spec = deployment.spec_typed
    facts, why = model_facts_read(spec.model_source, source_roots_of(cluster=deployment.cluster,
                                                                     team=deployment.team))
    if facts is None:
        return ModelBasis(None, why)
    if spec.engine.dtype != "auto":
        facts = replace(facts, dtype=spec.engine.dtype)
    return ModelBasis(facts, fleet=tuple(fleet_windows(spec, team=deployment.team, now=now)))


def deployment_advice(*, deployment: Deployment, window: str, now: dt.datetime) -> Advice:
    """Attainment of the deployment's targets over the window and what the advisor makes of it."""
    spec = deployment.spec_typed
    att = attainment(deployment=deployment, targets=spec.targets, window=window, now=now)
    if not att.targets:
        return Advice(att, ())
    metrics = stage_metrics_read(deployment=deployment, window=window, now=now)
    model = model_basis_read(deployment=deployment, now=now)
    return Advice(att, tuple(advise(spec=spec, attainment=att, metrics=metrics, model=model,
                                    prices=cluster_prices(deployment.cluster))))


def _stale(rec_id: str) -> Conflict:
    return Conflict(f"Recommendation {rec_id!r} is not among the current ones (the figures or the spec changed "
                    "since it was shown). Reload the advice and choose again.")


@transaction.atomic
def recommendation_apply(*, actor, deployment: Deployment, rec_id: str, window: str,
                         now: dt.datetime) -> Deployment:
    """A member turns a recommendation into an update: applied at once within the approved bounds, otherwise a
    proposed update waiting for approval (deployments.services.actions.deployment_update decides)."""
    rec = deployment_advice(deployment=deployment, window=window, now=now).recommendation(rec_id)
    if rec is None:
        raise _stale(rec_id)
    done = deployment_update(actor=actor, deployment=deployment, spec=spec_request_shape(rec.spec))
    if done.outcome == Outcome.UNCHANGED:
        return done.deployment  # asked again for what already waits: nothing new to record
    event_record(kind=EventKind.RECOMMENDATION_ACCEPTED, deployment=done.deployment, actor=actor,
                 message=rec.summary, after={"recommendation": rec.to_json(), "window": window})
    return done.deployment


def recommendations_auto_apply(*, deployment_id: int, now: dt.datetime) -> str | None:
    """For a team that allows it: apply the first current recommendation that stays within the approved
    bounds, as Tandem, with an audited event; returns its summary (None: nothing applied). A deployment is judged
    only once it has run unchanged for the whole window, so one episode is not answered twice."""
    d = Deployment.objects.select_related("team", "cluster").get(pk=deployment_id)
    if not d.team.auto_apply_recommendations or d.status != Status.RUNNING or d.spec_typed.targets is None:
        return None
    if d.status_changed_at and d.status_changed_at > now - dt.timedelta(seconds=WINDOWS[AUTO_WINDOW][0]):
        return None  # judge only a window the running spec served all through (not one before the last change)
    advice = deployment_advice(deployment=d, window=AUTO_WINDOW, now=now)
    rec = next((x.recommendation for x in advice.diagnoses
                if x.recommendation is not None and not x.recommendation.needs_approval), None)
    if rec is None:
        return None
    try:
        with transaction.atomic():
            d = deployment_update_by_tandem(deployment=d, spec=rec.spec,
                                            reason=f"Applied the advisor's recommendation: {rec.summary}.")
            event_record(kind=EventKind.RECOMMENDATION_AUTO_APPLIED, deployment=d, message=rec.summary,
                         after={"recommendation": rec.to_json(), "window": AUTO_WINDOW})
    except ActionError as e:  # someone's proposed update waits, or the deployment moved on since it was read
        _not_applied(deployment=d, rec=rec, why=e.message)
        return None
    return rec.summary


def _not_applied(*, deployment: Deployment, rec: Recommendation, why: str) -> None:
    """Say why Tandem left a recommendation alone, once per recommendation and proposed update (the beat asks
    again every few minutes while, say, a proposal waits for days); a Redis that cannot say records it again."""
    key = NOT_APPLIED_KEY.format(deployment.pk, rec.id, deployment.proposed_spec_hash)
    try:
        if not redis_client(timeout=2).set(key, 1, nx=True, ex=NOT_APPLIED_SECONDS):
            return
    except RedisError:
        pass
    event_record(kind=EventKind.RECOMMENDATION_NOT_APPLIED, deployment=deployment,
                 message=f"Not applied: {rec.summary}. {why}",
                 after={"recommendation": rec.to_json(), "window": AUTO_WINDOW})
