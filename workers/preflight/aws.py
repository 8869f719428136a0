"""The AWS side of the preflight (`eks` clusters): IAM's simulation of the driver's and the node role's rights (the
driver's on the very ARNs it acts on), the node subnets' Availability Zone, Tandem's EFA security group, the
node-group quota (EKS's, per cluster), where the catalog's GPU instance types are offered, and the EC2 vCPU quota of
each GPU family against what the cluster's deployments need."""
import json
from collections.abc import Callable

from botocore.exceptions import BotoCoreError, ClientError
from botocore.parsers import ResponseParserError

from deployments import selectors
from deployments.catalog import INSTANCE_TYPES
from deployments.check_subjects import family_subject, instance_subject
from deployments.ec2_quotas import VCPU_QUOTAS, VcpuQuota, quota_family
from deployments.runtime_images import pinned_image_parse
from deployments.serve_config import STAGES
from deployments.services.node_groups import NODEGROUPS_PER_CLUSTER
from workers import clients
from workers.preflight.lines import FAIL, PASS, UNVERIFIED, CheckLine, Unreadable
from workers.targets import eks_capacity
from workers.targets.eks_ec2 import efa_security_group_name
from workers.targets.eks_tags import TAG_DEPLOYMENT_ID, TAG_MANAGED, TAG_NAME, TAG_TEAM

# What the driver does in AWS, on which of its resources, with the context the policy's conditions read there: each
# row is simulated with the resources' real ARNs (`_driver_arns`), so a policy scoped by ARN and tag
# (deploy/iam/eks-driver-policy.json, which grants exactly DRIVER_ACTIONS: tests/workers/test_preflight.py
# compares) is judged as AWS will judge the driver's calls.
TAGGING = (("aws:RequestTag/tandem.dev/managed-by", "tandem"),
           ("aws:TagKeys", [TAG_MANAGED, TAG_DEPLOYMENT_ID, TAG_TEAM, TAG_NAME]))  # creating with its tags
TAGGED = (("aws:ResourceTag/tandem.dev/managed-by", "tandem"),)  # changing what carries Tandem's tag
DRIVER_REQUESTS: tuple[tuple[tuple[str, ...], tuple[str, ...], tuple], ...] = (
    (("eks:DescribeCluster", "eks:ListNodegroups"), ("cluster",), ()),
    (("eks:CreateNodegroup",), ("cluster",), TAGGING),
    (("eks:TagResource",), ("new_nodegroup",), TAGGING),  # tags at creation: the group has none of its own yet
    (("eks:DescribeNodegroup", "eks:UpdateNodegroupConfig", "eks:DeleteNodegroup"), ("nodegroups",), TAGGED),
    (("iam:PassRole",), ("node_role",), (("iam:PassedToService", "eks.amazonaws.com"),)),
    # EC2's Describe calls and Service Quotas' reads take no resource-level permissions
    (("ec2:DescribeSubnets", "ec2:DescribeSecurityGroups", "ec2:DescribeLaunchTemplates",
      "ec2:DescribeLaunchTemplateVersions", "ec2:DescribeCapacityReservations", "ec2:DescribeInstanceTypeOfferings",
      "servicequotas:GetServiceQuota"), ("*",), ()),
    (("ec2:CreateLaunchTemplate",), ("launch_template",), TAGGING),
    (("ec2:CreatePlacementGroup",), ("placement_group",), TAGGING),
    (("ec2:CreateSecurityGroup",), ("security_group", "vpc"), TAGGING),
    (("ec2:CreateTags",), ("launch_template",), TAGGING + (("ec2:CreateAction", "CreateLaunchTemplate"),)),
    (("ec2:CreateTags",), ("placement_group",), TAGGING + (("ec2:CreateAction", "CreatePlacementGroup"),)),
    (("ec2:CreateTags",), ("security_group",), TAGGING + (("ec2:CreateAction", "CreateSecurityGroup"),)),
    (("ec2:DeleteLaunchTemplate",), ("launch_template",), TAGGED),
    (("ec2:DeletePlacementGroup",), ("placement_group",), TAGGED),
    (("ec2:DeleteSecurityGroup", "ec2:AuthorizeSecurityGroupIngress", "ec2:AuthorizeSecurityGroupEgress"),
     ("security_group",), TAGGED),
    # What EKS checks the caller of CreateNodegroup may do when its launch template tags what it launches (the EKS
    # user guide's launch template page, "Tagging Amazon EC2 instances"): Tandem itself launches nothing.
    (("ec2:RunInstances",), ("instance", "volume", "network_interface"), TAGGING),
    (("ec2:RunInstances",), ("launch_template",), TAGGED),
    (("ec2:RunInstances",), ("image", "subnet", "security_group", "placement_group"), ()),
    (("ec2:CreateTags",), ("instance", "volume", "network_interface"),
     TAGGING + (("ec2:CreateAction", "RunInstances"),)),
    (("iam:SimulatePrincipalPolicy",), ("worker", "node_role"), ()),
    (("ecr:DescribeImages",), ("runtime_repositories",), ()),  # the runtime-images check
)
DRIVER_ACTIONS = tuple(dict.fromkeys(a for actions, _, _ in DRIVER_REQUESTS for a in actions))
# What a GPU node needs: join the cluster (AmazonEKSWorkerNodePolicy), pull images (ECR read), its pods' IPs (CNI).
NODE_ACTIONS = ("ec2:DescribeInstances", "eks:DescribeCluster", "ecr:GetAuthorizationToken", "ecr:BatchGetImage",
                "ecr:GetDownloadUrlForLayer", "ec2:AssignPrivateIpAddresses")
# ARNs of resources that do not exist yet, in AWS's formats: a node group's ARN ends in an id EKS assigns, a launch
# template's name is not in its ARN, and the EFA security group is made with the first EFA node group.
NEW_ID = {"nodegroup": "00000000-0000-0000-0000-000000000000", "launch_template": "lt-00000000000000000",
          "security_group": "sg-00000000000000000", "instance": "i-00000000000000000", "volume": "vol-00000000000000000",
          "network_interface": "eni-00000000000000000", "image": "ami-00000000000000000"}


def _either(names: list[str]) -> str:
    """"a", "a or b", "a, b or c"."""
    return " or ".join(filter(None, [", ".join(names[:-1]), names[-1]]))


class AwsChecks:
    """The checks that call AWS with the worker's identity; `self.target` is the cluster's EksTarget."""

    def _aws_client(self, service: str, *, attempts: int | None = None):
        """A client on the driver's own session (the worker's identity, or the cluster's role_arn assumed)."""
        return clients.aws_client(self.target.session, service,
                                  endpoint_url=self.target.config.aws_endpoint_url, attempts=attempts)

    def _aws(self, doing: str, fn: Callable, **kwargs) -> dict:
        try:
            return fn(**kwargs)
        except ClientError as e:
            error = e.response.get("Error", {})
            raise Unreadable(f"AWS refused {doing}: {error.get('Code', '')}: {error.get('Message', '')}") from None
        except BotoCoreError as e:
            raise Unreadable(f"AWS failed {doing}: {e}") from None

    def _simulate(self, name: str, principal: str, requests, *, fix: str) -> CheckLine:
        """IAM's verdict on `principal` making each request (actions, resource ARNs or None for all, context): pass
        when every action is allowed on every resource, else fail naming each action and ARN that is not."""
        iam = self._aws_client("iam", attempts=1)
        denied, actions, arns = [], [], []
        try:
            for request_actions, resources, context in requests:
                kwargs = {"PolicySourceArn": principal, "ActionNames": list(request_actions)}
                if context:
                    kwargs["ContextEntries"] = [
                        {"ContextKeyName": k, "ContextKeyValues": v if isinstance(v, list) else [v],
                         "ContextKeyType": "stringList" if isinstance(v, list) else "string"} for k, v in context]
                if resources:
                    kwargs["ResourceArns"] = list(resources)
                actions += [a for a in request_actions if a not in actions]
                arns += [r for r in resources or () if r not in arns and r != "*"]
                marker = None
                while True:
                    page = iam.simulate_principal_policy(**kwargs, **({"Marker": marker} if marker else {}))
                    for result in page["EvaluationResults"]:
                        # one result per action; each resource's own decision under ResourceSpecificResults (IAM
                        # API reference, EvaluationResult), else the action's on the one resource
                        each = result.get("ResourceSpecificResults") or [
                            {"EvalResourceName": result.get("EvalResourceName", "*"),
                             "EvalResourceDecision": result["EvalDecision"]}]
                        denied += [f"{result['EvalActionName']} on {r['EvalResourceName']}" for r in each
                                   if r["EvalResourceDecision"] != "allowed"]
                    if not page.get("IsTruncated"):
                        break
                    marker = page["Marker"]
        except (ClientError, BotoCoreError, ResponseParserError) as e:
            reason = str(e).splitlines()[0][:200]
            return CheckLine(name, UNVERIFIED, f"IAM could not simulate {principal}'s policies "
                             f"(iam:SimulatePrincipalPolicy): {type(e).__name__}: {reason}",
                             "Allow the worker's role iam:SimulatePrincipalPolicy on itself and on the node role "
                             "(deploy/iam/eks-driver-policy.json), then run the checks again.")
        if denied:
            return CheckLine(name, FAIL, f"{principal} is not allowed {'; '.join(dict.fromkeys(denied))}.", fix)
        on = f" on {', '.join(arns)}" if arns else ""
        return CheckLine(name, PASS, f"{principal} is allowed {', '.join(actions)}{on}.")

    def _driver_arns(self, principal: str) -> dict[str, list[str]]:
        """The ARNs of what the driver acts on, by DRIVER_REQUESTS' names: the cluster, Tandem's node groups (those
        that exist, and one as the next is named), the node role, the cluster's VPC, Tandem's EFA security group, and
        a launch template and placement group as the driver names them."""
        partition, account = principal.split(":")[1], principal.split(":")[4]
        region, cluster, prefix = self.target.region, self.target.eks_name, self.target.config.nodegroup_prefix
        eks, ec2 = f"arn:{partition}:eks:{region}:{account}", f"arn:{partition}:ec2:{region}:{account}"
        vpc = (self.target._active_cluster().get("resourcesVpcConfig") or {}).get("vpcId")
        found = self._aws("describing the EFA security group (ec2:DescribeSecurityGroups)",
                          self._aws_client("ec2").describe_security_groups,
                          Filters=[{"Name": "group-name", "Values": [efa_security_group_name(self.cluster)]},
                                   {"Name": "vpc-id", "Values": [vpc]}])["SecurityGroups"]
        new_group = f"{eks}:nodegroup/{cluster}/{prefix}d1-{STAGES[0]}/{NEW_ID['nodegroup']}"
        efa_group = found[0]["GroupId"] if found else NEW_ID["security_group"]
        existing = [g["nodegroupArn"] for g in eks_capacity.tandem_groups(self.target) if g.get("nodegroupArn")]
        return {"cluster": [f"{eks}:cluster/{cluster}"], "new_nodegroup": [new_group],
                "nodegroups": existing or [new_group], "node_role": [self.target.config.node_role_arn],
                "vpc": [f"{ec2}:vpc/{vpc}"], "*": ["*"], "worker": [principal],
                "launch_template": [f"{ec2}:launch-template/{NEW_ID['launch_template']}"],
                "placement_group": [f"{ec2}:placement-group/{prefix}d1-{STAGES[0]}"],
                "security_group": [f"{ec2}:security-group/{efa_group}"],
                "instance": [f"{ec2}:instance/{NEW_ID['instance']}"], "volume": [f"{ec2}:volume/{NEW_ID['volume']}"],
                "network_interface": [f"{ec2}:network-interface/{NEW_ID['network_interface']}"],
                "image": [f"arn:{partition}:ec2:{region}::image/{NEW_ID['image']}"],
                "subnet": [f"{ec2}:subnet/{s}" for s in self.target.config.subnet_ids],
                "runtime_repositories": sorted({
                    f"arn:{partition}:ecr:{image.ecr['region']}:{image.ecr['account']}:repository/{image.repository}"
                    for image in map(pinned_image_parse, self.target.config.runtime_images.values())
                    if image is not None and image.ecr is not None})
                or [f"arn:{partition}:ecr:{region}:{account}:repository/tandem-runtime"]}

    def driver_iam(self) -> CheckLine:
        caller = self._aws("reading the worker's identity (sts:GetCallerIdentity)",
                           self._aws_client("sts").get_caller_identity)["Arn"]
        principal = caller
        if ":assumed-role/" in caller:  # the session of a role: simulate the role
            account = caller.split(":")[4]
            principal = self.target.config.role_arn or \
                f"arn:aws:iam::{account}:role/{caller.split(':assumed-role/')[1].split('/')[0]}"
        arns = self._driver_arns(principal)
        requests = [(actions, [arn for name in names for arn in arns[name]], context)
                    for actions, names, context in DRIVER_REQUESTS]
        prefix = self.target.config.nodegroup_prefix
        fix = ("Give it deploy/iam/eks-driver-policy.json with this cluster's values (envsubst: AWS_REGION, "
               "AWS_ACCOUNT_ID, CLUSTER_NAME, NODE_ROLE_NAME, VPC_ID; docs/install.md, step 2)"
               + (f"; the policy names Tandem's node groups and placement groups tandem-*, and this cluster's "
                  f"nodegroup_prefix is {prefix}: replace tandem-* with {prefix}* in it" if prefix != "tandem-" else "")
               + ", then run the checks again.")
        return self._simulate("driver-iam", principal, requests, fix=fix)

    def node_role_iam(self) -> CheckLine:
        role = self.target.config.node_role_arn
        if not role:
            return CheckLine("node-role-iam", FAIL, "The cluster has no node_role_arn: EKS refuses node groups "
                             "without a node role.", "Register the cluster with node_role_arn (docs/install.md, 2).")
        buckets = self._s3_sources()
        actions = NODE_ACTIONS + (("s3:GetObject", "s3:ListBucket") if buckets else ())
        line = self._simulate("node-role-iam", role, [(actions, None, ())],
                              fix="Attach the policies docs/install.md (step 2) names for the node role.")
        if buckets and line.status != PASS:
            return CheckLine(line.name, line.status, f"{line.evidence} (model sources: {', '.join(buckets)})",
                             line.fix)
        return line

    def _s3_sources(self) -> list[str]:
        sources = self.target.config.model_sources
        uris = list(sources.get("s3") or []) + [u for t in (sources.get("teams") or {}).values()
                                                  for u in t.get("s3") or []]
        return sorted(set(uris))

    def subnets(self) -> CheckLine:
        ids = list(self.target.config.subnet_ids)
        fix = "Register the cluster with subnet_ids: private subnets of one Availability Zone."
        if not ids:
            return CheckLine("subnets", FAIL, "The cluster has no subnet_ids.", fix)
        found = self._aws("describing the node subnets (ec2:DescribeSubnets)",
                          self._aws_client("ec2").describe_subnets, SubnetIds=ids)["Subnets"]
        zones: dict[str, list[str]] = {}
        for s in found:
            zones.setdefault(s["AvailabilityZone"], []).append(s["SubnetId"])
        evidence = "; ".join(f"{z}: {', '.join(sorted(s))}" for z, s in sorted(zones.items()))
        if len(zones) > 1:
            zone, subnets = max(zones.items(), key=lambda kv: len(kv[1]))
            return CheckLine("subnets", FAIL, f"The node subnets span {len(zones)} Availability Zones ({evidence}): "
                             "EFA does not cross zones, and KV between prefill and decode would.",
                             f"Keep the subnets of one zone, e.g. {zone}: subnet_ids {json.dumps(sorted(subnets))}.")
        return CheckLine("subnets", PASS, f"One Availability Zone: {evidence}.")

    def efa_security_group(self) -> CheckLine:
        """Tandem's EFA security group (workers.targets.eks makes it with the first EFA node group): all traffic in
        from and out to its own members, which EFA needs."""
        vpc = (self.target._active_cluster().get("resourcesVpcConfig") or {}).get("vpcId")
        name = efa_security_group_name(self.cluster)
        found = self._aws("describing the EFA security group (ec2:DescribeSecurityGroups)",
                          self._aws_client("ec2").describe_security_groups,
                          Filters=[{"Name": "group-name", "Values": [name]},
                                   {"Name": "vpc-id", "Values": [vpc]}])["SecurityGroups"]
        if not found:
            return CheckLine("efa-security-group", PASS, f"No {name} in {vpc} yet: Tandem creates it, open to its own "
                                                         "members, with the first EFA node group.")
        group = found[0]
        sg = group["GroupId"]

        def self_all(rules: list[dict]) -> bool:
            return any(r.get("IpProtocol") == "-1" and any(p.get("GroupId") == sg for p in r.get("UserIdGroupPairs")
                                                          or []) for r in rules)

        missing = [way for way, rules in (("in", group.get("IpPermissions")), ("out", group.get("IpPermissionsEgress")))
                   if not self_all(rules or [])]
        if missing:
            return CheckLine("efa-security-group", FAIL, f"{name} ({sg}) does not let all traffic {' or '.join(missing)} "
                             "between its members: EFA traffic between the nodes is dropped (Tandem restores the "
                             "rules only when it creates a node group).",
                             f"aws ec2 authorize-security-group-ingress --group-id {sg} --protocol -1 --source-group "
                             f"{sg}; aws ec2 authorize-security-group-egress --group-id {sg} "
                             f"--ip-permissions 'IpProtocol=-1,UserIdGroupPairs=[{{GroupId={sg}}}]'")
        return CheckLine("efa-security-group", PASS, f"{name} ({sg}) lets all traffic in from and out to itself.")

    def nodegroup_quota(self) -> CheckLine:
        eks, names, token = self.target.eks, [], None
        while True:
            page = self._aws("listing node groups (eks:ListNodegroups)", eks.list_nodegroups,
                             clusterName=self.target.eks_name, **({"nextToken": token} if token else {}))
            names += page.get("nodegroups") or []
            token = page.get("nextToken")
            if not token:
                break
        left = NODEGROUPS_PER_CLUSTER - len(names)
        evidence = (f"{len(names)} of {NODEGROUPS_PER_CLUSTER} node groups used: room for "
                    f"{max(left, 0) // len(STAGES)} deployment(s).")
        if left < len(STAGES):
            return CheckLine("nodegroup-quota", FAIL, evidence, "Delete unused node groups, or ask AWS for more "
                             "(Service Quotas: Amazon EKS, Managed node groups per cluster).")
        return CheckLine("nodegroup-quota", PASS, evidence)

    # --- what the account can launch: instance types offered in the zone, vCPU quotas ------------------------------
    def _node_zone(self) -> str | None:
        """The Availability Zone of the first node subnet (the one EFA pools use; the `subnets` check fails subnets
        that span zones)."""
        ids = list(self.target.config.subnet_ids)
        if not ids:
            return None
        found = self._aws("describing the node subnets (ec2:DescribeSubnets)",
                          self._aws_client("ec2").describe_subnets, SubnetIds=ids)["Subnets"]
        return {s["SubnetId"]: s["AvailabilityZone"] for s in found}.get(ids[0])

    @staticmethod
    def _asker(d) -> str:
        return f"{d.team.slug}/{d.name} ({'waiting for approval' if d.awaits_approval else d.status})"

    def instance_offerings(self) -> list[CheckLine]:
        """Where the catalog's GPU instance types are offered (EC2 DescribeInstanceTypeOfferings): in the node
        subnets' zone or elsewhere in the region; one failing line per type a deployment here asks for and the zone
        does not offer, its subject that type (an approval of a deployment using it is refused while it fails)."""
        zone = self._node_zone()
        if zone is None:
            return [CheckLine("instance-offerings", UNVERIFIED, "The cluster has no node subnets, so no zone to "
                              "read offerings for.", "Register the cluster with subnet_ids (docs/install.md, 1).")]
        types = eks_capacity.GPU_TYPES
        offered = eks_capacity.offered_zones(self.target, types)
        here = [t for t in types if zone in offered[t]]
        away = [f"{t} ({', '.join(sorted(offered[t])) or 'in no zone of ' + self.target.region})"
                for t in types if zone not in offered[t]]
        lines = [CheckLine("instance-offerings", PASS,
                           f"Offered in {zone}, the node subnets' zone: {', '.join(here) or 'none of them'}. "
                           f"Not offered there: {'; '.join(away) or 'none'}.")]
        asked: dict[str, list[str]] = {}
        for d, spec in selectors.cluster_node_demand(self.cluster):
            for stage in STAGES:
                asked.setdefault(spec.pool(stage).instance_type, []).append(self._asker(d))
        for itype, who in sorted(asked.items()):
            if itype in INSTANCE_TYPES and INSTANCE_TYPES[itype].gpus and zone not in offered.get(itype, ()):
                wrong, fix = eks_capacity.not_offered(instance_type=itype, zone=zone, offered=offered,
                                                      cluster_name=self.cluster.name)
                lines.append(CheckLine("instance-offered", FAIL, f"{wrong} Asked for by "
                                       f"{', '.join(dict.fromkeys(who))}.", f"{fix} Then run the checks again.",
                                       subject=instance_subject(itype)))
        return lines

    def vcpu_quotas(self) -> list[CheckLine]:
        """Each GPU family's EC2 vCPU quota (Service Quotas) for the cluster's capacity type: its value, what Tandem's
        node groups of the family run, the room left in instances of the catalog, and whether it holds what the
        deployments here run or ask for (failing lines carry the family as their subject)."""
        capacity = self.target.config.capacity_type
        families = sorted({f for t in eks_capacity.GPU_TYPES if (f := quota_family(t))})
        quotas = [q for f in families if (q := VCPU_QUOTAS.get((f, capacity)))]
        if not quotas:
            return [CheckLine("vcpu-quota", UNVERIFIED, f"The cluster's capacity_type is {capacity}: its instances "
                              "run in the capacity blocks bought for them, so no vCPU quota is checked.")]
        groups = eks_capacity.tandem_groups(self.target)
        demand = selectors.cluster_node_demand(self.cluster)
        return [self._vcpu_quota(quota, groups, demand) for quota in quotas]

    def _vcpu_quota(self, quota: VcpuQuota, groups: list[dict], demand) -> CheckLine:
        name, region = f"vcpu-quota-{quota.family.lower()}", self.target.region
        value = eks_capacity.quota_value(self.target, quota)
        if value is None:
            return CheckLine(name, UNVERIFIED, f"Service Quotas has no quota {quota.code} ({quota.name}) in "
                             f"{region}.", subject=family_subject(quota.family))
        running = eks_capacity.vcpus_running(groups, quota)
        needs = {str(d.pk): (d, need) for d, spec in demand
                 for need in eks_capacity.spec_needs(spec, capacity_type=self.target.config.capacity_type)
                 if need.quota == quota}
        in_use = sum(running.values())
        total = sum(max(need.vcpus, running.get(pk, 0)) for pk, (_, need) in needs.items()) + \
            sum(v for owner, v in running.items() if owner not in needs)
        sizes: dict[int, list[str]] = {}
        for t in eks_capacity.GPU_TYPES:
            if quota_family(t) == quota.family:
                sizes.setdefault(INSTANCE_TYPES[t].vcpus, []).append(t)
        room = max(value - in_use, 0)
        fits = ", ".join(f"{int(room // v)} × {_either(ts)} ({v} vCPUs each)" for v, ts in sorted(sizes.items()))
        evidence = (f"{quota.name} ({quota.code}) in {region}: {value:g} vCPUs; Tandem's node groups of the family "
                    f"run {in_use}; room for {fits}.")
        if needs:
            evidence += f" The deployments here need {total} in all: " + "; ".join(
                f"{self._asker(d)} {need.vcpus} ({', '.join(need.pools)})" for d, need in needs.values()) + "."
        if total > value:
            return CheckLine(name, FAIL, evidence, eks_capacity.quota_fix(quota=quota, wanted=total, region=region)
                             + " Then run the checks again.", subject=family_subject(quota.family))
        return CheckLine(name, PASS, evidence, subject=family_subject(quota.family))
