"""What an EKS node group of Tandem's runs on in EC2, and its freeing: the node subnets (private, one zone), Tandem's
EFA security group (one per cluster, made with the first EFA node group and deleted with the last launch template
that uses it), a pool's cluster placement group, the capacity reservation or Capacity Block it launches into
(checked against what it reserves before anything is made), and its launch template (workers.targets.eks_launch_
template says what is in it). A mixin of EksTarget (workers.targets.eks): it reads the target's config, clients and
what this pass has described.
"""
from dataclasses import dataclass
from datetime import timedelta

from botocore.exceptions import BotoCoreError, ClientError
from django.utils import timezone as dj_timezone

from deployments.catalog import INSTANCE_TYPES
from workers.targets.aws_errors import aws_error, error_code
from workers.targets.base import PermanentError
from workers.targets.eks_launch_template import launch_template_data
from workers.targets.eks_tags import NO_EFA, TAG_EFA_SECURITY_GROUP, TAG_MANAGED, pool_tags, tag_spec


def efa_security_group_name(cluster) -> str:
    """Tandem's EFA security group in the cluster's VPC (one per cluster; the preflight reads it too)."""
    return f"{cluster.config_typed.nodegroup_prefix}efa"


@dataclass(frozen=True)
class Capacity:
    """How a pool's node group gets its instances: EKS's capacityType, the capacity reservation (or Capacity Block)
    its launch template targets, and that reservation's own cluster placement group, if it was made in one."""

    type: str
    reservation: str | None = None
    placement_group: str | None = None


class Ec2Resources:
    """The EC2 side of an EksTarget's node groups (see the module's docstring)."""

    def _node_subnets(self, *, efa: bool) -> list[str]:
        """The configured subnets after DescribeSubnets: private, in one Availability Zone (EFA does not cross
        zones, and prefill and decode move KV between them); an EFA pool gets exactly one, the first listed."""
        if self._subnets is None:
            ids = list(self.config.subnet_ids)
            found = self._aws("describing the node subnets", self.ec2.describe_subnets, SubnetIds=ids)["Subnets"]
            by_id = {s["SubnetId"]: s for s in found}
            self._subnets = [by_id[i] for i in ids]
        zones = sorted({s["AvailabilityZone"] for s in self._subnets})
        if len(zones) > 1:
            raise PermanentError(f"The cluster's subnet_ids span {', '.join(zones)}: EFA does not cross Availability "
                                 "Zones and KV traffic between zones is slow and billed. List private subnets of "
                                 "one zone in the cluster's subnet_ids, then retry.")
        public = [s["SubnetId"] for s in self._subnets if s.get("MapPublicIpOnLaunch")]
        if public:
            raise PermanentError(f"Subnet {', '.join(public)} gives instances public IP addresses; GPU nodes "
                                 "belong in private subnets. List private subnets in the cluster's subnet_ids.")
        ids = [s["SubnetId"] for s in self._subnets]
        return ids[:1] if efa else ids

    def _find_efa_security_group(self) -> dict | None:
        """Tandem's EFA security group in the cluster's VPC, found by its name."""
        vpc = self._active_cluster().get("resourcesVpcConfig", {}).get("vpcId")
        if not vpc:  # EKS always reports it; a stand-in cluster may not
            return None
        found = self._aws("finding the EFA security group", self.ec2.describe_security_groups,
                          Filters=[{"Name": "group-name", "Values": [efa_security_group_name(self.cluster)]},
                                   {"Name": "vpc-id", "Values": [vpc]}])["SecurityGroups"]
        return found[0] if found else None

    def _efa_security_group(self) -> str:
        """Tandem's EFA security group in the cluster's VPC: all traffic in from and out to its own members, which
        EFA's OS-bypass traffic needs. Created with the first EFA node group; its rules are checked on each node
        group creation."""
        group = self._find_efa_security_group()
        if group is None:
            vpc = self._active_cluster().get("resourcesVpcConfig", {}).get("vpcId")
            gid = self._aws("creating the EFA security group", self.ec2.create_security_group,
                            GroupName=efa_security_group_name(self.cluster), VpcId=vpc,
                            Description="Tandem EFA: all traffic between members",
                            TagSpecifications=tag_spec("security-group", {TAG_MANAGED: "tandem"}))["GroupId"]
            group = {"GroupId": gid, "IpPermissions": [], "IpPermissionsEgress": []}
        gid = group["GroupId"]
        rule = {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": gid}]}

        def has_self(perms):
            return any(p.get("IpProtocol") == "-1"
                       and any(u.get("GroupId") == gid for u in p.get("UserIdGroupPairs", [])) for p in perms)

        if not has_self(group.get("IpPermissions", [])):
            self._aws("opening the EFA security group to itself", self.ec2.authorize_security_group_ingress,
                      GroupId=gid, IpPermissions=[rule])
        if not has_self(group.get("IpPermissionsEgress", [])):
            self._aws("opening the EFA security group to itself", self.ec2.authorize_security_group_egress,
                      GroupId=gid, IpPermissions=[rule])
        return gid

    def _efa_security_group_used(self, gid: str) -> bool:
        """Whether a launch template of Tandem's still names the EFA security group: one made with it (its
        TAG_EFA_SECURITY_GROUP), or one of this cluster's made before templates said (its node group may be EFA)."""
        prefix, token = self.config.nodegroup_prefix, None
        while True:
            page = self._aws("listing Tandem's launch templates", self.ec2.describe_launch_templates,
                             Filters=[{"Name": f"tag:{TAG_MANAGED}", "Values": ["tandem"]}],
                             **({"NextToken": token} if token else {}))
            for template in page.get("LaunchTemplates") or []:
                marker = {t["Key"]: t["Value"] for t in template.get("Tags") or []}.get(TAG_EFA_SECURITY_GROUP)
                if marker == gid or (marker is None and template["LaunchTemplateName"].startswith(prefix)):
                    return True
            if not (token := page.get("NextToken")):
                return False

    def _release_efa_security_group(self) -> str | None:
        """The EFA security group goes once no launch template of Tandem's uses it (the cluster's last EFA node group
        is gone); None when it is gone or still used, else what the pass waits for: EC2 refuses while network
        interfaces of terminated nodes still use it, and a later pass tries again."""
        group = self._find_efa_security_group()
        if group is None or self._efa_security_group_used(group["GroupId"]):
            return None
        gid = group["GroupId"]
        try:
            self.ec2.delete_security_group(GroupId=gid)
        except ClientError as e:
            if error_code(e) == "DependencyViolation":
                return (f"{efa_security_group_name(self.cluster)} ({gid}): waiting for EC2 to release the network "
                        "interfaces of the terminated nodes that still use it.")
            if error_code(e) != "InvalidGroup.NotFound":  # another pass deleted it meanwhile
                raise aws_error(e, doing="deleting the EFA security group") from None
        except BotoCoreError as e:
            raise aws_error(e, doing="deleting the EFA security group") from None
        return None

    def _placement_group(self, deployment, stage: str, name: str) -> str:
        """A cluster placement group for one EFA pool: its nodes on the same network spine."""
        self._aws(f"creating placement group {name}", self.ec2.create_placement_group,
                  tolerate="InvalidPlacementGroup.Duplicate",  # a previous pass made it
                  GroupName=name, Strategy="cluster",
                  TagSpecifications=tag_spec("placement-group", pool_tags(deployment, stage)))
        return name

    def _capacity(self, instance_type: str, nodes: int) -> Capacity:
        """The node group's capacity: the cluster's capacityType and, unless it is SPOT, the reservation its
        capacity_reservation_ids names for the instance type, checked against what it reserves (type, zone, count,
        state; EC2 launches a targeted instance only into a reservation that matches it) before anything is made."""
        capacity = self.config.capacity_type
        rid = self.config.capacity_reservation_ids.get(instance_type)
        if capacity == "CAPACITY_BLOCK" and not rid:
            raise PermanentError(f"The cluster's capacity_type is CAPACITY_BLOCK but its capacity_reservation_ids "
                                 f"names no reservation for {instance_type}; add the capacity block's id for it.")
        if capacity == "SPOT" or not rid:
            return Capacity(capacity)
        found = self._aws(f"describing capacity reservation {rid}", self.ec2.describe_capacity_reservations,
                          tolerate="InvalidCapacityReservationId.NotFound", CapacityReservationIds=[rid])
        where = f"Capacity reservation {rid} (the cluster's capacity_reservation_ids for {instance_type})"
        if not found or not found.get("CapacityReservations"):
            raise PermanentError(f"{where} does not exist in {self.region}. Correct the id in the cluster's "
                                 "capacity_reservation_ids, then retry.")
        r = found["CapacityReservations"][0]
        block = r.get("ReservationType") == "capacity-block"
        zone = self._subnets[0]["AvailabilityZone"]  # one zone: _node_subnets checked it
        problem = None
        if block != (capacity == "CAPACITY_BLOCK"):
            problem = (f"is {'a Capacity Block' if block else 'an On-Demand Capacity Reservation'}: set the "
                       f"cluster's capacity_type to {'CAPACITY_BLOCK' if block else 'ON_DEMAND'}")
        elif r.get("InstanceType") != instance_type:
            problem = f"reserves {r.get('InstanceType')}, not {instance_type}: name one that reserves {instance_type}"
        elif r.get("AvailabilityZone") != zone:
            problem = (f"is in {r.get('AvailabilityZone')} and the cluster's subnets are in {zone}: its instances "
                       f"launch only in its zone, so list private subnets of {r.get('AvailabilityZone')}")
        elif (r.get("TotalInstanceCount") or 0) < nodes:
            problem = (f"reserves {r.get('TotalInstanceCount')} instance(s) and the pool needs {nodes}: make the "
                       "pool smaller or reserve more")
        elif r.get("State") != "active" and not (block and r.get("State") == "scheduled"):
            problem = f"is {r.get('State')}: no instance launches into it"
        elif block and r.get("State") == "scheduled" and r.get("StartDate") and r["StartDate"] > (
                dj_timezone.now() + timedelta(minutes=self.config.provisioning_deadline_minutes)):
            problem = (f"starts at {r['StartDate']:%Y-%m-%d %H:%M} UTC, after the cluster's "
                       f"{self.config.provisioning_deadline_minutes}-minute provisioning deadline: retry once it "
                       "is active")
        if problem:
            raise PermanentError(f"{where} {problem}; then retry.")
        group = r.get("PlacementGroupArn")
        return Capacity(capacity, rid, group.rsplit("/", 1)[-1] if group else None)

    def _launch_template(self, deployment, stage: str, name: str, capacity: Capacity) -> dict:
        """The node group's launch template, made afresh, after whatever an earlier node group of this name ran on
        (a replaced one, one that failed, a killed pass's): an EFA pool's placement group is its own, or, in a
        reservation, the reservation's (a reservation made outside a placement group cannot be moved into one: EC2
        user guide, "Capacity Reservations in cluster placement groups"; a Capacity Block's instances are close by
        design and need none: "Work with Capacity Blocks")."""
        self._free_ec2(name)
        instance = INSTANCE_TYPES[deployment.spec_typed.pool(stage).instance_type]
        groups, placement, efa_group = [], None, NO_EFA
        if instance.has_efa:
            placement = capacity.placement_group if capacity.reservation else \
                self._placement_group(deployment, stage, name)
            efa_group = self._efa_security_group()
            groups = [efa_group, self._active_cluster()["resourcesVpcConfig"]["clusterSecurityGroupId"]]
        tags = pool_tags(deployment, stage)
        data = launch_template_data(instance=instance, security_group_ids=groups, placement_group=placement,
                                    capacity_reservation_id=capacity.reservation,
                                    capacity_block=capacity.type == "CAPACITY_BLOCK", tags=tags)
        made = self._aws(f"creating launch template {name}", self.ec2.create_launch_template,
                         LaunchTemplateName=name, LaunchTemplateData=data,
                         TagSpecifications=tag_spec("launch-template", {**tags, TAG_EFA_SECURITY_GROUP: efa_group}))
        template = made["LaunchTemplate"]
        return {"id": template["LaunchTemplateId"], "version": str(template["LatestVersionNumber"])}

    def _free_ec2(self, name: str) -> None:
        """The launch template and placement group of a node group that is gone (absent ones are fine)."""
        self._aws(f"deleting launch template {name}", self.ec2.delete_launch_template,
                  tolerate="InvalidLaunchTemplateName.NotFoundException", LaunchTemplateName=name)
        self._aws(f"deleting placement group {name}", self.ec2.delete_placement_group,
                  tolerate="InvalidPlacementGroup.Unknown", GroupName=name)
