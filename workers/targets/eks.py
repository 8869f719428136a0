"""The `eks` target: the kubernetes driver, plus boto3 for the cluster's endpoint, auth and GPU node groups.

Node groups are one per deployment and stage, named by the deployment's primary key
(`<prefix>d<id>-prefill|decode`: team and deployment names can collide once joined, and get cut at 63
characters) and tagged with its id. Tandem resizes, replaces and deletes a node group only when its
`deployment-id` tag is this deployment's; any other owner is a permanent error naming both. Each pass does one
step and returns, so a node group that is still CREATING makes the reconciler come back later instead of
blocking a worker.
"""
from botocore.exceptions import BotoCoreError, ClientError, ConnectionError as BotoConnectionError

from deployments.catalog import INSTANCE_TYPES
from deployments.serve_config import STAGES
from deployments.spec import PoolSpec
from workers import clients
from workers.targets.base import PermanentError, Step, TransientError
from workers.targets.kubernetes import KubernetesTarget

TAG_MANAGED = "tandem.dev/managed-by"
TAG_DEPLOYMENT_ID = "tandem.dev/deployment-id"
TAG_TEAM, TAG_NAME = "tandem.dev/team", "tandem.dev/deployment"  # for people reading the console, and errors
THROTTLING = {"Throttling", "ThrottlingException", "TooManyRequestsException", "RequestLimitExceeded",
              "ServiceUnavailableException", "ServerException", "InternalFailure"}
DENIED = {"AccessDeniedException", "UnauthorizedOperation", "UnrecognizedClientException",
          "InvalidClientTokenId", "ExpiredTokenException"}
WAITING = {"CREATING", "UPDATING", "DELETING"}
CLUSTER_BROKEN = {"FAILED", "DELETING"}  # an EKS cluster in these will not become ACTIVE by waiting
NODEGROUP_LABEL = "eks.amazonaws.com/nodegroup"  # EKS puts it on every node of a managed node group
# A paused deployment's node groups: no nodes, kept so a resume resizes them rather than creating them (EKS wants
# maxSize of at least 1).
PAUSED_SCALING = {"minSize": 0, "maxSize": 1, "desiredSize": 0}


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
                                  "worker's role eks:DescribeCluster and eks:*Nodegroup* permissions.")
        return PermanentError(f"AWS rejected {doing}: {code}: {message}")
    if isinstance(e, (BotoConnectionError, BotoCoreError)):
        return TransientError(f"Cannot reach AWS while {doing}: {type(e).__name__}; retrying.")
    return e


def _scaling(pool: PoolSpec) -> dict:
    """A node group sized to the pool: a fixed node count (Ray Serve scales replicas inside it)."""
    return {"minSize": pool.nodes, "maxSize": pool.nodes, "desiredSize": pool.nodes}


def _issues(ng: dict) -> str:
    """What EKS reports wrong with a node group, in its own words."""
    return "; ".join(f"{i.get('code', '')}: {i.get('message', '')}".strip(": ")
                     for i in ng.get("health", {}).get("issues", [])) or "EKS gives no detail"


class EksTarget(KubernetesTarget):
    """Drives a deployment onto an EKS cluster, managing the prefill and decode node groups."""

    ACCESS = ("give the worker's IAM role access to the cluster (an EKS access entry, or its aws-auth mapping) "
              "and check the worker's clock (a token signed by a skewed clock reads as expired)")

    def __init__(self, cluster, *, api=None, session=None):
        super().__init__(cluster, api=api)
        self._session = session
        self._eks = None
        self._names: dict[tuple[int, str], str] = {}
        self._cluster_info: dict | None = None

    @property
    def region(self) -> str:
        return self.cluster.config["region"]

    @property
    def eks_name(self) -> str:
        return self.cluster.config["cluster_name"]

    @property
    def eks(self):
        if self._eks is None:
            session = self._session or clients.aws_session(region=self.region)
            self._session = session
            self._eks = clients.aws_client(session, "eks", endpoint_url=self.cluster.config.get("aws_endpoint_url"))
        return self._eks

    def _aws(self, doing: str, fn, **kwargs):
        try:
            return fn(**kwargs)
        except (ClientError, BotoCoreError) as e:
            raise aws_error(e, doing=doing) from None

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
        host = self.cluster.config.get("kubernetes_endpoint_url") or info["endpoint"]
        try:
            token = clients.eks_bearer_token(session=self._session, cluster_name=self.eks_name, region=self.region,
                                             sts_endpoint_url=self.cluster.config.get("aws_endpoint_url"))
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
            prefix = self.cluster.config.get("nodegroup_prefix", "tandem-")
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
        try:
            return self.eks.describe_nodegroup(clusterName=self.eks_name, nodegroupName=name)["nodegroup"]
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") == "ResourceNotFoundException":
                return None
            raise aws_error(e, doing=f"describing node group {name}") from None
        except BotoCoreError as e:
            raise aws_error(e, doing=f"describing node group {name}") from None

    def _create_nodegroup(self, deployment, stage: str, name: str) -> None:
        pool = deployment.spec_typed.pool(stage)
        instance = INSTANCE_TYPES[pool.instance_type]
        taints = [{"key": "nvidia.com/gpu", "value": "true", "effect": "NO_SCHEDULE"}]
        if instance.has_efa:
            taints.append({"key": "vpc.amazonaws.com/efa", "value": "true", "effect": "NO_SCHEDULE"})
        kwargs = {
            "clusterName": self.eks_name, "nodegroupName": name,
            "scalingConfig": _scaling(pool),
            "instanceTypes": [pool.instance_type], "amiType": "AL2023_x86_64_NVIDIA",
            "labels": {"tandem.dev/pool": stage, "tandem.dev/deployment": deployment.name,
                       "tandem.dev/team": deployment.team.slug},
            "taints": taints,
            "tags": {TAG_MANAGED: "tandem", TAG_DEPLOYMENT_ID: str(deployment.pk), TAG_TEAM: deployment.team.slug,
                     TAG_NAME: deployment.name},
            "subnets": list(self.cluster.config.get("subnet_ids") or []),
            "nodeRole": self.cluster.config.get("node_role_arn", ""),
        }
        try:
            self.eks.create_nodegroup(**kwargs)
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") == "ResourceInUseException":
                return  # a previous pass (or a killed worker) already asked for it
            raise aws_error(e, doing=f"creating node group {name}") from None
        except BotoCoreError as e:
            raise aws_error(e, doing=f"creating node group {name}") from None

    def _ensure_one(self, deployment, stage: str) -> tuple[bool, str]:
        name = self.nodegroup_name(deployment, stage)
        pool = deployment.spec_typed.pool(stage)
        ng = self._describe(name)
        if ng is None:
            self._create_nodegroup(deployment, stage, name)
            return False, f"{name}: creating {pool.nodes} × {pool.instance_type}"
        self._require_owned(deployment, ng, doing="use, resize or replace")
        status = ng.get("status")
        if status == "CREATE_FAILED":
            raise PermanentError(f"Node group {name} could not be created ({_issues(ng)}). Check the instance "
                                 "type's availability and quota in the cluster's subnets, then retry.")
        if status in WAITING:
            return False, f"{name}: {status.lower()}"
        if pool.instance_type not in (ng.get("instanceTypes") or []):
            # Instance types of a managed node group are fixed: replace it.
            self._aws(f"replacing node group {name}", self.eks.delete_nodegroup, clusterName=self.eks_name,
                      nodegroupName=name)
            return False, f"{name}: replacing for {pool.instance_type}"
        want = _scaling(pool)
        have = {k: ng.get("scalingConfig", {}).get(k) for k in want}
        if have != want:
            self._aws(f"resizing node group {name}", self.eks.update_nodegroup_config, clusterName=self.eks_name,
                      nodegroupName=name, scalingConfig=want)
            return False, f"{name}: resizing to {pool.nodes} node(s)"
        if status != "ACTIVE":  # DEGRADED, DELETE_FAILED: EKS says why in its health issues
            raise PermanentError(f"Node group {name} is {status} ({_issues(ng)}); fix it in the EKS console, then "
                                 "retry.")
        return True, f"{name}: {pool.nodes} × {pool.instance_type} active"

    def ensure_node_pools(self, deployment) -> Step:
        """Both stages' node groups exist, ACTIVE, with the requested instance type and size."""
        self._active_cluster()
        results = [self._ensure_one(deployment, stage) for stage in STAGES]
        return Step(ready=all(ok for ok, _ in results), message="; ".join(m for _, m in results))

    def pause(self, deployment) -> Step:
        """The RayService goes (as in a teardown), the node groups stay at zero nodes."""
        step = super().teardown(deployment)
        if not step.ready:
            return step
        waiting = []
        for stage in STAGES:
            name = self.nodegroup_name(deployment, stage)
            ng = self._describe(name)
            if ng is None:
                continue
            self._require_owned(deployment, ng, doing="scale down")
            if ng.get("status") in WAITING:
                waiting.append(f"{name}: {ng['status'].lower()}")
                continue
            have = {k: ng.get("scalingConfig", {}).get(k) for k in PAUSED_SCALING}
            if have != PAUSED_SCALING:
                self._aws(f"scaling node group {name} to zero", self.eks.update_nodegroup_config,
                          clusterName=self.eks_name, nodegroupName=name, scalingConfig=PAUSED_SCALING)
                waiting.append(f"{name}: scaling to zero")
        if waiting:
            return Step(ready=False, message="; ".join(waiting))
        return Step(ready=True, message=f"{step.message} Node groups scaled to zero.")

    def teardown(self, deployment) -> Step:
        """Kubernetes objects first (so pods leave the nodes), then the node groups Tandem created."""
        step = super().teardown(deployment)
        if not step.ready:
            return step
        left = []
        for stage in STAGES:
            name = self.nodegroup_name(deployment, stage)
            ng = self._describe(name)
            if ng is None:
                continue
            self._require_owned(deployment, ng, doing="delete")
            if ng.get("status") != "DELETING":
                self._aws(f"deleting node group {name}", self.eks.delete_nodegroup, clusterName=self.eks_name,
                          nodegroupName=name)
            left.append(name)
        if left:
            return Step(ready=False, message=f"Deleting node groups: {', '.join(left)}.")
        return Step(ready=True, message=f"{step.message} Node groups deleted.")
