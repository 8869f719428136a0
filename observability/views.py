"""REST views: per-stage latency series, attainment and advice, conformance results, and the capacity planner."""
from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from deployments.cost import ON_DEMAND, Prices, cluster_prices
from deployments.model_sources import SourceRoots, source_roots_of
from deployments.models import Cluster
from deployments.selectors import deployments_visible_to, teams_visible_to
from deployments.api.spec_field import SpecField
from deployments.spec import SpecError, spec_parse_field
from observability.models import ConformanceRun
from observability.planner import plan_with_facts
from observability.selectors import fleet_reader
from observability.rollups import WINDOWS, latency_series
from observability.services.advice import deployment_advice, recommendation_apply
from observability.services.conformance_requests import conformance_request


def _deployment(request, pk):
    return get_object_or_404(deployments_visible_to(request.user), pk=pk)


def _window(request) -> str:
    window = request.query_params.get("window", "1h")
    if window not in WINDOWS:
        raise ValidationError({"window": [f"One of {', '.join(WINDOWS)}; got {window!r}."]})
    return window


WINDOW_PARAM = OpenApiParameter("window", str, enum=list(WINDOWS), default="1h")


class DeploymentLatencyView(APIView):
    """Per-stage latency percentiles (engine and gateway) and throughput over a window, for charts."""

    @extend_schema(parameters=[WINDOW_PARAM], responses=OpenApiTypes.OBJECT)
    def get(self, request, pk: int):
        d = _deployment(request, pk)
        return Response(latency_series(deployment=d, window=_window(request), now=timezone.now()))


class DeploymentAttainmentView(APIView):
    """The share of the window's requests that met each latency target of the spec, and the advisor's
    diagnoses by stage with their evidence and recommendations."""

    @extend_schema(parameters=[WINDOW_PARAM], responses=OpenApiTypes.OBJECT)
    def get(self, request, pk: int):
        d = _deployment(request, pk)
        return Response({"deployment": d.pk, **deployment_advice(deployment=d, window=_window(request),
                                                                 now=timezone.now()).to_json()})


class RecommendationApplyView(APIView):
    """Turn a recommendation (its id, from the attainment view of the same window) into an update: applied at
    once within the approved replica bounds, otherwise proposed for approval; 409 when it is no longer current."""

    @extend_schema(parameters=[WINDOW_PARAM], request=None, responses=OpenApiTypes.OBJECT)
    def post(self, request, pk: int, rec_id: str):
        d = recommendation_apply(actor=request.user, deployment=_deployment(request, pk), rec_id=rec_id,
                                 window=_window(request), now=timezone.now())
        return Response({"deployment": d.pk, "status": d.status, "generation": d.generation,
                         "proposed": d.proposal_open})


def _run_json(run: ConformanceRun | None) -> dict | None:
    if run is None:
        return None
    return {"id": run.pk, "started_at": run.started_at.isoformat(),
            "finished_at": run.finished_at.isoformat() if run.finished_at else None, "model": run.model,
            "passed": run.passed, "summary": run.summary, "pd_health": run.pd_health,
            "checks": [{"name": c.name, "passed": c.passed, "evidence": c.evidence} for c in run.checks.all()]}


class DeploymentConformanceView(APIView):
    """The latest conformance run with its checks and PD-health verdict; POST starts a new run."""

    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request, pk: int):
        d = _deployment(request, pk)
        run = d.conformance_runs.prefetch_related("checks").first()
        condition = next((c for c in d.conditions if c.get("type") == "ConformancePassed"), None)
        return Response({"deployment": d.pk, "condition": condition, "run": _run_json(run)})

    @extend_schema(request=None, responses={202: OpenApiTypes.OBJECT, 429: OpenApiTypes.OBJECT})
    def post(self, request, pk: int):
        """Queue a run; 429 with Retry-After while one is pending or the team is over its rate."""
        d = _deployment(request, pk)
        conformance_request(deployment=d, actor=request.user)
        return Response({"deployment": d.pk, "queued": True}, status=status.HTTP_202_ACCEPTED)


def _plan_cluster(request, body: dict) -> tuple[SourceRoots | None, Prices]:
    """The model sources a plan may read config.json from (those the named cluster allows the named team, one the
    caller belongs to) and the prices it is costed at (the named cluster's). Without both names, no sources (the
    planner then needs the facts in the request) and the catalog's on-demand prices."""
    team_slug, cluster_name = body.get("team"), body.get("cluster")
    if team_slug is None and cluster_name is None:
        return None, ON_DEMAND
    team = teams_visible_to(request.user).filter(slug=str(team_slug)).first()
    cluster = Cluster.objects.filter(name=str(cluster_name)).first()
    errors = {**({} if team else {"team": [f"No team {team_slug!r} that you belong to."]}),
              **({} if cluster else {"cluster": [f"No cluster {cluster_name!r}."]})}
    if errors:
        raise SpecError(errors)
    return source_roots_of(cluster=cluster, team=team), cluster_prices(cluster)


class PlanRequest(serializers.Serializer):
    """POST /api/v1/plans/'s body."""

    spec = SpecField(help_text="A request-shaped spec, as POST /api/v1/deployments/ takes it.")
    model_facts = serializers.DictField(
        required=False, allow_null=True,
        help_text="The model's facts (num_layers, hidden_size, num_attention_heads, num_key_value_heads, ...); "
                  "without them, read from its config.json where the cluster allows the team its source.")
    team = serializers.CharField(required=False, help_text="A team of yours: with `cluster`, whose model sources "
                                                           "and prices the plan uses.")
    cluster = serializers.CharField(required=False, help_text="A registered cluster: with `team`.")
    assumed_itl_ms = serializers.FloatField(
        required=False, default=30.0, min_value=0.1, max_value=10_000,
        error_messages={k: "A number of milliseconds between 0.1 and 10000." for k in ("invalid", "min_value",
                                                                                        "max_value")},
        help_text="The inter-token latency the throughput figures assume, in milliseconds.")


class PlanView(APIView):
    """The capacity plan for a PD spec: {"spec": <request-shaped spec>, "model_facts": {...} | null, "team": slug,
    "cluster": name}. Without model_facts, the facts come from the model's config.json when its source is a local
    path the cluster allows the team (deployments.model_sources); team and cluster are needed for that. With them the
    cost is at that cluster's prices, as its deployments are charged; without, at the catalog's on-demand ones."""

    @extend_schema(request=PlanRequest, responses=OpenApiTypes.OBJECT)
    def post(self, request):
        body = PlanRequest(data=request.data)
        body.is_valid(raise_exception=True)
        source_roots, prices = _plan_cluster(request, body.validated_data)
        spec = spec_parse_field(body.validated_data["spec"], source_roots=source_roots)
        return Response(plan_with_facts(spec, body.validated_data.get("model_facts"),
                                        assumed_itl_ms=body.validated_data["assumed_itl_ms"],
                                        source_roots=source_roots, prices=prices,
                                        fleet=fleet_reader(user=request.user, now=timezone.now())))
