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
from datetime import datetime

from botocore.exceptions import BotoCoreError, ClientError
from django.utils import timezone as dj_timezone

from deployments.catalog import INSTANCE_TYPES, InstanceType
from deployments.lifecycle import STARTING, Status
from deployments.services.node_groups import NODEGROUPS_PER_CLUSTER
from deployments.serve_config import STAGES
from deployments.surge import pool_nodes
from workers import clients
from workers.targets.base import AppUnit, PermanentError, Step, TransientError
from workers.targets.eks_capacity import launchable_require
from workers.targets.aws_errors import aws_error, error_code
from workers.targets.eks_ec2 import Ec2Resources
from workers.targets.eks_tags import TAG_DEPLOYMENT_ID, TAG_INSTANCE_TYPE, TAG_MANAGED, TAG_NAME, TAG_TEAM, pool_tags
from workers.targets.kubernetes import KubernetesTarget

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


def _code(e: ClientError) -> str:
    return e.response.get("Error", {}).get("Code", "")


class EksTarget(Ec2Resources, KubernetesTarget):
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
            if tolerate and error_code(e) == tolerate:
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
            "tags": {**pool_tags(deployment, stage), TAG_INSTANCE_TYPE: pool.instance_type},
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
