"""REST API views: thin, each calls a selector to read and a service to write."""
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError as DjangoValidationError
from django.utils.cache import add_never_cache_headers
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.response import Response

from deployments import selectors
from deployments.event_kinds import EventKind
from deployments.lifecycle import LIVE, Status
from deployments.api import serializers as s
from deployments.models import AccessToken, ApiKey, Cluster, Deployment, Event, Membership, Rollout, Team
from deployments.errors import NotAllowed
from deployments.permissions import is_platform_admin
from deployments.services import actions, api_keys, cluster_checks, clusters, pause, previews, rollouts, teams
from deployments.api.spend import SpendRendering, team_spend_response
from deployments.services.access_tokens import access_token_create, access_token_revoke

SecretOnce = inline_serializer("SecretOnce", {"secret": serializers.CharField(help_text="Shown only in this response.")})


def _secret_once(body: dict) -> Response:
    """A 201 that carries a new secret: `Cache-Control: no-store`, so no browser, proxy or client cache keeps it."""
    response = Response(body, status=status.HTTP_201_CREATED)
    add_never_cache_headers(response)
    return response


def _filter(qs, request, choices: dict | None = None, **fields):
    """Apply ?name=value filters for the given query parameters → model lookups; a parameter in `choices` takes
    only those values (the schema's enum), anything else is a 400."""
    for param, lookup in fields.items():
        if value := request.query_params.get(param):
            if "\x00" in value:  # PostgreSQL cannot hold it, so no row has it: nothing matches
                return qs.none()
            if choices and param in choices and value not in choices[param]:
                raise ValidationError({param: [f"One of {', '.join(choices[param])}; got {value!r}."]})
            try:
                qs = qs.filter(**{lookup: value})
            except (ValueError, DjangoValidationError):
                raise ValidationError({param: [f"{value!r} is not a valid value for {param}."]}) from None
    return qs


class TeamViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                  mixins.UpdateModelMixin, viewsets.GenericViewSet):
    """Teams you belong to (platform admins: all). Platform admins create teams and set quotas."""

    serializer_class = s.TeamSerializer
    queryset = Team.objects.none()  # the schema's types; get_queryset answers requests
    lookup_field = "slug"
    lookup_value_regex = "[-a-zA-Z0-9_]+"  # what a slug may hold (anything else names no team: 404)
    ordering_fields = ["slug", "created_at"]

    def get_queryset(self):
        return selectors.teams_visible_to(self.request.user)

    def perform_create(self, serializer):
        serializer.instance = teams.team_create(actor=self.request.user, **serializer.validated_data)

    def perform_update(self, serializer):
        serializer.instance = teams.team_update(actor=self.request.user, team=serializer.instance,
                                                **serializer.validated_data)

    @extend_schema(parameters=[OpenApiParameter("month", str, pattern=r"^20[0-9]{2}-(0[1-9]|1[0-2])$",
                                                description="YYYY-MM (UTC); this month if absent")],
                   responses=OpenApiTypes.OBJECT)
    @action(detail=True, methods=["get"], renderer_classes=SpendRendering)
    def spend(self, request, slug=None):
        """Spend per day and per deployment for a month, with the budget; `?format=csv` for chargeback."""
        return team_spend_response(team=self.get_object(), month=request.query_params.get("month"),
                                   as_csv=request.accepted_renderer.format == "csv")


class MembershipViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                        mixins.UpdateModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet):
    """Members and roles. Team admins and platform admins add members and change roles."""

    serializer_class = s.MembershipSerializer
    queryset = Membership.objects.none()
    lookup_value_regex = "[0-9]+"
    ordering_fields = ["created_at"]

    def get_queryset(self):
        return _filter(selectors.memberships_visible_to(self.request.user), self.request, team="team__slug")

    def perform_create(self, serializer):
        data = serializer.validated_data  # team and user are ones the caller can see (the fields' querysets)
        serializer.instance = teams.membership_set(actor=self.request.user, team=data["team"], user=data["user"],
                                                   role=data.get("role", Membership.Role.MEMBER))

    def perform_update(self, serializer):
        m = serializer.instance
        serializer.instance = teams.membership_set(actor=self.request.user, team=m.team, user=m.user,
                                                   role=serializer.validated_data.get("role", m.role))

    def perform_destroy(self, instance):
        teams.membership_remove(actor=self.request.user, membership=instance)


class ClusterViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                     viewsets.GenericViewSet):
    """Registered targets. Everyone signed in sees their names and kinds; platform admins see their config,
    register them and edit them."""

    serializer_class = s.ClusterSerializer
    queryset = Cluster.objects.all()
    lookup_field = "name"
    lookup_value_regex = "[-a-zA-Z0-9_]+"
    ordering_fields = ["name", "created_at"]

    def get_serializer_class(self):
        if is_platform_admin(self.request.user) or self.request.method == "POST":
            return s.ClusterSerializer
        return s.ClusterSummarySerializer

    def perform_create(self, serializer):
        serializer.instance = clusters.cluster_register(actor=self.request.user, **serializer.validated_data)

    @extend_schema(request=s.ClusterEditSerializer, responses=s.ClusterSerializer)
    def partial_update(self, request, name=None):
        """Edit a cluster (platform admins): `config` replaces the whole config, `secret_ref` the reference.
        The preflight runs again; deployments on it keep running and their next reconcile pass uses the new
        config. Sending what is already there changes nothing and records nothing."""
        cluster = self.get_object()
        if not is_platform_admin(request.user):
            raise NotAllowed("Only platform admins can edit clusters.")
        edit = s.ClusterEditSerializer(data=request.data, context={"cluster": cluster})
        edit.is_valid(raise_exception=True)
        cluster = clusters.cluster_update(actor=request.user, cluster=cluster, **edit.validated_data)
        return Response(s.ClusterSerializer(cluster, context={"request": request}).data)

    @extend_schema(methods=["POST"], request=None, responses={202: s.ClusterCheckSerializer},
                   description="Run the preflight (platform admins): 202 with the run, then GET it until it is no "
                               "longer `running`.")
    @extend_schema(methods=["GET"], responses=s.ClusterCheckSerializer,
                   description="The latest preflight run of this cluster, each check with evidence and fix.")
    @action(detail=True, methods=["get", "post"])
    def check(self, request, name=None):
        """The preflight: each check of what a deployment on this cluster needs, with evidence and fix."""
        cluster = self.get_object()
        if request.method == "POST":
            run = cluster_checks.cluster_check_request(actor=request.user, cluster=cluster)
            return Response(s.ClusterCheckSerializer(run).data, status=status.HTTP_202_ACCEPTED)
        if not is_platform_admin(request.user):
            raise NotAllowed("Only platform admins can read a cluster's checks.")
        if (run := selectors.cluster_check_latest(cluster)) is None:
            raise NotFound("This cluster was never checked; POST to this URL to check it.")
        return Response(s.ClusterCheckSerializer(run).data)


@extend_schema(parameters=[
    OpenApiParameter("status", str, enum=Status.values), OpenApiParameter("team", str), OpenApiParameter("cluster", str),
    OpenApiParameter("name", str),
    OpenApiParameter("live", bool, description="Only deployments not yet gone (not deleted, withdrawn or rejected)."),
])
class DeploymentViewSet(viewsets.ReadOnlyModelViewSet):
    """Deployments of your teams: request, edit, approve, reject, withdraw, retry, update, delete; watch and steer
    their rollouts."""

    serializer_class = s.DeploymentSerializer
    queryset = Deployment.objects.none()
    lookup_value_regex = "[0-9]+"
    ordering_fields = ["created_at", "updated_at", "name", "status"]

    def get_queryset(self):
        qs = selectors.deployments_visible_to(self.request.user)
        live = self.request.query_params.get("live")
        if live not in (None, "true", "false"):
            raise ValidationError({"live": [f"true or false; got {live!r}."]})
        if live == "true":  # at most one per team and name: what `tandemctl apply` updates
            qs = qs.filter(status__in=LIVE)
        qs = selectors.with_active_rollout(qs)
        return _filter(qs, self.request, choices={"status": Status.values}, status="status", team="team__slug",
                       cluster="cluster__name", name="name")

    def _respond(self, deployment, code=status.HTTP_200_OK):
        """The deployment as the write left it, read again with what a GET shows (its rollout too)."""
        deployment = selectors.with_active_rollout(selectors.deployments_visible_to(self.request.user)).get(
            pk=deployment.pk)
        return Response(s.DeploymentSerializer(deployment, context={"request": self.request}).data, status=code)

    def _request_arguments(self, request) -> dict:
        """A create's body as the request service takes it (shared with its preview)."""
        data = s.DeploymentCreateSerializer(data=request.data, context={"request": request})
        data.is_valid(raise_exception=True)
        v = data.validated_data
        return {"actor": request.user, "team": v["team"], "cluster": v["cluster"], "name": v["name"],
                "spec": v["spec"], "purpose": v["purpose"]}

    def _update_arguments(self, request) -> dict:
        """The object first (another team's is a 404 whatever the body), then a PATCH's body as the update service
        takes it (shared with its preview)."""
        d = self.get_object()
        data = s.DeploymentEditSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        return {"actor": request.user, "deployment": d, "spec": v.get("spec"), "purpose": v.get("purpose")}

    @extend_schema(request=s.DeploymentCreateSerializer, responses={201: s.DeploymentSerializer})
    def create(self, request):
        return self._respond(actions.deployment_request(**self._request_arguments(request)),
                             status.HTTP_201_CREATED)

    @extend_schema(request=s.DeploymentEditSerializer, responses=s.DeploymentSerializer)
    def partial_update(self, request, pk=None):
        """Edit a pending request, or update a running one: a change to anything that costs or that an approver
        judged becomes a proposed update waiting for approval (`proposal` shows it); the rest applies at once."""
        return self._respond(actions.deployment_update(**self._update_arguments(request)).deployment)

    @extend_schema(request=s.DeploymentCreateSerializer, responses=s.DeploymentPreviewSerializer,
                   operation_id="api_v1_deployments_preview_create")
    @action(detail=False, methods=["post"], url_path="preview", url_name="preview-create")
    def preview_create(self, request):
        """Dry run of `POST /deployments/` with this body: what it would do, or the 400, 403 or 409 it would get.
        Nothing is written (no deployment, event or reconcile request)."""
        preview = previews.deployment_request_preview(**self._request_arguments(request))
        return Response(s.DeploymentPreviewSerializer(preview).data)

    @extend_schema(request=s.DeploymentEditSerializer, responses=s.DeploymentPreviewSerializer,
                   operation_id="api_v1_deployments_preview_update")
    @action(detail=True, methods=["post"], url_path="preview", url_name="preview-update")
    def preview_update(self, request, pk=None):
        """Dry run of `PATCH /deployments/{id}/` with this body: unchanged, edited, updated at once or proposed for
        approval, each changed field old → new, or the error it would get. Nothing is written (no generation,
        event or reconcile request)."""
        preview = previews.deployment_update_preview(**self._update_arguments(request))
        return Response(s.DeploymentPreviewSerializer(preview).data)

    @extend_schema(request=None, responses={202: s.DeploymentSerializer})
    def destroy(self, request, pk=None):
        """Tear the deployment down (a pending request is withdrawn)."""
        return self._respond(actions.deployment_delete(actor=request.user, deployment=self.get_object()),
                             status.HTTP_202_ACCEPTED)

    def _decision(self, request):
        """The object first (another team's deployment is a 404 whatever the body), then the decision's body."""
        d = self.get_object()
        c = s.DecisionSerializer(data=request.data)
        c.is_valid(raise_exception=True)
        v = c.validated_data
        return {"actor": request.user, "deployment": d, "generation": v["generation"],
                "proposed_hash": v["proposed_spec_hash"] or None, "comment": v["comment"]}

    @extend_schema(request=s.DecisionSerializer, responses=s.DeploymentSerializer)
    @action(detail=True, methods=["post"])
    def approve(self, request, pk=None):
        """Approve what you reviewed: pass its `generation` (and `proposed_spec_hash` for an update); 409 when
        it changed since."""
        return self._respond(actions.deployment_approve(**self._decision(request)))

    @extend_schema(request=s.DecisionSerializer, responses=s.DeploymentSerializer)
    @action(detail=True, methods=["post"])
    def reject(self, request, pk=None):
        """Reject what you reviewed (same binding as approve); the comment is what the requester sees."""
        return self._respond(actions.deployment_reject(**self._decision(request)))

    @extend_schema(request=None, responses=s.DeploymentSerializer)
    @action(detail=True, methods=["post"])
    def withdraw(self, request, pk=None):
        return self._respond(actions.deployment_withdraw(actor=request.user, deployment=self.get_object()))

    @extend_schema(request=None, responses=s.DeploymentSerializer)
    @action(detail=True, methods=["post"])
    def retry(self, request, pk=None):
        return self._respond(actions.deployment_retry(actor=request.user, deployment=self.get_object()))

    @extend_schema(request=None, responses={202: s.DeploymentSerializer})
    @action(detail=True, methods=["post"])
    def pause(self, request, pk=None):
        """Tear the serving part down and keep the deployment, keys and history; it holds no quota once paused.
        Running, failed, or on its way (approved, provisioning, updating): what is being provisioned stops too."""
        return self._respond(pause.deployment_pause(actor=request.user, deployment=self.get_object()),
                             status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={202: s.DeploymentSerializer})
    @action(detail=True, methods=["post"])
    def resume(self, request, pk=None):
        """Bring a paused deployment back (quota checked again; no approval, the spec being unchanged, except that
        past the team's monthly budget only a platform admin resumes: 403 for anyone else)."""
        return self._respond(pause.deployment_resume(actor=request.user, deployment=self.get_object()),
                             status.HTTP_202_ACCEPTED)

    @extend_schema(responses=s.EventSerializer(many=True))
    @action(detail=True, methods=["get"])
    def events(self, request, pk=None):
        d = self.get_object()
        page = self.paginate_queryset(d.events.select_related("actor", "team").all())
        return self.get_paginated_response(s.EventSerializer(page, many=True).data)


    @extend_schema(responses=s.RolloutSerializer(many=True), operation_id="api_v1_deployments_rollouts_list")
    @action(detail=True, methods=["get"])
    def rollouts(self, request, pk=None):
        """The deployment's rollouts, newest first: how each update reached its users."""
        page = self.paginate_queryset(selectors.rollouts_of(self.get_object()))
        return self.get_paginated_response(s.RolloutSerializer(page, many=True).data)

    def _rollout(self, rollout_id) -> Rollout:
        """One of the deployment's rollouts (another deployment's, or another team's, is a 404)."""
        try:
            return selectors.rollouts_of(self.get_object()).get(pk=rollout_id)
        except Rollout.DoesNotExist:
            raise NotFound("No such rollout of this deployment.") from None

    def _rollout_response(self, rollout) -> Response:
        rollout.refresh_from_db()
        return Response(s.RolloutSerializer(rollout).data)

    @extend_schema(responses=s.RolloutSerializer, operation_id="api_v1_deployments_rollouts_retrieve",
                   parameters=[OpenApiParameter("rollout_id", int, OpenApiParameter.PATH)])
    @action(detail=True, methods=["get"], url_path=r"rollouts/(?P<rollout_id>[0-9]+)", url_name="rollout")
    def rollout(self, request, pk=None, rollout_id=None):
        """One rollout of the deployment: its steps, weight, replicas and the evidence of each judged step."""
        return Response(s.RolloutSerializer(self._rollout(rollout_id)).data)

    @extend_schema(request=None, responses=s.RolloutSerializer, operation_id="api_v1_deployments_rollouts_pause",
                   parameters=[OpenApiParameter("rollout_id", int, OpenApiParameter.PATH)])
    @action(detail=True, methods=["post"], url_path=r"rollouts/(?P<rollout_id>[0-9]+)/pause", url_name="rollout-pause")
    def rollout_pause(self, request, pk=None, rollout_id=None):
        """Hold a side-by-side rollout at its step (team admins): traffic stays split as it is. 409 when it has
        ended or rolls in place."""
        return self._rollout_response(rollouts.rollout_pause(actor=request.user, rollout=self._rollout(rollout_id)))

    @extend_schema(request=None, responses=s.RolloutSerializer, operation_id="api_v1_deployments_rollouts_resume",
                   parameters=[OpenApiParameter("rollout_id", int, OpenApiParameter.PATH)])
    @action(detail=True, methods=["post"], url_path=r"rollouts/(?P<rollout_id>[0-9]+)/resume",
            url_name="rollout-resume")
    def rollout_resume(self, request, pk=None, rollout_id=None):
        """Go on from the step it was held at (team admins); that step is watched again from now. 409 when it
        has ended."""
        return self._rollout_response(rollouts.rollout_resume(actor=request.user, rollout=self._rollout(rollout_id)))

    @extend_schema(request=s.RolloutAbortSerializer, responses=s.RolloutSerializer,
                   operation_id="api_v1_deployments_rollouts_abort",
                   parameters=[OpenApiParameter("rollout_id", int, OpenApiParameter.PATH)])
    @action(detail=True, methods=["post"], url_path=r"rollouts/(?P<rollout_id>[0-9]+)/abort", url_name="rollout-abort")
    def rollout_abort(self, request, pk=None, rollout_id=None):
        """Move every request back to the old generation and remove the new one (team admins), with the reason.
        409 when it has ended."""
        r = self._rollout(rollout_id)
        body = s.RolloutAbortSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        return self._rollout_response(rollouts.rollout_abort(actor=request.user, rollout=r,
                                                             reason=body.validated_data["reason"]))


@extend_schema(parameters=[OpenApiParameter("team", str), OpenApiParameter("deployment", int),
                           OpenApiParameter("kind", str, enum=EventKind.values)])
class EventViewSet(viewsets.ReadOnlyModelViewSet):
    """The audit trail of your teams."""

    serializer_class = s.EventSerializer
    queryset = Event.objects.none()
    lookup_value_regex = "[0-9]+"
    ordering_fields = ["created_at"]

    def get_queryset(self):
        qs = selectors.events_visible_to(self.request.user)
        return _filter(qs, self.request, choices={"kind": EventKind.values}, team="team__slug",
                       deployment="deployment_id", kind="kind")


class AccessTokenViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin,
                         viewsets.GenericViewSet):
    """Your live personal access tokens for the REST API. The secret is returned once, at creation; DELETE
    revokes."""

    serializer_class = s.AccessTokenSerializer
    queryset = AccessToken.objects.none()
    lookup_value_regex = "[0-9]+"

    def get_queryset(self):
        # DELETE revokes: a revoked token is gone from the API (its record stays in the audit trail).
        return AccessToken.objects.filter(user=self.request.user, revoked_at=None)

    @extend_schema(request=s.AccessTokenSerializer, responses={201: SecretOnce})
    def create(self, request):
        data = s.AccessTokenSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        token, raw = access_token_create(user=request.user, **data.validated_data)
        return _secret_once(dict(s.AccessTokenSerializer(token).data, secret=raw))

    def perform_destroy(self, instance):
        access_token_revoke(user=self.request.user, token=instance)


@extend_schema(parameters=[OpenApiParameter("team", str)])
class ApiKeyViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin,
                    viewsets.GenericViewSet):
    """Team API keys for the OpenAI-compatible gateway. DELETE revokes; the secret is shown only once."""

    serializer_class = s.ApiKeySerializer
    queryset = ApiKey.objects.none()
    lookup_value_regex = "[0-9]+"

    def get_queryset(self):
        # DELETE revokes: a revoked key is gone from the API (its record stays in the audit trail).
        live = selectors.api_keys_visible_to(self.request.user).filter(revoked_at=None)
        return _filter(live, self.request, team="team__slug")

    @extend_schema(request=s.ApiKeySerializer, responses={201: SecretOnce})
    def create(self, request):
        data = s.ApiKeySerializer(data=request.data, context={"request": request})
        data.is_valid(raise_exception=True)
        v = dict(data.validated_data)
        key, raw = api_keys.api_key_create(actor=request.user, team=v.pop("team"), **v)
        return _secret_once(dict(s.ApiKeySerializer(key).data, secret=raw))

    def perform_destroy(self, instance):
        api_keys.api_key_revoke(actor=self.request.user, key=instance)

    @extend_schema(request=None, responses={201: SecretOnce})
    @action(detail=True, methods=["post"])
    def rotate(self, request, pk=None):
        key, raw = api_keys.api_key_rotate(actor=request.user, key=self.get_object())
        return _secret_once(dict(s.ApiKeySerializer(key).data, secret=raw))

    @extend_schema(request=s.ApiKeyTransferSerializer, responses=s.ApiKeySerializer)
    @action(detail=True, methods=["post"])
    def transfer(self, request, pk=None):
        """Make a person's key a team key, so it stays when they leave (team admins; audited)."""
        key = self.get_object()
        body = s.ApiKeyTransferSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        key = api_keys.api_key_transfer_to_team(actor=request.user, key=key, **body.validated_data)
        return Response(s.ApiKeySerializer(key).data)


class UserViewSet(viewsets.ReadOnlyModelViewSet):
    """Who you are (`/users/me/`); platform admins can list users to add them to teams."""

    serializer_class = s.UserSerializer
    lookup_field = "username"
    lookup_value_regex = r"[\w.@+-]+"  # what Django allows in a username

    def get_queryset(self):
        users = get_user_model().objects.order_by("username")
        return users if is_platform_admin(self.request.user) else users.filter(pk=self.request.user.pk)

    def get_object(self):
        if self.kwargs.get("username") == "me":
            return self.request.user
        return super().get_object()
