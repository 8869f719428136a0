"""Shapes of the REST API. Writes are validated here only for shape; rules live in services and spec."""
from django.conf import settings
from django.contrib.auth import get_user_model
from rest_framework import serializers

from deployments.cluster_config import cluster_config_errors
from deployments.lifecycle import SERVING
from deployments.models import AccessToken, ApiKey, Cluster, Deployment, Event, Membership, Team
from deployments.services.quota import team_gpus_held
from deployments.secret_refs import secret_ref_errors
from deployments.spec import dns_label_errors


class TeamSerializer(serializers.ModelSerializer):
    gpus_held = serializers.SerializerMethodField()

    class Meta:
        model = Team
        fields = ["id", "slug", "name", "gpu_quota", "allow_self_approval", "gpus_held", "created_at"]
        read_only_fields = ["id", "created_at", "gpus_held"]

    def get_gpus_held(self, team) -> int:
        return team_gpus_held(team=team)

    def validate_slug(self, value):
        if problems := dns_label_errors(value):
            raise serializers.ValidationError(problems)
        return value


class MembershipSerializer(serializers.ModelSerializer):
    team = serializers.SlugRelatedField(slug_field="slug", queryset=Team.objects.all())
    user = serializers.SlugRelatedField(slug_field="username", queryset=get_user_model().objects.all())

    class Meta:
        model = Membership
        fields = ["id", "team", "user", "role", "created_at"]
        read_only_fields = ["id", "created_at"]


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
    gpus = serializers.SerializerMethodField()
    model = serializers.SerializerMethodField()
    endpoint = serializers.SerializerMethodField()

    class Meta:
        model = Deployment
        fields = ["id", "team", "name", "cluster", "requested_by", "purpose", "model", "spec", "proposed_spec",
                  "gpus", "generation", "status", "status_reason", "observed_generation", "conditions",
                  "endpoint", "created_at", "updated_at"]
        read_only_fields = fields

    def get_gpus(self, d) -> int:
        return d.spec_typed.gpus

    def get_model(self, d) -> str:
        return d.spec.get("model_id", "")

    def get_endpoint(self, d) -> dict | None:
        """What a client needs: the gateway's base URL and the model name (once running)."""
        if d.status not in SERVING:
            return None
        return {"base_url": settings.TANDEM_GATEWAY_BASE_URL, "model": d.spec.get("model_id", "")}


class DeploymentCreateSerializer(serializers.Serializer):
    team = serializers.SlugRelatedField(slug_field="slug", queryset=Team.objects.all())
    cluster = serializers.SlugRelatedField(slug_field="name", queryset=Cluster.objects.all())
    name = serializers.CharField(max_length=100)
    purpose = serializers.CharField(required=False, allow_blank=True, max_length=2000, default="")
    spec = serializers.JSONField(help_text="The PD spec: model, runtime, prefill, decode, engine, expected_load.")


class DeploymentEditSerializer(serializers.Serializer):
    purpose = serializers.CharField(required=False, allow_blank=True, max_length=2000)
    spec = serializers.JSONField(required=False)


class CommentSerializer(serializers.Serializer):
    comment = serializers.CharField(required=False, allow_blank=True, max_length=2000, default="")


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
    team = serializers.SlugRelatedField(slug_field="slug", queryset=Team.objects.all())
    deployments = serializers.PrimaryKeyRelatedField(many=True, queryset=Deployment.objects.all(), required=False)

    class Meta:
        model = ApiKey
        fields = ["id", "team", "name", "key_id", "last4", "all_deployments", "deployments",
                  "requests_per_minute", "tokens_per_minute", "created_at", "expires_at", "revoked_at",
                  "last_used_at"]
        read_only_fields = ["id", "key_id", "last4", "created_at", "revoked_at", "last_used_at"]


class UserSerializer(serializers.ModelSerializer):
    class Meta:
        model = get_user_model()
        fields = ["id", "username", "is_staff"]
        read_only_fields = fields
