"""Reads: what a user may see. A user sees only their teams' objects; platform admins see all."""
from django.contrib.auth import get_user_model
from django.db.models import OuterRef, Prefetch, Q, QuerySet, Subquery

from deployments.lifecycle import WANTS_NODES
from deployments.models import (ApiKey, ClusterCheck, ClusterCheckLine, Deployment, Event, Membership, Rollout,
                                Team)
from deployments.models.deployments import AWAITING_APPROVAL
from deployments.permissions import is_platform_admin
from deployments.spec import DeploymentSpec, spec_load


def _my_team_ids(user) -> QuerySet:
    """The ids of the user's teams, as a subquery: filtering on it needs no join and no DISTINCT over wide rows."""
    return Membership.objects.filter(user=user).values("team_id")


def teams_visible_to(user) -> QuerySet[Team]:
    if is_platform_admin(user):
        return Team.objects.all()
    return Team.objects.filter(memberships__user=user).distinct()


def deployments_visible_to(user) -> QuerySet[Deployment]:
    """With what a row shows joined in (team, cluster, requester, author of a proposal): a page of any length
    costs the same queries."""
    qs = Deployment.objects.select_related("team", "cluster", "requested_by", "proposed_by")
    if is_platform_admin(user):
        return qs
    return qs.filter(team_id__in=_my_team_ids(user))


def deployments_awaiting_approval_by(user) -> QuerySet[Deployment]:
    """Requests and proposed updates that this user may approve."""
    qs = deployments_visible_to(user).filter(AWAITING_APPROVAL)
    if is_platform_admin(user):
        return qs
    admin_teams = Membership.objects.filter(user=user, role=Membership.Role.ADMIN).values("team_id")
    return qs.filter(team_id__in=admin_teams)


def events_visible_to(user) -> QuerySet[Event]:
    qs = Event.objects.select_related("actor", "deployment", "team")
    if is_platform_admin(user):
        return qs
    return qs.filter(team_id__in=_my_team_ids(user))


def memberships_visible_to(user) -> QuerySet[Membership]:
    return Membership.objects.select_related("team", "user").filter(team__in=teams_visible_to(user))


def api_keys_visible_to(user) -> QuerySet[ApiKey]:
    return ApiKey.objects.select_related("team", "owner", "created_by").prefetch_related("deployments").filter(
        team__in=teams_visible_to(user))


def users_visible_to(user) -> QuerySet:
    """People a user may name (to add to a team): everyone for platform admins; otherwise those who share a team
    with them, and people in no team yet (new arrivals waiting to be added). Another team's members are not
    visible: naming one answers as a name that does not exist."""
    users = get_user_model().objects.filter(is_active=True)
    if is_platform_admin(user):
        return users
    mine = Membership.objects.filter(team__memberships__user=user).values("user_id")
    return users.filter(Q(pk__in=mine) | Q(pk=user.pk) | Q(memberships__isnull=True)).distinct()


def cluster_check_latest(cluster) -> ClusterCheck | None:
    """The cluster's most recent preflight run with its lines, or None when it was never checked."""
    return ClusterCheck.objects.filter(cluster=cluster).order_by("-created_at", "-pk").prefetch_related(
        "lines").first()


def cluster_node_demand(cluster) -> list[tuple[Deployment, DeploymentSpec]]:
    """The deployments that run on the cluster or are about to (lifecycle.WANTS_NODES) or wait for approval, each
    with the spec its nodes follow once approved (a proposed update's, where one waits), oldest first."""
    found = Deployment.objects.filter(Q(cluster=cluster) & (Q(status__in=WANTS_NODES) | AWAITING_APPROVAL)
                                      ).select_related("team").order_by("created_at", "pk")
    return [(d, spec_load(d.proposed_spec) if d.proposal_open else d.spec_typed) for d in found]


def cluster_check_failures(cluster_ids) -> dict[int, list]:
    """{cluster id: the failed lines of its latest finished run} for these clusters (only those with failures):
    what an approver sees before approving onto a cluster whose preflight fails."""
    latest = ClusterCheck.objects.filter(cluster=OuterRef("cluster")).exclude(
        status=ClusterCheck.Status.RUNNING).order_by("-created_at", "-pk").values("pk")[:1]
    runs = ClusterCheck.objects.filter(cluster_id__in=set(cluster_ids), pk=Subquery(latest))
    failures: dict[int, list] = {}
    for line in ClusterCheckLine.objects.filter(check_run__in=runs, status=ClusterCheckLine.Status.FAIL).select_related(
            "check_run").order_by("position"):
        failures.setdefault(line.check_run.cluster_id, []).append(line)
    return failures


def rollouts_of(deployment: Deployment) -> QuerySet[Rollout]:
    """The deployment's rollouts, newest first (each knows its deployment: no query per row)."""
    return deployment.rollouts.all()


def with_active_rollout(deployments: QuerySet[Deployment]) -> QuerySet[Deployment]:
    """Deployments with their rollout in progress loaded beside them (`active_rollouts`, a list of at most one):
    one query for a page of any length."""
    return deployments.prefetch_related(Prefetch(
        "rollouts", queryset=Rollout.objects.filter(state__in=Rollout.ACTIVE), to_attr="active_rollouts"))


def rollout_active_of(deployment: Deployment) -> Rollout | None:
    """The deployment's rollout in progress, as `with_active_rollout` loaded it (or one query without it)."""
    if (loaded := vars(deployment).get("active_rollouts")) is not None:
        return loaded[0] if loaded else None
    return deployment.rollouts.filter(state__in=Rollout.ACTIVE).first()
