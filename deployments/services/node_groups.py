"""EKS's limit on managed node groups per cluster, checked when a deployment is approved, before anything is spent.

Tandem makes one node group per stage of each deployment on an `eks` cluster and keeps them while the deployment
holds quota, has failed (until retried or deleted) or is paused (scaled to zero). The driver checks again with
ListNodegroups before it creates one, which also counts node groups that are not Tandem's.
"""
from deployments.errors import QuotaExceeded
from deployments.lifecycle import HOLDS_QUOTA, Status
from deployments.models import Cluster, Deployment
from deployments.serve_config import STAGES

NODEGROUPS_PER_CLUSTER = 30  # EKS's default quota of managed node groups per cluster (Service Quotas L-6D54EA21)
HOLDS_NODE_GROUPS = HOLDS_QUOTA | {Status.PAUSED}


def nodegroup_quota_check(*, cluster: Cluster, exclude_id: int | None = None) -> None:
    """Refuse, with the numbers, an approval whose node groups would pass EKS's per-cluster limit. Locks the
    cluster row, so two approvals onto one cluster cannot both take the last groups."""
    if cluster.kind != Cluster.Kind.EKS:
        return
    Cluster.objects.select_for_update(no_key=True).filter(pk=cluster.pk).exists()
    held = Deployment.objects.filter(cluster=cluster, status__in=HOLDS_NODE_GROUPS).exclude(pk=exclude_id).count()
    groups = held * len(STAGES)
    if groups + len(STAGES) > NODEGROUPS_PER_CLUSTER:
        raise QuotaExceeded(
            f"Cluster {cluster.name} would need {groups + len(STAGES)} managed node groups; EKS allows "
            f"{NODEGROUPS_PER_CLUSTER} per cluster and Tandem's {held} deployments there hold {groups} "
            f"({len(STAGES)} each, paused and failed ones included). Delete deployments that are no longer needed, "
            "or ask AWS to raise the cluster's node group quota, then approve again.")
