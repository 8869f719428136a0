"""The `eks` target: the kubernetes driver, plus boto3 for the cluster's endpoint, auth and GPU node groups.

Node groups are one per deployment and stage, named by the deployment's primary key
(`<prefix>d<id>-prefill|decode`: team and deployment names can collide once joined, and get cut at 63
characters) and tagged with its id. Tandem resizes, replaces and deletes a node group only when its
`deployment-id` tag is this deployment's; any other owner is a permanent error naming both. Each pass does one
step and returns, so a node group that is still CREATING makes the reconciler come back later instead of
blocking a worker. A pass describes the cluster once and each node group once.

Each node group runs on its own EC2 launch template of the same name (workers.targets.eks_launch_template); EFA
pools also get a cluster placement group of that name (unless they run in a capacity reservation: then the
reservation's own placement group, if it has one) and Tandem's EFA security group (one per cluster). All of them
carry the same tags, which the driver's IAM policy (deploy/iam/) requires, and so do the instances, volumes and
network interfaces the node groups launch (the launch template's TagSpecifications).

Nothing is left behind: wherever a pass finds a node group of Tandem's gone (before it creates it again, in a pause
or the release of a failed deployment, in a teardown), its launch template and placement group go too, and the EFA
security group goes with the last launch template that uses it.
"""
from dataclasses import dataclass
from datetime import datetime, timedelta

from botocore.exceptions import BotoCoreError, ClientError, ConnectionError as BotoConnectionError
from django.utils import timezone as dj_timezone

from deployments.catalog import INSTANCE_TYPES, InstanceType
from deployments.lifecycle import STARTING, Status
from deployments.services.node_groups import NODEGROUPS_PER_CLUSTER
from deployments.serve_config import STAGES
from deployments.surge import pool_nodes
from workers import clients
from workers.targets.base import AppUnit, PermanentError, Step, TransientError
from workers.targets.eks_capacity import launchable_require
from workers.targets.eks_launch_template import launch_template_data
from workers.targets.eks_tags import (NO_EFA, TAG_DEPLOYMENT_ID, TAG_EFA_SECURITY_GROUP, TAG_INSTANCE_TYPE, TAG_MANAGED,
                                     TAG_NAME, TAG_POOL, TAG_TEAM)
from workers.targets.kubernetes import KubernetesTarget

THROTTLING = {"Throttling", "ThrottlingException", "TooManyRequestsException", "RequestLimitExceeded",
              "ServiceUnavailableException", "ServerException", "InternalFailure"}
DENIED = {"AccessDeniedException", "UnauthorizedOperation", "UnrecognizedClientException",
          "InvalidClientTokenId", "ExpiredTokenException"}
WAITING = {"CREATING", "UPDATING", "DELETING"}
FAILED = {"CREATE_FAILED", "DELETE_FAILED"}  # a node group in these holds nothing worth keeping: it goes
RESIZABLE = {"ACTIVE", "DEGRADED"}  # EKS takes UpdateNodegroupConfig in these only
CLUSTER_BROKEN = {"FAILED", "DELETING"}  # an EKS cluster in these will not become ACTIVE by waiting
NODEGROUP_LABEL = "eks.amazonaws.com/nodegroup"  # EKS puts it on every node of a managed node group
# A paused deployment's node groups: no nodes, kept so a resume resizes them rather than creating them (EKS wants
# maxSize of at least 1).
PAUSED_SCALING = {"minSize": 0, "maxSize": 1, "desiredSize": 0}
# Node group health issue codes (botocore's eks NodegroupIssueCode, described in the EKS API reference's `Issue`,
# docs.aws.amazon.com/eks/latest/APIReference/API_Issue.html) that waiting does not fix: a missing or
# misconfigured resource, a permission or a quota someone has to change. Any other issue of a DEGRADED group
# (AsgInstanceLaunchFailures while capacity is short, InternalFailure, throttling, ClusterUnreachable) is waited
# for, up to the cluster's provisioning deadline.
FATAL_ISSUES = {
    "AccessDenied", "AmiIdNotFound", "AutoScalingGroupNotFound", "AutoScalingGroupInvalidConfiguration",
    "AutoScalingGroupOptInRequired", "Ec2SecurityGroupNotFound", "Ec2LaunchTemplateNotFound",
    "Ec2LaunchTemplateVersionMismatch", "Ec2LaunchTemplateInvalidConfiguration", "Ec2SubnetNotFound",
    "Ec2SubnetInvalidConfiguration", "Ec2SubnetMissingIpv6Assignment", "Ec2SubnetListTooLong",
    "Ec2InstanceTypeDoesNotExist", "IamInstanceProfileNotFound", "IamNodeRoleNotFound", "IamLimitExceeded",
    "InstanceLimitExceeded", "InsufficientFreeAddresses", "KubernetesLabelInvalid", "LimitExceeded",
    "SourceEc2LaunchTemplateNotFound", "Ec2LaunchTemplateMaxLimitExceeded", "Ec2LaunchTemplateVersionMaxLimitExceeded",
}
# AsgInstanceLaunchFailures carries EC2's own error in its message ("Could not launch On-Demand Instances.
# VcpuLimitExceeded - You have requested more vCPU capacity than your current vCPU limit of 0 allows ..."). These
# causes do not heal while the node group waits (a quota, a zone that does not offer the type, a zone out of that
# type), and its other group bills meanwhile: the deployment fails at once, with the fix. Other launch failures
# (throttling, an internal error) are waited for, up to the deadline. EC2's codes and texts: the EC2 API reference's
# "Error codes" (VcpuLimitExceeded, InsufficientInstanceCapacity, Unsupported).
UNLAUNCHABLE = {
    "VcpuLimitExceeded": "the account's vCPU quota for the instance family is below what the node groups launch: "
                         "ask AWS for more (`tandemctl doctor` names the quota, what Tandem runs and the command), "
                         "then retry",
    "InsufficientInstanceCapacity": "EC2 has no capacity of this instance type in the node subnets' zone now: "
                                    "retry later, run on a capacity reservation or capacity block (the cluster's "
                                    "capacity_type and capacity_reservation_ids), or choose another instance type",
    "not supported in your requested Availability Zone": "the node subnets' zone does not offer this instance "
                                                         "type: register private subnets of a zone that does "
                                                         "(`tandemctl doctor` lists them), or choose another "
                                                         "instance type, then retry",
}
LAUNCHING = {"CREATING", "UPDATING", "DEGRADED"}  # node group statuses whose launch failures are read as they happen


def aws_error(e: Exception, *, doing: str) -> Exception:
    """Classify a boto3 failure as transient (throttling, 5xx, network) or permanent (denied, invalid)."""
    if isinstance(e, ClientError):
        code = e.response.get("Error", {}).get("Code", "")
        status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        message = e.response.get("Error", {}).get("Message", "")
        if code in THROTTLING or status == 429 or status >= 500:
            return TransientError(f"AWS is throttling or unavailable while {doing} ({code}); retrying.")
        if code in DENIED:
            return PermanentError(f"AWS refused the worker's credentials while {doing} ({code}): give the "
                                  "worker's role deploy/iam/eks-driver-policy.json.")
        return PermanentError(f"AWS rejected {doing}: {code}: {message}")
    if isinstance(e, (BotoConnectionError, BotoCoreError)):
        return TransientError(f"Cannot reach AWS while {doing}: {type(e).__name__}; retrying.")
    return e


def efa_security_group_name(cluster) -> str:
    """Tandem's EFA security group in the cluster's VPC (one per cluster; the preflight reads it too)."""
    return f"{cluster.config_typed.nodegroup_prefix}efa"


def nodegroup_taints(instance: InstanceType) -> list[dict]:
    """The taints of a node group of this instance type, in EKS's API form: only pods that tolerate them (Tandem's,
    and the device plugins installed as docs/install.md says) land on its GPU nodes."""
    taints = [{"key": "nvidia.com/gpu", "value": "true", "effect": "NO_SCHEDULE"}]
    if instance.has_efa:
        taints.append({"key": "vpc.amazonaws.com/efa", "value": "true", "effect": "NO_SCHEDULE"})
    return taints


def _scaling(nodes: int) -> dict:
    """A node group of a fixed node count (Ray Serve scales replicas inside it)."""
    return {"minSize": nodes, "maxSize": nodes, "desiredSize": nodes}


def _issues(ng: dict) -> str:
    """What EKS reports wrong with a node group, in its own words."""
    return "; ".join(f"{i.get('code', '')}: {i.get('message', '')}".strip(": ")
                     for i in ng.get("health", {}).get("issues", [])) or "EKS gives no detail"


def _fatal(ng: dict) -> bool:
    return any(i.get("code") in FATAL_ISSUES for i in ng.get("health", {}).get("issues", []))


def _unlaunchable(ng: dict) -> str | None:
    """The fix, when a launch failure EKS reports for the node group is one waiting does not fix (UNLAUNCHABLE)."""
    for issue in ng.get("health", {}).get("issues", []):
        if issue.get("code") == "AsgInstanceLaunchFailures":
            for cause, fix in UNLAUNCHABLE.items():
                if cause in issue.get("message", ""):
                    return fix
    return None


class Unlaunchable(PermanentError):
    """A node group EC2 cannot launch instances for, for a cause that waiting does not fix (UNLAUNCHABLE)."""


def _tags(deployment) -> dict[str, str]:
    return {TAG_MANAGED: "tandem", TAG_DEPLOYMENT_ID: str(deployment.pk), TAG_TEAM: deployment.team.slug,
            TAG_NAME: deployment.name}


def _pool_tags(deployment, stage: str) -> dict[str, str]:
    """What a pool's node group, launch template and placement group, and its instances, volumes and network
    interfaces, carry: who pays for them and which stage they serve."""
    return {**_tags(deployment), TAG_POOL: stage}


def _tag_spec(resource_type: str, tags: dict[str, str]) -> list[dict]:
    return [{"ResourceType": resource_type, "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}]


def _code(e: ClientError) -> str:
    return e.response.get("Error", {}).get("Code", "")


@dataclass(frozen=True)
class Capacity:
    """How a pool's node group gets its instances: EKS's capacityType, the capacity reservation (or Capacity Block)
    its launch template targets, and that reservation's own cluster placement group, if it was made in one."""

    type: str
    reservation: str | None = None
    placement_group: str | None = None


class EksTarget(KubernetesTarget):
    """Drives a deployment onto an EKS cluster, managing the prefill and decode node groups."""

    ACCESS = ("give the worker's IAM role access to the cluster (an EKS access entry, or its aws-auth mapping) "
              "and check the worker's clock (a token signed by a skewed clock reads as expired)")

    def __init__(self, cluster, *, api=None, session=None):
        super().__init__(cluster, api=api)
        self._session = session
        self._eks = self._ec2 = self._quotas = None
        self._names: dict[tuple[int, str], str] = {}
        self._cluster_info: dict | None = None
        self._groups: dict[str, dict | None] = {}  # node groups described in this pass, by name
        self._subnets: list[dict] | None = None

    @property
    def region(self) -> str:
        return self.config.region

    @property
    def eks_name(self) -> str:
        return self.config.cluster_name

    @property
    def session(self):
        """The worker's own AWS session, or the cluster's `role_arn` assumed through STS."""
        if self._session is None:
            session = clients.aws_session(region=self.region)
            if role := self.config.role_arn:
                try:
                    session = clients.aws_assumed_session(session, role_arn=role, region=self.region,
                                                          endpoint_url=self.config.aws_endpoint_url)
                except (ClientError, BotoCoreError) as e:
                    raise aws_error(e, doing=f"assuming {role}") from None
            self._session = session
        return self._session

    @property
    def eks(self):
        if self._eks is None:
            self._eks = clients.aws_client(self.session, "eks",
                                           endpoint_url=self.config.aws_endpoint_url)
        return self._eks

    @property
    def ec2(self):
        if self._ec2 is None:
            self._ec2 = clients.aws_client(self.session, "ec2",
                                           endpoint_url=self.config.aws_endpoint_url)
        return self._ec2

    @property
    def quotas(self):
        """Service Quotas, for the vCPU quota of an instance family (workers.targets.eks_capacity)."""
        if self._quotas is None:
            self._quotas = clients.aws_client(self.session, "service-quotas", endpoint_url=self.config.aws_endpoint_url)
        return self._quotas

    def _aws(self, doing: str, fn, *, tolerate: str = "", **kwargs):
        """One AWS call, its failure classified; None when it fails with the error code `tolerate` (an expected
        answer such as "not found" or "already exists")."""
        try:
            return fn(**kwargs)
        except ClientError as e:
            if tolerate and _code(e) == tolerate:
                return None
            raise aws_error(e, doing=doing) from None
        except BotoCoreError as e:
            raise aws_error(e, doing=doing) from None

    def _new_pass(self) -> None:
        """Forget what the last pass saw: each pass reads the cluster and its node groups once, afresh."""
        self._cluster_info, self._groups, self._subnets = None, {}, None

    def _active_cluster(self) -> dict:
        """DescribeCluster, once per pass: an ACTIVE cluster, else wait for it (creating, updating) or fail (failed,
        deleting). EKS refuses node group changes on a cluster that is not ACTIVE, so this comes first."""
        if self._cluster_info is None:
            info = self._aws(f"describing EKS cluster {self.eks_name}", self.eks.describe_cluster,
                             name=self.eks_name)["cluster"]
            status = info.get("status")
            if status in CLUSTER_BROKEN:
                raise PermanentError(f"EKS cluster {self.eks_name} is {status}: nothing can run on it. Fix or "
                                     "recreate it in the EKS console (or register another cluster), then retry.")
            if status != "ACTIVE":  # creating, updating, pending: it comes back by itself
                raise TransientError(f"EKS cluster {self.eks_name} is {status}; waiting for ACTIVE.")
            self._cluster_info = info
        return self._cluster_info

    def build_api(self):
        """Endpoint and CA from DescribeCluster, a fresh STS-presigned bearer token; no kubeconfig, no CLI."""
        info = self._active_cluster()
        host = self.config.kubernetes_endpoint_url or info["endpoint"]
        try:
            token = clients.eks_bearer_token(session=self.session, cluster_name=self.eks_name, region=self.region,
                                             sts_endpoint_url=self.config.aws_endpoint_url)
        except BotoCoreError as e:
            raise aws_error(e, doing="signing the EKS token") from None
        return clients.kubernetes_api_from_token(host=host, token=token,
                                                 ca_data=info.get("certificateAuthority", {}).get("data"))

    # --- node groups ----------------------------------------------------------------------------------
    def nodegroup_name(self, deployment, stage: str) -> str:
        """The node group of one stage of one deployment: unique by id, at most 20 + 29 of EKS's 63 characters.

        A deployment from before names were ids keeps its node group under the old name (`<prefix><team>-<name>`)
        when that group's deployment-id tag is its own, rather than paying for a second set of GPU nodes."""
        key = (deployment.pk, stage)
        if key not in self._names:
            prefix = self.config.nodegroup_prefix
            name = f"{prefix}d{deployment.pk}-{stage}"
            legacy = f"{prefix}{deployment.team.slug}-{deployment.name}"[: 63 - len(stage) - 1] + f"-{stage}"
            if self._describe(name) is None and (old := self._describe(legacy)) is not None \
                    and (old.get("tags") or {}).get(TAG_DEPLOYMENT_ID) == str(deployment.pk):
                name = legacy
            self._names[key] = name
        return self._names[key]

    def node_selectors(self, deployment) -> dict[str, dict]:
        return {s: {NODEGROUP_LABEL: self.nodegroup_name(deployment, s)} for s in STAGES}

    def _require_owned(self, deployment, ng: dict, *, doing: str) -> None:
        """Refuse to touch a node group whose deployment-id tag is not this deployment's, naming both owners."""
        tags = ng.get("tags") or {}
        if tags.get(TAG_DEPLOYMENT_ID) == str(deployment.pk):
            return
        mine = f"deployment {deployment.pk} ({deployment.team.slug}/{deployment.name})"
        if tags.get(TAG_MANAGED) != "tandem" or not tags.get(TAG_DEPLOYMENT_ID):
            owner = "no deployment of Tandem's (it has no tandem.dev/deployment-id tag)"
        else:
            owner = (f"deployment {tags[TAG_DEPLOYMENT_ID]} "
                     f"({tags.get(TAG_TEAM, '?')}/{tags.get(TAG_NAME, '?')})")
        raise PermanentError(f"Node group {ng.get('nodegroupName')} on EKS cluster {self.eks_name} belongs to "
                             f"{owner}, not to {mine}; Tandem will not {doing} it. Remove or rename that node "
                             "group, then retry.")

    def _describe(self, name: str) -> dict | None:
        """DescribeNodegroup, at most once per name per pass (a write forgets it: see `_changed`)."""
        if name in self._groups:
            return self._groups[name]
        found = self._aws(f"describing node group {name}", self.eks.describe_nodegroup,
                          tolerate="ResourceNotFoundException", clusterName=self.eks_name, nodegroupName=name)
        ng = found["nodegroup"] if found else None
        self._groups[name] = ng
        return ng

    def _changed(self, name: str, doing: str, fn, **kwargs) -> None:
        """A node group write; its description this pass is stale afterwards."""
        self._aws(f"{doing} node group {name}", fn, clusterName=self.eks_name, nodegroupName=name, **kwargs)
        self._groups.pop(name, None)

    # --- what a node group runs on: subnets, security group, placement group, launch template --------------
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
                            TagSpecifications=_tag_spec("security-group", {TAG_MANAGED: "tandem"}))["GroupId"]
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
            if _code(e) == "DependencyViolation":
                return (f"{efa_security_group_name(self.cluster)} ({gid}): waiting for EC2 to release the network "
                        "interfaces of the terminated nodes that still use it.")
            if _code(e) != "InvalidGroup.NotFound":  # another pass deleted it meanwhile
                raise aws_error(e, doing="deleting the EFA security group") from None
        except BotoCoreError as e:
            raise aws_error(e, doing="deleting the EFA security group") from None
        return None

    def _placement_group(self, deployment, stage: str, name: str) -> str:
        """A cluster placement group for one EFA pool: its nodes on the same network spine."""
        self._aws(f"creating placement group {name}", self.ec2.create_placement_group,
                  tolerate="InvalidPlacementGroup.Duplicate",  # a previous pass made it
                  GroupName=name, Strategy="cluster",
                  TagSpecifications=_tag_spec("placement-group", _pool_tags(deployment, stage)))
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
        tags = _pool_tags(deployment, stage)
        data = launch_template_data(instance=instance, security_group_ids=groups, placement_group=placement,
                                    capacity_reservation_id=capacity.reservation,
                                    capacity_block=capacity.type == "CAPACITY_BLOCK", tags=tags)
        made = self._aws(f"creating launch template {name}", self.ec2.create_launch_template,
                         LaunchTemplateName=name, LaunchTemplateData=data,
                         TagSpecifications=_tag_spec("launch-template", {**tags, TAG_EFA_SECURITY_GROUP: efa_group}))
        template = made["LaunchTemplate"]
        return {"id": template["LaunchTemplateId"], "version": str(template["LatestVersionNumber"])}

    def _free_ec2(self, name: str) -> None:
        """The launch template and placement group of a node group that is gone (absent ones are fine)."""
        self._aws(f"deleting launch template {name}", self.ec2.delete_launch_template,
                  tolerate="InvalidLaunchTemplateName.NotFoundException", LaunchTemplateName=name)
        self._aws(f"deleting placement group {name}", self.ec2.delete_placement_group,
                  tolerate="InvalidPlacementGroup.Unknown", GroupName=name)

    def _create_nodegroup(self, deployment, stage: str, name: str, nodes: int) -> None:
        missing = [k for k in ("node_role_arn", "subnet_ids") if not getattr(self.config, k)]
        if missing:  # a cluster registered before they were required
            raise PermanentError(f"Cluster {self.cluster.name} has no {' or '.join(missing)} in its config; EKS "
                                 "creates no node group without them. A platform admin adds them to the cluster, "
                                 "then retry.")
        pool = deployment.spec_typed.pool(stage)
        instance = INSTANCE_TYPES[pool.instance_type]
        count = len(self._aws("listing node groups", self.eks.list_nodegroups, clusterName=self.eks_name,
                              maxResults=100)["nodegroups"])
        if count >= NODEGROUPS_PER_CLUSTER:
            raise PermanentError(f"EKS cluster {self.eks_name} has {count} managed node groups, EKS's limit per "
                                 "cluster; delete unused ones (or ask AWS for a higher quota), then retry.")
        taints = nodegroup_taints(instance)
        subnets = self._node_subnets(efa=instance.has_efa)
        self._require_launchable(deployment)
        capacity = self._capacity(pool.instance_type, nodes)
        template = self._launch_template(deployment, stage, name, capacity)
        kwargs = {
            "clusterName": self.eks_name, "nodegroupName": name,
            "scalingConfig": _scaling(nodes),
            "amiType": "AL2023_x86_64_NVIDIA", "capacityType": capacity.type,
            "launchTemplate": template,
            "labels": {"tandem.dev/pool": stage, "tandem.dev/deployment": deployment.name,
                       "tandem.dev/team": deployment.team.slug},
            "taints": taints,
            "tags": {**_pool_tags(deployment, stage), TAG_INSTANCE_TYPE: pool.instance_type},
            "subnets": subnets,
            "nodeRole": self.config.node_role_arn,
        }
        if capacity.type != "CAPACITY_BLOCK":  # a Capacity Block's instance type is its launch template's
            kwargs["instanceTypes"] = [pool.instance_type]
        self._aws(f"creating node group {name}", self.eks.create_nodegroup,
                  tolerate="ResourceInUseException", **kwargs)  # else a previous pass (or a killed worker) asked
        self._groups.pop(name, None)

    def _require_launchable(self, deployment) -> None:
        """Nothing is created for a deployment the account cannot launch: an instance type the node subnets' zone
        does not offer, or vCPUs past the family's quota (workers.targets.eks_capacity)."""
        launchable_require(self, deployment, zone=self._subnets[0]["AvailabilityZone"])

    def _ensure_one(self, deployment, stage: str, extra: int) -> tuple[bool, str]:
        name = self.nodegroup_name(deployment, stage)
        pool = deployment.spec_typed.pool(stage)
        nodes = pool_nodes(pool, extra)
        ng = self._describe(name)
        if ng is None:
            self._create_nodegroup(deployment, stage, name, nodes)
            return False, f"{name}: creating {nodes} × {pool.instance_type}"
        self._require_owned(deployment, ng, doing="use, resize or replace")
        status = ng.get("status")
        # Nothing of the deployment serves yet, so all its node groups may go (an update's may serve the previous
        # generation: its launch failures wait, as the deadline does)
        starting = deployment.status in STARTING
        if status == "CREATE_FAILED":
            created = ng.get("createdAt")
            # EKS never retries a failed creation: the group goes, and a retry creates it again.
            self._changed(name, "deleting failed", self.eks.delete_nodegroup)
            if isinstance(created, datetime) and created < deployment.status_changed_at:
                return False, f"{name}: deleting the group a previous attempt failed to create ({_issues(ng)})"
            if starting and (fix := _unlaunchable(ng)):
                raise Unlaunchable(f"Node group {name} could not launch its instances ({_issues(ng)}): {fix}.")
            raise PermanentError(f"Node group {name} could not be created ({_issues(ng)}). Tandem deleted it; check "
                                 "the instance type's availability and quota in the cluster's subnets, then retry.")
        if starting and status in LAUNCHING and (fix := _unlaunchable(ng)):
            # It holds no instance worth keeping, and a retry makes it again (elsewhere, or once the quota is raised).
            self._changed(name, "deleting", self.eks.delete_nodegroup)
            raise Unlaunchable(f"Node group {name} cannot launch its instances ({_issues(ng)}): {fix}.")
        if status in WAITING:
            return False, f"{name}: {status.lower()}"
        deployed = ng.get("instanceTypes") or [(ng.get("tags") or {}).get(TAG_INSTANCE_TYPE)]
        if deployed != [None] and pool.instance_type not in deployed:
            # Instance types of a managed node group are fixed: replace it (once it is gone, _launch_template frees
            # what it ran on).
            self._changed(name, "replacing", self.eks.delete_nodegroup)
            return False, f"{name}: replacing for {pool.instance_type}"
        want = _scaling(nodes)
        have = {k: ng.get("scalingConfig", {}).get(k) for k in want}
        if have != want and status in RESIZABLE:
            self._changed(name, "resizing", self.eks.update_nodegroup_config, scalingConfig=want)
            surge = f" ({extra} replica(s) beyond the spec's while a rollout surges)" if extra else ""
            return False, f"{name}: resizing to {nodes} node(s){surge}"
        if status == "DEGRADED" and not _fatal(ng):
            return False, f"{name}: degraded ({_issues(ng)}); waiting for EKS to recover it"
        if status != "ACTIVE":  # fatally DEGRADED, DELETE_FAILED: EKS says why in its health issues
            raise PermanentError(f"Node group {name} is {status} ({_issues(ng)}); fix it in the EKS console, then "
                                 "retry.")
        return True, f"{name}: {nodes} × {pool.instance_type} active"

    def _deadline_passed(self, deployment) -> int | None:
        """The cluster's deadline in minutes, when the deployment has been provisioning for longer. Not while it
        updates: its node groups may be serving the previous generation, and deleting them would stop it."""
        if deployment.status != Status.PROVISIONING:
            return None
        deadline = self.config.provisioning_deadline_minutes
        waited = (dj_timezone.now() - deployment.status_changed_at).total_seconds() / 60
        return deadline if waited > deadline else None

    def ensure_node_pools(self, deployment, extra: dict[str, int] | None = None) -> Step:
        """Both stages' node groups exist, ACTIVE, with the requested instance type, sized for the spec's replicas
        and `extra` more per stage (a side-by-side rollout's surge: deployments.surge.pool_nodes), back to the
        spec's size once extra is 0; past the cluster's provisioning deadline, the deployment fails with what EKS
        says and its node groups go."""
        self._new_pass()
        self._active_cluster()
        try:
            results = [self._ensure_one(deployment, stage, (extra or {}).get(stage, 0)) for stage in STAGES]
        except Unlaunchable as e:  # the other stage's group goes to zero nodes with the failed deployment's release
            raise PermanentError(f"{e} Tandem deleted that node group; the deployment's other node group is released "
                                 "to zero nodes, kept for a retry.") from None
        ready = all(ok for ok, _ in results)
        if not ready and (deadline := self._deadline_passed(deployment)) is not None:
            reasons = self._delete_node_groups(deployment)
            raise PermanentError(f"The node groups were not ready within the cluster's {deadline}-minute provisioning "
                                 f"deadline: {'; '.join(reasons) or 'no detail from EKS'}. Tandem deleted them so "
                                 "they stop billing; retry once EKS can provide the capacity.")
        return Step(ready=ready, message="; ".join(m for _, m in results))

    def _delete_node_groups(self, deployment) -> list[str]:
        """Delete the deployment's node groups (a failure: they stop billing); what EKS said of those not ACTIVE."""
        reasons = []
        for stage in STAGES:
            name = self.nodegroup_name(deployment, stage)
            ng = self._describe(name)
            if ng is None:
                continue
            if ng.get("status") != "ACTIVE":
                reasons.append(f"{name} is {ng.get('status')} ({_issues(ng)})")
            if ng.get("status") != "DELETING":
                self._changed(name, "deleting", self.eks.delete_nodegroup)
        return reasons

    def pause(self, deployment) -> Step:
        """The RayService goes (as in a teardown), the node groups stay at zero nodes, kept for a resume or a retry.
        One that failed to create (or to go) holds nothing worth keeping and is deleted; what a node group found gone
        ran on (launch template, placement group, the EFA security group once unused) goes with it. The release of
        a failed deployment (workers.pipeline) is this pause."""
        self._new_pass()
        step = super().teardown(deployment)
        if not step.ready:
            return step
        waiting, kept, gone = [], [], []
        for stage in STAGES:
            name = self.nodegroup_name(deployment, stage)
            ng = self._describe(name)
            if ng is None:
                self._free_ec2(name)
                gone.append(name)
                continue
            self._require_owned(deployment, ng, doing="scale down")
            status = ng.get("status")
            if status in WAITING:
                waiting.append(f"{name}: {status.lower()}")
            elif status in FAILED:
                self._changed(name, "deleting failed", self.eks.delete_nodegroup)
                waiting.append(f"{name}: deleting ({status}: {_issues(ng)})")
            elif {k: ng.get("scalingConfig", {}).get(k) for k in PAUSED_SCALING} != PAUSED_SCALING:
                self._changed(name, "scaling to zero", self.eks.update_nodegroup_config, scalingConfig=PAUSED_SCALING)
                waiting.append(f"{name}: scaling to zero")
            else:
                kept.append(name)
        if not waiting and (sg := self._release_efa_security_group()):
            waiting.append(sg)
        if waiting:
            return Step(ready=False, message="; ".join(waiting))
        said = [f"Node groups scaled to zero: {', '.join(kept)}." if kept else "",
                f"Gone, with what they ran on: {', '.join(gone)}." if gone else ""]
        return Step(ready=True, message=" ".join(filter(None, [step.message, *said])))

    def teardown(self, deployment, unit: AppUnit | None = None) -> Step:
        """Kubernetes objects first (so pods leave the nodes), then the node groups Tandem created, then (once a
        group is gone) its launch template and placement group, and the EFA security group with the cluster's last
        EFA node group. One unit's teardown leaves the node groups, which the deployment's other application runs on
        (ensure_node_pools sizes them)."""
        self._new_pass()
        step = super().teardown(deployment, unit)
        if not step.ready or unit is not None:
            return step
        left = []
        for stage in STAGES:
            name = self.nodegroup_name(deployment, stage)
            ng = self._describe(name)
            if ng is None:
                self._free_ec2(name)
                continue
            self._require_owned(deployment, ng, doing="delete")
            if ng.get("status") != "DELETING":
                self._changed(name, "deleting", self.eks.delete_nodegroup)
            left.append(name)
        if left:
            return Step(ready=False, message=f"Deleting node groups: {', '.join(left)}.")
        if sg := self._release_efa_security_group():
            return Step(ready=False, message=f"Node groups deleted; {sg}")
        return Step(ready=True, message=f"{step.message} Node groups deleted.")
