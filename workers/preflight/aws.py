"""The AWS side of the preflight (`eks` clusters): IAM's simulation of the driver's and the node role's rights, the
node subnets' Availability Zone, Tandem's EFA security group, and the node-group quota (EKS's, per cluster)."""
import json
from collections.abc import Callable

from botocore.exceptions import BotoCoreError, ClientError
from botocore.parsers import ResponseParserError

from deployments.serve_config import STAGES
from deployments.services.node_groups import NODEGROUPS_PER_CLUSTER
from workers import clients
from workers.preflight.lines import FAIL, PASS, UNVERIFIED, CheckLine, Unreadable
from workers.targets.eks import efa_security_group_name

# What the driver does in AWS (deploy/iam/eks-driver-policy.json grants exactly these, tests/workers/test_preflight.py
# compares), simulated with the context the policy's conditions read.
DRIVER_ACTIONS = ("eks:DescribeCluster", "eks:ListNodegroups", "eks:CreateNodegroup", "eks:TagResource",
                  "eks:DescribeNodegroup", "eks:UpdateNodegroupConfig", "eks:DeleteNodegroup", "iam:PassRole",
                  "ec2:DescribeSubnets", "ec2:DescribeSecurityGroups", "ec2:DescribeLaunchTemplates",
                  "ec2:DescribeLaunchTemplateVersions", "ec2:DescribeCapacityReservations",
                  "ec2:CreateLaunchTemplate", "ec2:DeleteLaunchTemplate", "ec2:CreatePlacementGroup",
                  "ec2:DeletePlacementGroup", "ec2:CreateSecurityGroup", "ec2:DeleteSecurityGroup",
                  "ec2:AuthorizeSecurityGroupIngress", "ec2:AuthorizeSecurityGroupEgress", "ec2:CreateTags",
                  "ec2:RunInstances", "iam:SimulatePrincipalPolicy", "ecr:DescribeImages")
DRIVER_CONTEXT = (("aws:RequestTag/tandem.dev/managed-by", "tandem"),
                  ("aws:ResourceTag/tandem.dev/managed-by", "tandem"),
                  ("iam:PassedToService", "eks.amazonaws.com"),
                  ("ec2:CreateAction", "CreateLaunchTemplate"))
# What a GPU node needs: join the cluster (AmazonEKSWorkerNodePolicy), pull images (ECR read), its pods' IPs (CNI).
NODE_ACTIONS = ("ec2:DescribeInstances", "eks:DescribeCluster", "ecr:GetAuthorizationToken", "ecr:BatchGetImage",
                "ecr:GetDownloadUrlForLayer", "ec2:AssignPrivateIpAddresses")


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

    def _simulate(self, name: str, principal: str, actions: tuple[str, ...], context=(), resources=None) -> CheckLine:
        iam = self._aws_client("iam", attempts=1)
        kwargs = {"PolicySourceArn": principal, "ActionNames": list(actions)}
        if context:
            kwargs["ContextEntries"] = [{"ContextKeyName": k, "ContextKeyValues": [v], "ContextKeyType": "string"}
                                        for k, v in context]
        if resources:
            kwargs["ResourceArns"] = resources
        try:
            results = iam.simulate_principal_policy(**kwargs)["EvaluationResults"]
        except (ClientError, BotoCoreError, ResponseParserError) as e:
            reason = str(e).splitlines()[0][:200]
            return CheckLine(name, UNVERIFIED, f"IAM could not simulate {principal}'s policies "
                             f"(iam:SimulatePrincipalPolicy): {type(e).__name__}: {reason}",
                             "Allow the worker's role iam:SimulatePrincipalPolicy on itself and on the node role "
                             "(deploy/iam/eks-driver-policy.json), then run the checks again.")
        denied = sorted({r["EvalActionName"] for r in results if r.get("EvalDecision") != "allowed"})
        if denied:
            return CheckLine(name, FAIL, f"{principal} is not allowed {', '.join(denied)}.",
                             "Attach the policy docs/install.md names for this role.")
        return CheckLine(name, PASS, f"{principal} is allowed {', '.join(actions)}.")

    def driver_iam(self) -> CheckLine:
        caller = self._aws("reading the worker's identity (sts:GetCallerIdentity)",
                           self._aws_client("sts").get_caller_identity)["Arn"]
        principal = caller
        if ":assumed-role/" in caller:  # the session of a role: simulate the role
            account = caller.split(":")[4]
            principal = self.target.config.role_arn or \
                f"arn:aws:iam::{account}:role/{caller.split(':assumed-role/')[1].split('/')[0]}"
        return self._simulate("driver-iam", principal, DRIVER_ACTIONS, DRIVER_CONTEXT)

    def node_role_iam(self) -> CheckLine:
        role = self.target.config.node_role_arn
        if not role:
            return CheckLine("node-role-iam", FAIL, "The cluster has no node_role_arn: EKS refuses node groups "
                             "without a node role.", "Register the cluster with node_role_arn (docs/install.md, 2).")
        buckets = self._s3_sources()
        actions = NODE_ACTIONS + (("s3:GetObject", "s3:ListBucket") if buckets else ())
        line = self._simulate("node-role-iam", role, actions)
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
