"""Shapes of the REST API. Writes are validated here only for shape; rules live in services and spec."""
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.validators import RegexValidator
from django.db import models
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from deployments import selectors
from deployments.cluster_config import cluster_config_errors
from deployments.cost import cluster_prices
from deployments.lifecycle import SERVING, Status
from deployments.models import (AccessToken, ApiKey, Cluster, ClusterCheck, ClusterCheckLine, Deployment, Event,
                                Membership, Rollout, Team)
from deployments.outcomes import Outcome
from deployments.permissions import is_platform_admin
from deployments.quota_rules import quota_gpus
from deployments.redaction import internal_redact
from deployments.rollout_steps import StepState, rollout_steps
from deployments.services.quota import team_gpus_held
from deployments.secret_refs import secret_ref_errors
from deployments.spec import DNS1123_LABEL, dns_label_errors, spec_load
from deployments.api.spec_field import SpecField
from deployments.spec_diff import proposal_summary


class StrictBooleanField(serializers.BooleanField):
    """true or false, as the schema says: not "yes", "1" or 0 (DRF's BooleanField takes those)."""

    def to_internal_value(self, data):
        if not isinstance(data, bool):
            self.fail("invalid", input=data)
        return data


class StrictIntegerField(serializers.IntegerField):
    """A JSON integer, as the schema says: not "5", 5.0 or true."""

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class _JSONString:
    """A JSON string, as the schema says: not a number (DRF's CharField turns 5 into "5")."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictCharField(_JSONString, serializers.CharField):
    pass


class StrictSlugField(_JSONString, serializers.SlugField):
    pass


class StrictModelSerializer(serializers.ModelSerializer):
    """A ModelSerializer whose booleans, integers and strings take only the JSON type the schema states."""

    serializer_field_mapping = {
        **serializers.ModelSerializer.serializer_field_mapping,
        models.BooleanField: StrictBooleanField, models.IntegerField: StrictIntegerField,
        models.PositiveIntegerField: StrictIntegerField, models.CharField: StrictCharField,
        models.SlugField: StrictSlugField, models.TextField: StrictCharField,
    }


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


# The DNS-1123 pattern in the schema too (dns_label_errors stays the check and its message).
DNS_LABEL = {"validators": [RegexValidator(DNS1123_LABEL.pattern)]}
LIFETIME_DAYS = {"min_value": 1, "max_value": 3650}


class TeamSerializer(StrictModelSerializer):
    gpus_held = serializers.SerializerMethodField()

    class Meta:
        model = Team
        fields = ["id", "slug", "name", "gpu_quota", "allow_self_approval", "credential_default_days",
                  "credential_max_days", "monthly_budget_usd", "auto_apply_recommendations", "gpus_held",
                  "created_at"]
        read_only_fields = ["id", "created_at", "gpus_held"]
        extra_kwargs = {"slug": DNS_LABEL, "credential_default_days": LIFETIME_DAYS,
                        "credential_max_days": LIFETIME_DAYS}

    def get_gpus_held(self, team) -> int:
        return team_gpus_held(team=team)

    def validate_slug(self, value):
        if problems := dns_label_errors(value):
            raise serializers.ValidationError(problems)
        return value


class MembershipSerializer(StrictModelSerializer):
    team = VisibleSlugField(slug_field="slug", selector=selectors.teams_visible_to)
    user = VisibleSlugField(slug_field="username", selector=selectors.users_visible_to)

    class Meta:
        model = Membership
        fields = ["id", "team", "user", "role", "created_at"]
        read_only_fields = ["id", "created_at"]


class ClusterSummarySerializer(StrictModelSerializer):
    """What everyone signed in sees of a cluster: its name and kind (its config is for platform admins)."""

    class Meta:
        model = Cluster
        fields = ["id", "name", "kind"]
        read_only_fields = fields


class ClusterSerializer(StrictModelSerializer):
    """`secret_ref` is write-only: `env:TANDEM_CLUSTER_...` or `file:<secrets dir>/...` naming where the
    credential lives."""

    secret_ref = StrictCharField(write_only=True, required=False, allow_blank=True)
    has_secret = serializers.SerializerMethodField()

    class Meta:
        model = Cluster
        fields = ["id", "name", "kind", "config", "secret_ref", "has_secret", "created_at"]
        read_only_fields = ["id", "created_at", "has_secret"]
        extra_kwargs = {"name": DNS_LABEL}

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


class ClusterEditSerializer(serializers.Serializer):
    """A PATCH of a cluster: `config` replaces the whole config (GET it, change it, send it back); `secret_ref`
    replaces the reference (blank: none). A cluster's name and kind do not change."""

    config = serializers.JSONField(required=False, help_text="The whole new config (checked as at registration).")
    secret_ref = StrictCharField(required=False, allow_blank=True)

    def validate_secret_ref(self, value):
        if problems := secret_ref_errors(value):
            raise serializers.ValidationError(problems)
        return value

    def validate(self, attrs):
        if fixed := sorted({"name", "kind"} & set(self.initial_data)):
            raise serializers.ValidationError({k: ["A cluster's name and kind do not change; register another "
                                                   "cluster instead."] for k in fixed})
        kind = self.context["cluster"].kind
        if "config" in attrs and (errors := cluster_config_errors(kind, attrs["config"])):
            raise serializers.ValidationError({"config": errors})
        return attrs


class ClusterCheckLineSerializer(serializers.ModelSerializer):
    """One preflight check: pass, fail or unverified, what was seen, the fix, and what it is about (`subject`: e.g.
    `instance:p5.48xlarge`; a failing line stops approvals of deployments that use it)."""

    class Meta:
        model = ClusterCheckLine
        fields = ["name", "status", "evidence", "fix", "subject"]
        read_only_fields = fields


class ClusterCheckSerializer(serializers.ModelSerializer):
    """A preflight run: `running` until the worker has checked the cluster, then passed, failed or error."""

    cluster = serializers.SlugRelatedField(slug_field="name", read_only=True)
    lines = ClusterCheckLineSerializer(many=True, read_only=True)

    class Meta:
        model = ClusterCheck
        fields = ["id", "cluster", "status", "error", "created_at", "finished_at", "lines"]
        read_only_fields = fields


class PoolCountsSerializer(serializers.Serializer):
    prefill = serializers.IntegerField()
    decode = serializers.IntegerField()


class RolloutReplicasSerializer(serializers.Serializer):
    old = PoolCountsSerializer(help_text="Replicas per pool of the generation that served before.")
    new = PoolCountsSerializer(help_text="Replicas per pool of the generation rolling out.")


class VerdictSerializer(serializers.Serializer):
    compatible = serializers.BooleanField(help_text="The two generations can share KV: the update rolls in place.")
    reasons = serializers.ListField(child=serializers.CharField(),
                                    help_text="Each change that keeps them from sharing KV.")


class RolloutStepSerializer(serializers.Serializer):
    weight = serializers.IntegerField(help_text="The new generation's share of requests at this step, in percent.")
    state = serializers.ChoiceField(choices=StepState.choices, help_text=(
        "`done`: reached and judged; `current`: traffic is on it now; `waiting`: not reached yet; `stopped`: the "
        "rollout was rolled back or aborted on it; `skipped`: never reached."))


class RolloutSerializer(serializers.ModelSerializer):
    """How one update of a running deployment reaches its users: in place, or side by side in traffic steps."""

    verdict = VerdictSerializer(read_only=True)
    steps = serializers.SerializerMethodField(help_text=(
        "Each step of the deployment's `spec.rollout.steps` (as the rollout began) and where the rollout stands on it (none for a "
        "rollout in place)."))
    replicas = RolloutReplicasSerializer(read_only=True)
    peak_surge = PoolCountsSerializer(read_only=True,
                                      help_text="The most replicas per pool seen beyond the spec's while both ran.")
    steps_log = serializers.ListField(child=serializers.DictField(), read_only=True, help_text=(
        "Each step as it was judged: its weight, when, the verdict and the numbers of both generations."))

    class Meta:
        model = Rollout
        fields = ["id", "mode", "verdict", "state", "paused", "weight", "step", "steps", "replicas", "peak_surge",
                  "steps_log", "reason", "from_generation", "to_generation", "created_at", "finished_at"]
        read_only_fields = fields

    @extend_schema_field(RolloutStepSerializer(many=True))
    def get_steps(self, r) -> list[dict]:
        return [{"weight": step.weight, "state": step.state}
                for step in rollout_steps(r)]


class DeploymentSerializer(serializers.ModelSerializer):
    team = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    cluster = serializers.SlugRelatedField(slug_field="name", read_only=True)
    requested_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    proposed_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)
    gpus = serializers.SerializerMethodField(help_text="GPUs the approved spec holds against quota (provisioned).")
    model = serializers.SerializerMethodField()
    endpoint = serializers.SerializerMethodField()
    proposed_spec_hash = serializers.CharField(read_only=True, allow_null=True,
                                               help_text="Pass it back to approve or reject the proposed update.")
    proposal = serializers.SerializerMethodField(
        help_text="The proposed update as an approver reviews it: each changed field old → new, cost per hour "
                  "before and after, GPUs against quota before and after.")
    cluster_check_failures = serializers.SerializerMethodField(
        help_text="While the deployment waits for a decision: the checks its cluster's latest preflight failed "
                  "(name, evidence, fix, subject), so an approver sees what would keep it from serving. Empty "
                  "otherwise.")
    rollout = serializers.SerializerMethodField(
        help_text="The update rolling out now (its steps, weight and replicas), or null when none is.")

    class Meta:
        model = Deployment
        fields = ["id", "team", "name", "cluster", "requested_by", "purpose", "model", "spec", "proposed_spec",
                  "proposed_spec_hash", "proposed_by", "proposal", "gpus", "generation", "status",
                  "status_reason", "observed_generation", "conditions", "endpoint", "cluster_check_failures",
                  "rollout", "created_at", "updated_at"]
        read_only_fields = fields

    def get_cluster_check_failures(self, d) -> list[dict]:
        if not d.awaits_approval:
            return []
        if "cluster_check_failures" not in self.context:  # once for a whole page: two queries, however long
            page = self.parent.instance if isinstance(self.parent, serializers.ListSerializer) else [d]
            request = self.context.get("request")
            self.context["cluster_check_failures"] = selectors.cluster_check_failures({x.cluster_id for x in page})
            self.context["platform_admin"] = request is not None and is_platform_admin(request.user)
        admin = self.context["platform_admin"]
        return [{"name": line.name,
                 "evidence": line.evidence if admin else internal_redact(line.evidence, cluster=d.cluster),
                 "fix": line.fix if admin else internal_redact(line.fix, cluster=d.cluster), "subject": line.subject}
                for line in self.context["cluster_check_failures"].get(d.cluster_id, [])]

    @extend_schema_field(RolloutSerializer(allow_null=True))
    def get_rollout(self, d) -> dict | None:
        r = selectors.rollout_active_of(d)
        return None if r is None else RolloutSerializer(r, context=self.context).data

    def get_gpus(self, d) -> int:
        return d.quota_gpus

    def get_proposal(self, d) -> dict | None:
        if d.proposed_spec is None:
            return None
        old, new = d.spec_typed, spec_load(d.proposed_spec)
        return proposal_summary(old, new, prices=cluster_prices(d.cluster)) | {
            "gpus_before": d.quota_gpus, "gpus_after": quota_gpus(new, target_kind=d.cluster.kind)}

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
    name = StrictCharField(max_length=100)
    purpose = StrictCharField(required=False, allow_blank=True, max_length=2000, default="")
    spec = SpecField(help_text="The PD spec: model, runtime, prefill, decode, engine, expected_load, pause, targets.")


class DeploymentEditSerializer(serializers.Serializer):
    purpose = StrictCharField(required=False, allow_blank=True, max_length=2000)
    spec = SpecField(required=False, help_text="The whole new spec (the fields left out take their defaults).")


class FieldChangeSerializer(serializers.Serializer):
    field = serializers.CharField(help_text="A dotted path in the spec (`decode.nodes`), or `purpose`.")
    old = serializers.JSONField(allow_null=True)
    new = serializers.JSONField(allow_null=True)
    needs_approval = serializers.BooleanField(help_text="This change waits for an admin's approval.")


class DeploymentPreviewSerializer(serializers.Serializer):
    """What the write would do, as the write's own rules decide it; nothing was kept."""

    outcome = serializers.ChoiceField(
        choices=Outcome.choices, help_text="`created`: a request that waits for approval; `edited`: the pending "
        "request changes and still waits; `updated`: applied at once; `proposed`: an update that waits for approval "
        "while the approved spec keeps running.")
    waits_for_approval = serializers.BooleanField(help_text="Afterwards, something waits for an admin's decision.")
    status = serializers.ChoiceField(choices=Status.choices, help_text="The deployment's status afterwards.")
    generation = serializers.IntegerField(help_text="The deployment's generation afterwards.")
    changes = FieldChangeSerializer(many=True, help_text="Each changed field old → new (a new request: every field).")
    hourly_usd_before = serializers.FloatField(allow_null=True)
    hourly_usd_after = serializers.FloatField(allow_null=True)
    gpus_before = serializers.IntegerField(help_text="GPUs held against quota now (provisioned).")
    gpus_after = serializers.IntegerField(help_text="GPUs held against quota once what is previewed runs.")


class DecisionSerializer(serializers.Serializer):
    """An approval or rejection of what the approver reviewed: a stale generation or hash answers 409."""

    comment = StrictCharField(required=False, allow_blank=True, max_length=2000, default="")
    generation = StrictIntegerField(min_value=1, help_text="The deployment's `generation` you reviewed.")
    proposed_spec_hash = StrictCharField(
        required=False, allow_blank=True, allow_null=True, max_length=64, default=None,
        help_text="For a proposed update: its `proposed_spec_hash` you reviewed.")


class RolloutAbortSerializer(serializers.Serializer):
    reason = StrictCharField(required=False, allow_blank=True, max_length=2000, default="",
                             help_text="Why: kept on the rollout and in its event.")


class EventSerializer(serializers.ModelSerializer):
    actor = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True,
                                         help_text="Null for what Tandem itself did.")
    team = serializers.SlugRelatedField(slug_field="slug", read_only=True, allow_null=True,
                                        help_text="Null for a user's own event (their access tokens).")
    deployment = serializers.PrimaryKeyRelatedField(read_only=True, allow_null=True,
                                                    help_text="Null for an event of the team (keys, members).")

    class Meta:
        model = Event
        fields = ["id", "team", "deployment", "actor", "kind", "message", "before", "after", "duration_ms",
                  "created_at"]
        read_only_fields = fields


class AccessTokenSerializer(StrictModelSerializer):
    class Meta:
        model = AccessToken
        fields = ["id", "name", "key_id", "last4", "created_at", "expires_at", "revoked_at", "last_used_at"]
        read_only_fields = ["id", "key_id", "last4", "created_at", "revoked_at", "last_used_at"]


class ApiKeySerializer(StrictModelSerializer):
    team = VisibleSlugField(slug_field="slug", selector=selectors.teams_visible_to)
    deployments = VisiblePrimaryKeyField(many=True, selector=selectors.deployments_visible_to, required=False)
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)
    owner = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True,
        help_text="The person the key belongs to (revoked when they leave the team); null for a team key.")
    team_key = StrictBooleanField(
        write_only=True, required=False, default=False,
        help_text="Create a team key: owned by the team, not by you, so it stays when people leave (team admins).")

    class Meta:
        model = ApiKey
        fields = ["id", "team", "name", "key_id", "last4", "created_by", "owner", "team_key", "all_deployments",
                  "deployments", "requests_per_minute", "tokens_per_minute", "created_at", "expires_at",
                  "revoked_at", "last_used_at"]
        read_only_fields = ["id", "key_id", "last4", "created_by", "owner", "created_at", "revoked_at",
                            "last_used_at"]


class ApiKeyTransferSerializer(serializers.Serializer):
    """Why the key moves to the team (kept in the audit trail)."""

    message = StrictCharField(required=False, allow_blank=True, max_length=2000, default="")


class UserSerializer(serializers.ModelSerializer):
    class Meta:
        model = get_user_model()
        fields = ["id", "username", "is_staff"]
        read_only_fields = fields
