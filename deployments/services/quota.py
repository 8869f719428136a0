"""GPU quota: what a team holds, and the check made at request and at approval."""
from deployments.errors import QuotaExceeded
from deployments.lifecycle import HOLDS_QUOTA
from deployments.models import Deployment, Team
from deployments.quota_rules import quota_gpus
from deployments.spec import spec_load


def team_gpus_held(*, team: Team, exclude_id: int | None = None) -> int:
    """GPUs the team's deployments hold now (those in a status that holds quota), optionally but one, counted
    as provisioned (deployments.quota_rules)."""
    qs = Deployment.objects.filter(team=team, status__in=HOLDS_QUOTA)
    if exclude_id is not None:
        qs = qs.exclude(pk=exclude_id)
    return sum(quota_gpus(spec_load(s), target_kind=kind) for s, kind in qs.values_list("spec", "cluster__kind"))


def quota_check(*, team: Team, gpus: int, exclude_id: int | None = None) -> None:
    """Refuse, with the numbers, when `gpus` more would exceed the team's quota.

    At approval the caller holds the team row locked, so two approvals cannot both pass.
    """
    held = team_gpus_held(team=team, exclude_id=exclude_id)
    if held + gpus > team.gpu_quota:
        raise QuotaExceeded(
            f"This needs {gpus} GPUs; team {team.slug} already holds {held} of its {team.gpu_quota}-GPU quota, "
            f"so only {max(team.gpu_quota - held, 0)} are free. Ask a platform admin for more quota, or use "
            "fewer or smaller nodes."
        )
