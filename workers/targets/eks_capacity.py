"""What the AWS account can launch, read before the eks driver asks EKS for a node group (and by the preflight): the
instance type offered in the node subnets' Availability Zone, and the vCPU quota of its family against what the
deployment needs plus what Tandem's node groups of that family already run.

Without these a node group is created, EKS reports it CREATING, and the Auto Scaling group fails every launch
("Unsupported - Your requested instance type ... is not supported in your requested Availability Zone",
"VcpuLimitExceeded"): the deployment would sit until the provisioning deadline while its other node group bills.

Sources: EC2 `DescribeInstanceTypeOfferings` with `LocationType=availability-zone` (the zones of the region that offer
each type); Service Quotas `GetServiceQuota` (service `ec2`, the codes in deployments.ec2_quotas), whose value is
the account's quota in the region (the default where none was raised). The in-use side counts Tandem's own node
groups (their desired size), which the driver's IAM policy lets it describe; instances outside them count against
the quota too, which the messages say.
"""
from dataclasses import dataclass

from deployments.catalog import INSTANCE_TYPES
from deployments.ec2_quotas import VcpuQuota, vcpu_quota
from deployments.spec import STAGES, DeploymentSpec
from workers.targets.base import PermanentError
from workers.targets.eks_tags import TAG_DEPLOYMENT_ID, TAG_MANAGED

GPU_TYPES = tuple(name for name, i in INSTANCE_TYPES.items() if i.gpus)  # in the catalog's order


def offered_zones(target, instance_types) -> dict[str, set[str]]:
    """{instance type: the Availability Zones of the cluster's region that offer it} (empty: none does)."""
    zones: dict[str, set[str]] = {t: set() for t in instance_types}
    token = None
    while True:
        page = target._aws("reading where the instance types are offered (ec2:DescribeInstanceTypeOfferings)",
                           target.ec2.describe_instance_type_offerings, LocationType="availability-zone",
                           Filters=[{"Name": "instance-type", "Values": sorted(zones)}],
                           **({"NextToken": token} if token else {}))
        for offering in page.get("InstanceTypeOfferings") or []:
            zones.setdefault(offering["InstanceType"], set()).add(offering["Location"])
        token = page.get("NextToken")
        if not token:
            return zones


def not_offered(*, instance_type: str, zone: str, offered: dict[str, set[str]], cluster_name: str) -> tuple[str, str]:
    """(what is wrong, the fix) for an instance type the node subnets' zone does not offer."""
    elsewhere = sorted(offered.get(instance_type) or ())
    where = f"EC2 offers it in {', '.join(elsewhere)}" if elsewhere else "no zone of the region offers it"
    here = [t for t in GPU_TYPES if zone in offered.get(t, ())]
    other_type = f"an instance type offered in {zone}" + (f" ({', '.join(here)})" if here else "")
    fix = (f"Register private subnets of {' or '.join(elsewhere)} as the cluster's subnet_ids (tandemctl cluster set "
           f"{cluster_name} 'subnet_ids=[\"subnet-…\"]'), or choose {other_type}." if elsewhere
           else f"Choose {other_type}.")
    return (f"{instance_type} is not offered in {zone}, the Availability Zone of the cluster's node subnets "
            f"({where}): its node group's instances would never launch.", fix)


def quota_value(target, quota: VcpuQuota) -> float | None:
    """The account's vCPU quota in the cluster's region; None where Service Quotas does not know the quota."""
    found = target._aws(f"reading the vCPU quota {quota.name} (servicequotas:GetServiceQuota)",
                        target.quotas.get_service_quota, tolerate="NoSuchResourceException", ServiceCode="ec2",
                        QuotaCode=quota.code)
    return None if found is None else float(found["Quota"]["Value"])


def tandem_groups(target) -> list[dict]:
    """Tandem's node groups on the cluster (named with its prefix and tagged as Tandem's), as DescribeNodegroup
    says."""
    names, token = [], None
    while True:
        page = target._aws("listing node groups", target.eks.list_nodegroups, clusterName=target.eks_name,
                           **({"nextToken": token} if token else {}))
        names += page.get("nodegroups") or []
        token = page.get("nextToken")
        if not token:
            break
    prefix = target.config.nodegroup_prefix
    groups = [target._describe(n) for n in names if n.startswith(prefix)]
    return [g for g in groups if g and (g.get("tags") or {}).get(TAG_MANAGED) == "tandem"]


def vcpus_running(groups: list[dict], quota: VcpuQuota) -> dict[str, int]:
    """{deployment id: the vCPUs its node groups run against `quota`} (their desired size: what EC2 launches)."""
    running: dict[str, int] = {}
    for g in groups:
        instance = INSTANCE_TYPES.get(next(iter(g.get("instanceTypes") or []), ""))
        if instance is None or vcpu_quota(instance.name, g.get("capacityType") or "ON_DEMAND") != quota:
            continue
        owner = (g.get("tags") or {}).get(TAG_DEPLOYMENT_ID, "")
        running[owner] = running.get(owner, 0) + (g.get("scalingConfig") or {}).get("desiredSize", 0) * instance.vcpus
    return running


@dataclass(frozen=True)
class VcpuNeed:
    """What one spec's node groups need of one quota: vCPUs, and the pools in words."""

    quota: VcpuQuota
    vcpus: int
    pools: tuple[str, ...]  # "prefill 1 × p5.48xlarge"


def spec_needs(spec: DeploymentSpec, *, capacity_type: str) -> list[VcpuNeed]:
    """The vCPUs a spec's node groups take of each quota they count against."""
    needs: dict[VcpuQuota, VcpuNeed] = {}
    for stage in STAGES:
        pool = spec.pool(stage)
        quota = vcpu_quota(pool.instance_type, capacity_type)
        if quota is None:
            continue
        had = needs.get(quota, VcpuNeed(quota, 0, ()))
        needs[quota] = VcpuNeed(quota, had.vcpus + pool.nodes * INSTANCE_TYPES[pool.instance_type].vcpus,
                                had.pools + (f"{stage} {pool.nodes} × {pool.instance_type}",))
    return list(needs.values())


def quota_fix(*, quota: VcpuQuota, wanted: int, region: str) -> str:
    """How to ask AWS for `wanted` vCPUs of the quota."""
    return (f"Ask AWS for at least {wanted} vCPUs: aws service-quotas request-service-quota-increase --service-code "
            f"ec2 --quota-code {quota.code} --desired-value {wanted} --region {region} (or the Service Quotas "
            f"console: Amazon EC2, {quota.name}); AWS may take a few days to grant it.")


def launchable_require(target, deployment, *, zone: str) -> None:
    """Refuse (PermanentError, before anything is created) a deployment whose instance types the node subnets'
    `zone` does not offer, or whose vCPUs, with those Tandem's other node groups of the family run, pass the
    account's quota; each refusal names the numbers and the fix."""
    spec = deployment.spec_typed
    types = {spec.pool(s).instance_type for s in STAGES}
    offered = offered_zones(target, set(GPU_TYPES) | types)
    for itype in sorted(types):
        if zone not in offered.get(itype, ()):
            wrong, fix = not_offered(instance_type=itype, zone=zone, offered=offered, cluster_name=target.cluster.name)
            raise PermanentError(f"{wrong} {fix} Then retry.")
    needs = spec_needs(spec, capacity_type=target.config.capacity_type)
    groups = tandem_groups(target) if needs else []
    for need in needs:
        value = quota_value(target, need.quota)
        if value is None:
            continue  # not known in this region: EKS's launch failure says it, at once (workers.targets.eks)
        running = vcpus_running(groups, need.quota)
        others = sum(v for owner, v in running.items() if owner != str(deployment.pk))
        if need.vcpus + others > value:
            fix = quota_fix(quota=need.quota, wanted=need.vcpus + others, region=target.region)
            raise PermanentError(
                f"This deployment's node groups need {need.vcpus} vCPUs of the quota {need.quota.name} "
                f"({need.quota.code}: {', '.join(need.pools)}) and Tandem's other node groups of the family run "
                f"{others}; the account's quota in {target.region} is {value:g} vCPUs (instances outside Tandem's "
                f"node groups count against it too). {fix} Then retry.")
