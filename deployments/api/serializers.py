"""Shapes of the REST API. Writes are validated here only for shape; rules live in services and spec."""
from django.conf import settings
from django.contrib.auth import get_user_model
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from deployments import selectors
from deployments.cluster_config import cluster_config_errors
from deployments.lifecycle import SERVING
from deployments.models import AccessToken, ApiKey, Cluster, Deployment, Event, Membership, Team
from deployments.quota_rules import quota_gpus
from deployments.services.quota import team_gpus_held
from deployments.secret_refs import secret_ref_errors
from deployments.spec import dns_label_errors, spec_load
from deployments.spec_diff import proposal_summary


class _Visible:
    """A related field that accepts only objects the caller can see (`selector(user)`), so naming another team's
    object answers exactly as naming one that does not exist."""

    def __init__(self, *, selector, **kwargs):
        self.selector = selector
        super().__init__(**kwargs)

    def get_queryset(self):
        user = getattr(self.context.get("request"), "user", None)
        if user is None or not user.is_authenticated:
            raise serializers.ValidationError("Sign in first.")
        return self.selector(user)


@extend_schema_field(OpenApiTypes.STR)
class VisibleSlugField(_Visible, serializers.SlugRelatedField):
    pass


@extend_schema_field(OpenApiTypes.INT)
class VisiblePrimaryKeyField(_Visible, serializers.PrimaryKeyRelatedField):
    pass


class TeamSerializer(serializers.ModelSerializer):
    gpus_held = serializers.SerializerMethodField()

    class Meta:
        model = Team
        fields = ["id", "slug", "name", "gpu_quota", "allow_self_approval", "credential_default_days",
                  "credential_max_days", "monthly_budget_usd", "auto_apply_recommendations", "gpus_held",
                  "created_at"]
        read_only_fields = ["id", "created_at", "gpus_held"]

    def get_gpus_held(self, team) -> int:
        return team_gpus_held(team=team)

    def validate_slug(self, value):
        if problems := dns_label_errors(value):
            raise serializers.ValidationError(problems)
        return value


class MembershipSerializer(serializers.ModelSerializer):
    team = VisibleSlugField(slug_field="slug", selector=selectors.teams_visible_to)
    user = VisibleSlugField(slug_field="username", selector=selectors.users_visible_to)

    class Meta:
        model = Membership
        fields = ["id", "team", "user", "role", "created_at"]
        read_only_fields = ["id", "created_at"]


class ClusterSummarySerializer(serializers.ModelSerializer):
    """What everyone signed in sees of a cluster: its name and kind (its config is for platform admins)."""

    class Meta:
        model = Cluster
        fields = ["id", "name", "kind"]
        read_only_fields = fields


class ClusterSerializer(serializers.ModelSerializer):
    """`secret_ref` is write-only: `env:TANDEM_CLUSTER_...` or `file:<secrets dir>/...` naming where the
    credential lives."""

    secret_ref = serializers.CharField(write_only=True, required=False, allow_blank=True)
    has_secret = serializers.SerializerMethodField()

    class Meta:
        model = Cluster
        fields = ["id", "name", "kind", "config", "secret_ref", "has_secret", "created_at"]
        read_only_fields = ["id", "created_at", "has_secret"]

    def get_has_secret(self, cluster) -> bool:
        return bool(cluster.secret_ref)

    def validate_name(self, value):
        if problems := dns_label_errors(value):
            raise serializers.ValidationError(problems)
        return value

    def validate_secret_ref(self, value):
        if problems := secret_ref_errors(value):
            raise serializers.ValidationError(problems)
        return value

    def validate(self, attrs):
        if errors := cluster_config_errors(attrs.get("kind"), attrs.get("config") or {}):
            raise serializers.ValidationError({"config": errors})
        return attrs


class DeploymentSerializer(serializers.ModelSerializer):
    team = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    cluster = serializers.SlugRelatedField(slug_field="name", read_only=True)
    requested_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    proposed_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    gpus = serializers.SerializerMethodField(help_text="GPUs the approved spec holds against quota (provisioned).")
    model = serializers.SerializerMethodField()
    endpoint = serializers.SerializerMethodField()
    proposed_spec_hash = serializers.CharField(read_only=True, allow_null=True,
                                               help_text="Pass it back to approve or reject the proposed update.")
    proposal = serializers.SerializerMethodField(
        help_text="The proposed update as an approver reviews it: each changed field old → new, cost per hour "
                  "before and after, GPUs against quota before and after.")

    class Meta:
        model = Deployment
        fields = ["id", "team", "name", "cluster", "requested_by", "purpose", "model", "spec", "proposed_spec",
                  "proposed_spec_hash", "proposed_by", "proposal", "gpus", "generation", "status",
                  "status_reason", "observed_generation", "conditions", "endpoint", "created_at", "updated_at"]
        read_only_fields = fields

    def get_gpus(self, d) -> int:
        return d.quota_gpus

    def get_proposal(self, d) -> dict | None:
        if d.proposed_spec is None:
            return None
        old, new = d.spec_typed, spec_load(d.proposed_spec)
        return proposal_summary(old, new) | {"gpus_before": d.quota_gpus,
                                             "gpus_after": quota_gpus(new, target_kind=d.cluster.kind)}

    def get_model(self, d) -> str:
        return d.spec.get("model_id", "")

    def get_endpoint(self, d) -> dict | None:
        """What a client needs: the gateway's base URL and the model name (once running)."""
        if d.status not in SERVING:
            return None
        return {"base_url": settings.TANDEM_GATEWAY_BASE_URL, "model": d.spec.get("model_id", "")}


class DeploymentCreateSerializer(serializers.Serializer):
    team = VisibleSlugField(slug_field="slug", selector=selectors.teams_visible_to)
    cluster = serializers.SlugRelatedField(slug_field="name", queryset=Cluster.objects.all())
    name = serializers.CharField(max_length=100)
    purpose = serializers.CharField(required=False, allow_blank=True, max_length=2000, default="")
    spec = serializers.JSONField(help_text="The PD spec: model, runtime, prefill, decode, engine, expected_load.")


class DeploymentEditSerializer(serializers.Serializer):
    purpose = serializers.CharField(required=False, allow_blank=True, max_length=2000)
    spec = serializers.JSONField(required=False)


class DecisionSerializer(serializers.Serializer):
    """An approval or rejection of what the approver reviewed: a stale generation or hash answers 409."""

    comment = serializers.CharField(required=False, allow_blank=True, max_length=2000, default="")
    generation = serializers.IntegerField(min_value=1, help_text="The deployment's `generation` you reviewed.")
    proposed_spec_hash = serializers.CharField(
        required=False, allow_blank=True, allow_null=True, max_length=64, default=None,
        help_text="For a proposed update: its `proposed_spec_hash` you reviewed.")


class EventSerializer(serializers.ModelSerializer):
    actor = serializers.SlugRelatedField(slug_field="username", read_only=True)
    team = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    deployment = serializers.PrimaryKeyRelatedField(read_only=True)

    class Meta:
        model = Event
        fields = ["id", "team", "deployment", "actor", "kind", "message", "before", "after", "duration_ms",
                  "created_at"]
        read_only_fields = fields


class AccessTokenSerializer(serializers.ModelSerializer):
    class Meta:
        model = AccessToken
        fields = ["id", "name", "key_id", "last4", "created_at", "expires_at", "revoked_at", "last_used_at"]
        read_only_fields = ["id", "key_id", "last4", "created_at", "revoked_at", "last_used_at"]


class ApiKeySerializer(serializers.ModelSerializer):
    team = VisibleSlugField(slug_field="slug", selector=selectors.teams_visible_to)
    deployments = VisiblePrimaryKeyField(many=True, selector=selectors.deployments_visible_to, required=False)
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = ApiKey
        fields = ["id", "team", "name", "key_id", "last4", "created_by", "all_deployments", "deployments",
                  "requests_per_minute", "tokens_per_minute", "created_at", "expires_at", "revoked_at",
                  "last_used_at"]
        read_only_fields = ["id", "key_id", "last4", "created_by", "created_at", "revoked_at", "last_used_at"]


class UserSerializer(serializers.ModelSerializer):
    class Meta:
        model = get_user_model()
        fields = ["id", "username", "is_staff"]
        read_only_fields = fields
