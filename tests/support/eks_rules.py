"""What EKS and EC2 do that moto does not: the rules tests/support/moto_server.py applies in front of moto.

Sources: botocore's eks `LaunchTemplateSpecification` documentation (fields a managed node group's launch template
may not hold), `CreateNodegroup`'s error shapes (InvalidParameterException, ResourceLimitExceededException), its
`NodegroupIssueCode` enum, the EKS user guide (launch templates: user data in MIME multi-part format; capacity
blocks: `capacityType` CAPACITY_BLOCK with a template whose market type is capacity-block and that targets the
reservation; 30 managed node groups per cluster), and EC2's API reference for placement groups (its error codes
InvalidPlacementGroup.Duplicate and InvalidPlacementGroup.Unknown) and DeleteLaunchTemplate (an unknown name is
InvalidLaunchTemplateName.NotFoundException, moto's own text for it). Where an emulated message is not AWS's
verbatim, tests assert on the product's reaction, not on the text.

Capacity Blocks (the EKS user guide, "Create a managed node group with Capacity Blocks for ML"): the launch template
holds the market type `capacity-block`, the reservation target and the instance type, and the node group's
capacityType is CAPACITY_BLOCK; "if the capacity type isn't set to CAPACITY_BLOCK or any of the other above required
launch template values are missing, then the create request will be rejected". EKS does not check that the nodes of
a Capacity Block group join the cluster, so such a group is ACTIVE whatever its user data. Launches into a
reservation are judged by tests/support/ec2_rules.py, what nodeadm makes of a NodeConfig by tests/support/nodeadm.py
(a node that cannot read it never joins: NodeCreationFailure, "Instances failed to join the kubernetes cluster").
"""
import base64
import json
import uuid
from xml.sax.saxutils import escape

from moto.core import DEFAULT_ACCOUNT_ID

from tests.support.nodeadm import NodeadmError, node_configs

EC2_NS = "http://ec2.amazonaws.com/doc/2016-11-15/"
FORBIDDEN_IN_TEMPLATE = ("IamInstanceProfile", "HibernationOptions", "InstanceInitiatedShutdownBehavior")
NODEGROUPS_PER_CLUSTER = 30


def _eks_backend(region):
    from moto.eks.models import eks_backends

    return eks_backends[DEFAULT_ACCOUNT_ID][region]


def _ec2_backend(region):
    from moto.ec2.models import ec2_backends

    return ec2_backends[DEFAULT_ACCOUNT_ID][region]


def cluster_vpc(name: str, *, region: str, vpc_id: str, security_group_id: str) -> None:
    """What real EKS's DescribeCluster reports and moto's omits: the cluster's VPC and its security group."""
    cluster = _eks_backend(region).clusters[name]
    cluster.resources_vpc_config = {**cluster.resources_vpc_config, "vpcId": vpc_id,
                                    "clusterSecurityGroupId": security_group_id}


def _eks_error(status: int, code: str, message: str):
    return status, [("Content-Type", "application/json"), ("x-amzn-ErrorType", code)], \
        json.dumps({"message": message}).encode()


def _ec2_error(code: str, message: str):
    body = (f'<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>{code}</Code>'
            f"<Message>{escape(message)}</Message></Error></Errors><RequestID>{uuid.uuid4()}</RequestID></Response>")
    return 400, [("Content-Type", "text/xml")], body.encode()


def _ec2_ok(action: str, inner: str):
    body = (f'<?xml version="1.0" encoding="UTF-8"?><{action}Response xmlns="{EC2_NS}"><requestId>{uuid.uuid4()}'
            f"</requestId>{inner}</{action}Response>")
    return 200, [("Content-Type", "text/xml")], body.encode()


def _tags(params: dict, resource_type: str) -> dict[str, str]:
    """Tags of one resource type from EC2 query parameters (TagSpecification.N.Tag.M.Key/Value)."""
    tags, n = {}, 1
    while f"TagSpecification.{n}.ResourceType" in params:
        if params[f"TagSpecification.{n}.ResourceType"][0] == resource_type:
            m = 1
            while f"TagSpecification.{n}.Tag.{m}.Key" in params:
                tags[params[f"TagSpecification.{n}.Tag.{m}.Key"][0]] = \
                    params.get(f"TagSpecification.{n}.Tag.{m}.Value", [""])[0]
                m += 1
        n += 1
    return tags


class EksRules:
    """Placement groups (absent from moto) and node group rules, per server; `reset` forgets them."""

    def __init__(self):
        self.placement_groups: dict[tuple[str, str], dict] = {}

    def reset(self) -> None:
        self.placement_groups.clear()

    # --- EC2 placement groups --------------------------------------------------------------------------------
    def _group_xml(self, g: dict) -> str:
        tags = "".join(f"<item><key>{escape(k)}</key><value>{escape(v)}</value></item>" for k, v in g["tags"].items())
        return (f"<groupName>{escape(g['name'])}</groupName><groupId>{g['id']}</groupId><state>available</state>"
                f"<strategy>{g['strategy']}</strategy><tagSet>{tags}</tagSet>")

    def ec2_answer(self, action: str, params: dict, *, region: str):
        """The answer to an EC2 placement group call, or None for what moto answers itself."""
        name = params.get("GroupName", [""])[0]
        key = (region, name)
        if action == "CreatePlacementGroup":
            strategy = params.get("Strategy", [""])[0]
            if strategy not in ("cluster", "spread", "partition"):
                return _ec2_error("InvalidParameterValue", f"Value ({strategy}) for parameter strategy is invalid.")
            if key in self.placement_groups:
                return _ec2_error("InvalidPlacementGroup.Duplicate", f"The Placement Group '{name}' already exists.")
            group = {"name": name, "id": f"pg-{uuid.uuid4().hex[:17]}", "strategy": strategy,
                     "tags": _tags(params, "placement-group")}
            self.placement_groups[key] = group
            return _ec2_ok(action, f"<placementGroup>{self._group_xml(group)}</placementGroup>")
        if action == "DeletePlacementGroup":
            if self.placement_groups.pop(key, None) is None:
                return _ec2_error("InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown.")
            return _ec2_ok(action, "<return>true</return>")
        if action == "DescribePlacementGroups":
            names = [v[0] for k, v in params.items() if k.startswith("GroupName.")]
            items = "".join(f"<item>{self._group_xml(g)}</item>" for (r, n), g in self.placement_groups.items()
                            if r == region and (not names or n in names))
            return _ec2_ok(action, f"<placementGroupSet>{items}</placementGroupSet>")
        if action == "DeleteLaunchTemplate":  # moto answers MissingParameter for a name it does not know
            name = params.get("LaunchTemplateName", [""])[0]
            if name and name not in _ec2_backend(region).launch_template_name_to_ids:
                return _ec2_error("InvalidLaunchTemplateName.NotFoundException",
                                  "At least one of the launch templates specified in the request does not exist.")
        return None

    # --- EKS CreateNodegroup ---------------------------------------------------------------------------------
    def _template(self, request: dict, region: str):
        spec = request.get("launchTemplate")
        if not spec:
            return None
        ec2 = _ec2_backend(region)
        try:
            template = ec2.get_launch_template(spec["id"]) if spec.get("id") else \
                ec2.get_launch_template_by_name(spec.get("name", ""))
        except Exception:  # moto's own not-found error
            return "missing"
        return template.get_version(spec["version"]) if spec.get("version") else template.default_version()

    def nodegroup_refusal(self, cluster: str, request: dict, *, region: str):
        """An EKS error for a CreateNodegroup request EKS refuses; None when it passes to moto."""
        if not request.get("nodeRole"):
            return _eks_error(400, "InvalidParameterException", "nodeRole is required to create a node group.")
        subnets = request.get("subnets") or []
        if not subnets:
            return _eks_error(400, "InvalidParameterException", "Subnets are required to create a node group.")
        ec2 = _ec2_backend(region)
        for subnet in subnets:
            try:
                ec2.get_subnet(subnet)
            except Exception:
                return _eks_error(400, "InvalidParameterException", f"The subnet ID '{subnet}' does not exist")
        eks_cluster = _eks_backend(region).clusters.get(cluster)
        if eks_cluster is not None and len(eks_cluster.nodegroups) >= NODEGROUPS_PER_CLUSTER:
            return _eks_error(400, "ResourceLimitExceededException",
                              f"Nodegroups per cluster limit of {NODEGROUPS_PER_CLUSTER} exceeded.")
        version = self._template(request, region)
        if version == "missing":
            return _eks_error(400, "InvalidParameterException", "The launch template does not exist.")
        if version is not None:
            data = version.data
            for field in FORBIDDEN_IN_TEMPLATE:
                if data.get(field):
                    return _eks_error(400, "InvalidParameterException",
                                      f"Launch template {field} is not supported by managed node groups.")
            if any(i.get("SubnetId") for i in _interfaces(data)):
                return _eks_error(400, "InvalidParameterException",
                                  "Network interfaces in a launch template may not name a subnet.")
            market = (data.get("InstanceMarketOptions") or {}).get("MarketType")
            if market == "spot":
                return _eks_error(400, "InvalidParameterException", "Use capacityType SPOT, not a spot request.")
            if data.get("InstanceType") and request.get("instanceTypes"):
                return _eks_error(400, "InvalidParameterException",
                                  "Instance types may be in the launch template or the node group, not both.")
            user_data = version.user_data
            user_data = base64.b64decode(user_data.as_bytes()).decode(errors="replace") if user_data else ""
            if user_data and "multipart/mixed" not in user_data.lower():
                return _eks_error(400, "InvalidParameterException",
                                  "User data was not in the MIME multi-part archive format.")
            reservation = (data.get("CapacityReservationSpecification") or {}).get("CapacityReservationTarget") or {}
            if request.get("capacityType") == "CAPACITY_BLOCK" and not (
                    market == "capacity-block" and reservation.get("CapacityReservationId")
                    and data.get("InstanceType")):
                return _eks_error(400, "InvalidParameterException",
                                  "CAPACITY_BLOCK needs a launch template with market type capacity-block, a "
                                  "capacity reservation target and the instance type.")
            if market == "capacity-block" and request.get("capacityType") != "CAPACITY_BLOCK":
                return _eks_error(400, "InvalidParameterException",
                                  "A launch template of market type capacity-block needs capacityType CAPACITY_BLOCK.")
        elif request.get("capacityType") == "CAPACITY_BLOCK":
            return _eks_error(400, "InvalidParameterException", "CAPACITY_BLOCK needs a launch template.")
        return None

    def nodegroup_created(self, cluster: str, request: dict, *, region: str, short: set[str], phases,
                          ec2_rules, limits) -> None:
        """A node group moto made ACTIVE at once: CREATING (tests/support/nodegroup_phases.py), then ACTIVE, or
        CREATE_FAILED with the health issue EKS reports once its Auto Scaling group tries to launch and its nodes to
        join."""
        group = _eks_backend(region).clusters.get(cluster, None)
        group = group and group.nodegroups.get(request.get("nodegroupName"))
        if group is None or group.status != "ACTIVE":
            return
        if request.get("launchTemplate") and not request.get("instanceTypes"):
            group.instance_types = None  # botocore's Nodegroup.instanceTypes: null for a launch template's type
        key = (region, cluster, group.nodegroup_name)
        code, issue = self._launch_issue(cluster, request, region=region, short=short, ec2_rules=ec2_rules,
                                         limits=limits)
        if issue:
            phases.creating(key, ends_in="CREATE_FAILED", issues=[
                {"code": code, "message": issue, "resourceIds": [f"eks-{group.nodegroup_name}-asg"]}])
        else:
            phases.creating(key)

    def _launch_issue(self, cluster: str, request: dict, *, region: str, short: set[str], ec2_rules,
                      limits) -> tuple[str, str | None]:
        """The health issue (code, message) a new node group ends with, or ("", None) when it becomes ACTIVE."""
        version = self._template(request, region)
        data = version.data if version not in (None, "missing") else {}
        ec2 = _ec2_backend(region)
        zones = sorted({ec2.get_subnet(s).availability_zone for s in request["subnets"]})
        types = request.get("instanceTypes") or [data.get("InstanceType", "")]
        placement = (data.get("Placement") or {}).get("GroupName")
        issue = None
        if placement and (region, placement) not in self.placement_groups:
            issue = f"Could not launch On-Demand Instances. InvalidPlacementGroup.Unknown - The Placement Group " \
                    f"'{placement}' is unknown. Launching EC2 instance failed."
        elif any(i.get("InterfaceType") == "efa-only" and not int(i.get("NetworkCardIndex") or 0)
                 and not int(i.get("DeviceIndex") or 0) for i in _interfaces(data)):
            # EC2 user guide, "Maximize network bandwidth ... with multiple network cards"; EKS's "EFA and EFA-only
            # interfaces": network card 0 carries the instance's primary interface, which cannot be EFA-only.
            issue = ("Could not launch On-Demand Instances. InvalidParameterCombination - An EFA-only network "
                     "interface cannot be the primary network interface. Launching EC2 instance failed.")
        elif any(i.get("InterfaceType") in ("efa", "efa-only") for i in _interfaces(data)) and len(zones) > 1:
            issue = ("Could not launch On-Demand Instances. InvalidParameterCombination - EFA interfaces and the "
                     "cluster placement group need one Availability Zone; the subnets span "
                     f"{', '.join(zones)}. Launching EC2 instance failed.")
        elif short & set(types):
            itype = sorted(short & set(types))[0]
            issue = (f"Could not launch On-Demand Instances. InsufficientInstanceCapacity - We currently do not have "
                     f"sufficient {itype} capacity in the Availability Zone you requested ({zones[0]}). Our system "
                     "will be working on provisioning additional capacity. Launching EC2 instance failed.")
        elif why := ec2_rules.launch_failure(data, types=types, zones=zones,
                                             capacity_type=request.get("capacityType") or "ON_DEMAND"):
            issue = f"Could not launch On-Demand Instances. {why} Launching EC2 instance failed."
        elif refused := limits.launch_issue(cluster, request, region=region):  # the account's offerings and quotas
            issue = refused
        if issue:
            return "AsgInstanceLaunchFailures", issue
        if request.get("capacityType") != "CAPACITY_BLOCK":  # EKS checks that these nodes join; not a block's
            try:
                node_configs(version.user_data.as_bytes() if version not in (None, "missing") and
                             version.user_data else None)
            except NodeadmError as e:
                return "NodeCreationFailure", f"Instances failed to join the kubernetes cluster ({e})."
        return "", None


def _interfaces(data: dict) -> list[dict]:
    return data.get("NetworkInterfaces") or data.get("NetworkInterface") or []
