"""REST views of the usage app: usage per key for a deployment the caller can see."""
import datetime as dt
import re

from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from deployments.selectors import deployments_visible_to
from usage.selectors import deployment_cost, usage_by_key

# 1m to 90d, as the schema states it (its pattern is this one): minutes up to 9999, hours up to 2160, days up to 90.
WINDOW = re.compile(r"^(?:([1-9][0-9]{0,3})(m)|([1-9][0-9]{0,2}|1[0-9]{3}|20[0-9]{2}|21[0-5][0-9]|2160)(h)"
                    r"|([1-9]|[1-8][0-9]|90)(d))$")
UNITS = {"m": "minutes", "h": "hours", "d": "days"}


def parse_window(text: str) -> dt.timedelta:
    match = WINDOW.fullmatch(text or "")
    if not match:
        raise ValidationError({"window": ["Use a number and a unit, from 1m to 90d: 30m, 24h or 7d."]})
    number, unit = [g for g in match.groups() if g]
    return dt.timedelta(**{UNITS[unit]: int(number)})


class UsageRowSerializer(serializers.Serializer):
    api_key = serializers.CharField(allow_null=True, help_text="The key's public id (null: a deleted key)")
    name = serializers.CharField(allow_null=True)
    requests = serializers.IntegerField()
    prompt_tokens = serializers.IntegerField()
    completion_tokens = serializers.IntegerField()
    partial = serializers.IntegerField(help_text="Requests that ended early")


class UsageView(APIView):
    """Per-key request and token totals for one deployment over a window (`?deployment=<id>&window=24h`)."""

    serializer_class = UsageRowSerializer

    @extend_schema(parameters=[OpenApiParameter("deployment", {"type": "integer", "minimum": 1}, required=True),
                               OpenApiParameter("window", str, pattern=WINDOW.pattern, default="24h")],
                   responses=UsageRowSerializer(many=True))
    def get(self, request):
        deployment_id = request.query_params.get("deployment", "")
        if not deployment_id.isdigit():
            raise ValidationError({"deployment": ["Pass the id of one of your team's deployments."]})
        deployment = get_object_or_404(deployments_visible_to(request.user), pk=int(deployment_id))
        window = parse_window(request.query_params.get("window", "24h"))
        rows = usage_by_key(deployment=deployment, window=window)
        return Response(UsageRowSerializer(rows, many=True).data)


class DeploymentCostView(APIView):
    """Cost per hour now, cost over a window (`?window=24h`), output tokens, cost per million output tokens, and
    each key's tokens and share of the cost."""

    @extend_schema(parameters=[OpenApiParameter("window", str, pattern=WINDOW.pattern, default="24h")],
                   responses=OpenApiTypes.OBJECT)
    def get(self, request, pk: int):
        deployment = get_object_or_404(deployments_visible_to(request.user), pk=pk)
        window = parse_window(request.query_params.get("window", "24h"))
        return Response(deployment_cost(deployment=deployment, window=window))
