"""GPU quota: what a team holds, and the check made at request and at approval."""
from django.db.models import Count

from deployments.errors import QuotaExceeded
from deployments.lifecycle import HOLDS_QUOTA
from deployments.models import Deployment, Rollout, Team
from deployments.quota_rules import pools_quota_gpus
from deployments.serve_config import STAGES
from deployments.spec import spec_load
from deployments.surge import Surge, rollout_surge

# What the count depends on, per stage (the spec's facts stored on the row): deployments alike in these are
# counted once, times how many there are.
_POOL_FIELDS = [f"{stage}_{field}" for stage in STAGES for field in ("instance_type", "nodes", "gpus_per_node")]


def teams_gpus_held(*, team_ids, exclude_id: int | None = None) -> dict[int, int]:
    """GPUs each team's deployments hold now (those in a status that holds quota), optionally but one, counted
    as provisioned (deployments.quota_rules), with the surge of each side-by-side rollout in progress
    (deployments.surge). One query for any number of teams and deployments: PostgreSQL groups the deployments by
    the pools' shape and cluster kind, and each shape is counted once; a second reads the rollouts in progress."""
    qs = Deployment.objects.filter(team_id__in=team_ids, status__in=HOLDS_QUOTA)
    if exclude_id is not None:
        qs = qs.exclude(pk=exclude_id)
    rows = qs.values("team_id", "cluster__kind", *_POOL_FIELDS).annotate(n=Count("id")).order_by()
    held = dict.fromkeys(team_ids, 0)
    for row in rows:
        pools = {stage: (row[f"{stage}_instance_type"], row[f"{stage}_nodes"], row[f"{stage}_gpus_per_node"])
                 for stage in STAGES}
        held[row["team_id"]] += row["n"] * pools_quota_gpus(pools, target_kind=row["cluster__kind"])
    surging = Rollout.objects.filter(state__in=Rollout.ACTIVE, mode=Rollout.Mode.SIDE_BY_SIDE,
                                     deployment__in=qs).values("deployment__team_id", "deployment__spec",
                                                               "deployment__cluster__kind")
    for row in surging:
        surge = rollout_surge(spec_load(row["deployment__spec"]), target_kind=row["deployment__cluster__kind"])
        held[row["deployment__team_id"]] += surge.total_gpus
    return held


def team_gpus_held(*, team: Team, exclude_id: int | None = None) -> int:
    """GPUs one team holds now (teams_gpus_held)."""
    return teams_gpus_held(team_ids=[team.pk], exclude_id=exclude_id)[team.pk]


def quota_check(*, team: Team, gpus: int, exclude_id: int | None = None, surge: Surge | None = None) -> None:
    """Refuse, with the numbers, when `gpus` more (and a side-by-side rollout's `surge` on top) would exceed the
    team's quota.

    At approval the caller holds the team row locked, so two approvals cannot both pass.
    """
    held = team_gpus_held(team=team, exclude_id=exclude_id)
    extra = surge.total_gpus if surge is not None else 0
    if held + gpus + extra > team.gpu_quota:
        needs = (f"{gpus + extra} GPUs ({gpus} for the spec and {extra} for the rollout's surge: the new "
                 "generation runs beside the old one, with up to rollout.max_surge replicas per pool beyond the "
                 "spec's, until it takes every request)") if extra else f"{gpus} GPUs"
        raise QuotaExceeded(
            f"This needs {needs}; team {team.slug} already holds {held} of its {team.gpu_quota}-GPU quota, "
            f"so only {max(team.gpu_quota - held, 0)} are free. Ask a platform admin for more quota, or use "
            "fewer or smaller nodes."
        )
