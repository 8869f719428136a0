"""What EC2 does that moto does not, for the EKS emulator: capacity reservations (ODCRs and Capacity Blocks, absent
from moto), a security group that network interfaces still use, and the tags a launch template may set at launch.

Sources: EC2's API reference (DescribeCapacityReservations and its `CapacityReservation` shape in botocore's ec2
model; an unknown id is `InvalidCapacityReservationId.NotFound`, as terraform-provider-aws handles it;
DeleteSecurityGroup answers `DependencyViolation` while a network interface is in the group;
`LaunchTemplateTagSpecificationRequest`: a launch template may tag only instance, volume, network-interface and
spot-instances-request at launch), and the EC2 user guide on Capacity Blocks (delivered as targeted reservations in
one Availability Zone, of reservation type `capacity-block`) and on Capacity Reservations in cluster placement
groups (a reservation is made in a placement group or not, and cannot be moved into one later).
"""
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from xml.sax.saxutils import escape

from tests.support.eks_rules import _ec2_backend, _ec2_error, _ec2_ok

LAUNCH_TAGGABLE = ("instance", "volume", "network-interface", "spot-instances-request")


@dataclass
class Reservation:
    id: str
    instance_type: str
    zone: str
    count: int
    capacity_block: bool
    placement_group: str | None  # the cluster placement group it was made in
    state: str
    start: datetime
    end: datetime

    def xml(self, region: str) -> str:
        group = (f"<placementGroupArn>arn:aws:ec2:{region}:123456789012:placement-group/"
                 f"{escape(self.placement_group)}</placementGroupArn>" if self.placement_group else "")
        return (f"<item><capacityReservationId>{self.id}</capacityReservationId><instanceType>{self.instance_type}"
                f"</instanceType><instancePlatform>Linux/UNIX</instancePlatform><availabilityZone>{self.zone}"
                f"</availabilityZone><tenancy>default</tenancy><totalInstanceCount>{self.count}</totalInstanceCount>"
                f"<availableInstanceCount>{self.count}</availableInstanceCount><state>{self.state}</state>"
                f"<startDate>{self.start:%Y-%m-%dT%H:%M:%S.000Z}</startDate>"
                f"<endDate>{self.end:%Y-%m-%dT%H:%M:%S.000Z}</endDate><instanceMatchCriteria>targeted"
                f"</instanceMatchCriteria><reservationType>{'capacity-block' if self.capacity_block else 'default'}"
                f"</reservationType>{group}</item>")


class Ec2Rules:
    """Capacity reservations, per server (`reserve` makes one as its owner would buy it); `reset` forgets them."""

    def __init__(self):
        self.reservations: dict[str, Reservation] = {}

    def reset(self) -> None:
        self.reservations.clear()

    def reserve(self, instance_type: str, zone: str, count: int = 2, *, capacity_block: bool = False,
                placement_group: str | None = None, state: str = "active",
                starts_in: timedelta = timedelta(0)) -> str:
        """A reservation of `count` instances in `zone` (e.g. us-west-2a): an ODCR, or a Capacity Block."""
        rid = f"cr-{uuid.uuid4().hex[:17]}"
        start = datetime.now(UTC) + starts_in
        self.reservations[rid] = Reservation(rid, instance_type, zone, count, capacity_block, placement_group, state,
                                             start, start + timedelta(days=1))
        return rid

    def answer(self, action: str, params: dict, *, region: str):
        """EC2's answer where moto has none or answers otherwise; None for what moto answers itself."""
        if action == "DescribeCapacityReservations":
            ids = [v[0] for k, v in sorted(params.items()) if k.startswith("CapacityReservationId.")]
            if unknown := [i for i in ids if i not in self.reservations]:
                return _ec2_error("InvalidCapacityReservationId.NotFound",
                                  f"The capacity reservation ID '{unknown[0]}' does not exist")
            items = "".join(r.xml(region) for i, r in self.reservations.items() if not ids or i in ids)
            return _ec2_ok(action, f"<capacityReservationSet>{items}</capacityReservationSet>")
        if action == "DeleteSecurityGroup":
            group = params.get("GroupId", [""])[0]
            users = [e.id for e in _ec2_backend(region).enis.values()
                     if group in {g.id for g in e.group_set}]
            if users:
                return _ec2_error("DependencyViolation", f"resource {group} has a dependent object")
        if action == "CreateLaunchTemplate":
            n = 1
            while (kind := params.get(f"LaunchTemplateData.TagSpecification.{n}.ResourceType")) is not None:
                if kind[0] not in LAUNCH_TAGGABLE:
                    return _ec2_error("InvalidParameterValue",
                                      f"'{kind[0]}' is not a valid taggable resource type at launch: "
                                      f"{', '.join(LAUNCH_TAGGABLE)}")
                n += 1
        return None

    def launch_failure(self, data: dict, *, types: list[str], zones: list[str], capacity_type: str) -> str | None:
        """Why EC2 would not launch a node group's instances into the reservation its launch template targets (as the
        Auto Scaling group reports it); None when it would, or when the template targets none."""
        target = ((data.get("CapacityReservationSpecification") or {}).get("CapacityReservationTarget") or {})
        rid = target.get("CapacityReservationId")
        if not rid:
            return None
        r = self.reservations.get(rid)
        if r is None:
            return f"InvalidCapacityReservationId.NotFound - The capacity reservation ID '{rid}' does not exist."
        block = (data.get("InstanceMarketOptions") or {}).get("MarketType") == "capacity-block"
        placement = (data.get("Placement") or {}).get("GroupName")
        if block != r.capacity_block:
            return (f"InvalidParameterCombination - {rid} is {'a Capacity Block' if r.capacity_block else 'an ODCR'}"
                    f" and the launch {'asks for' if block else 'does not ask for'} market type capacity-block.")
        if set(types) != {r.instance_type}:
            return f"ReservationCapacityExceeded - {rid} reserves {r.instance_type}, not {', '.join(types)}."
        if zones != [r.zone]:
            return f"ReservationCapacityExceeded - {rid} is in {r.zone}; the subnets are in {', '.join(zones)}."
        if r.placement_group and placement != r.placement_group:
            return (f"ReservationCapacityExceeded - {rid} reserves capacity in placement group {r.placement_group}, "
                    f"and the instances launch {'in ' + placement if placement else 'outside it'}.")
        if r.state not in ("active", "scheduled") or (r.state == "scheduled" and capacity_type != "CAPACITY_BLOCK"):
            return f"ReservationCapacityExceeded - {rid} is {r.state}."
        return None
