"""The AWS side of the preflight (`eks` clusters): IAM's simulation of the driver's and the node role's rights, the
node subnets' Availability Zone, a security group EFA can use, and the node-group quota."""
import json
from collections.abc import Callable

from botocore.exceptions import BotoCoreError, ClientError
from botocore.parsers import ResponseParserError

from workers import clients
from workers.preflight.lines import FAIL, PASS, UNVERIFIED, CheckLine, Unreadable

NODEGROUP_QUOTA = 30  # EKS's default "managed node groups per cluster" (Service Quotas L-6D54EA21)
NODEGROUPS_PER_DEPLOYMENT = 2  # prefill and decode
# What the driver calls in AWS (deploy/iam/eks-driver-policy.json grants exactly these; tests/deploy/test_iam.py),
# simulated with the context the policy's conditions read.
DRIVER_ACTIONS = ("eks:DescribeCluster", "eks:ListNodegroups", "eks:CreateNodegroup", "eks:TagResource",
                  "eks:DescribeNodegroup", "eks:UpdateNodegroupConfig", "eks:DeleteNodegroup", "iam:PassRole",
                  "ec2:DescribeSubnets", "ec2:DescribeSecurityGroups", "iam:SimulatePrincipalPolicy")
DRIVER_CONTEXT = (("aws:RequestTag/tandem.dev/managed-by", "tandem"),
                  ("aws:ResourceTag/tandem.dev/managed-by", "tandem"),
                  ("iam:PassedToService", "eks.amazonaws.com"))
# What a GPU node needs: join the cluster (AmazonEKSWorkerNodePolicy), pull images (ECR read), its pods' IPs (CNI).
NODE_ACTIONS = ("ec2:DescribeInstances", "eks:DescribeCluster", "ecr:GetAuthorizationToken", "ecr:BatchGetImage",
                "ecr:GetDownloadUrlForLayer", "ec2:AssignPrivateIpAddresses")


class AwsChecks:
    """The checks that call AWS with the worker's identity; `self.target` is the cluster's EksTarget."""

    _session = None

    def _aws_client(self, service: str, *, attempts: int | None = None):
        if self._session is None:
            self._session = clients.aws_session(region=self.cluster.config["region"])
        return clients.aws_client(self._session, service, endpoint_url=self.cluster.config.get("aws_endpoint_url"),
                                  attempts=attempts)

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
            principal = self.cluster.config.get("role_arn") or \
                f"arn:aws:iam::{account}:role/{caller.split(':assumed-role/')[1].split('/')[0]}"
        return self._simulate("driver-iam", principal, DRIVER_ACTIONS, DRIVER_CONTEXT)

    def node_role_iam(self) -> CheckLine:
        role = self.cluster.config.get("node_role_arn")
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
        sources = self.cluster.config.get("model_sources") or {}
        uris = list(sources.get("s3") or []) + [u for t in (sources.get("teams") or {}).values()
                                                  for u in t.get("s3") or []]
        return sorted(set(uris))

    def subnets(self) -> CheckLine:
        ids = list(self.cluster.config.get("subnet_ids") or [])
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
        info = self.target._active_cluster()
        vpc = info.get("resourcesVpcConfig") or {}
        ids = [g for g in [vpc.get("clusterSecurityGroupId"), *(vpc.get("securityGroupIds") or [])] if g]
        if not ids:
            return CheckLine("efa-security-group", FAIL, "The EKS cluster names no security group.",
                             "Give the cluster a security group that lets its members reach each other.")
        groups = self._aws("describing the cluster's security groups (ec2:DescribeSecurityGroups)",
                           self._aws_client("ec2").describe_security_groups, GroupIds=ids)["SecurityGroups"]

        def self_all(rules: list[dict], group: str) -> bool:
            return any(r.get("IpProtocol") == "-1" and any(p.get("GroupId") == group
                                                          for p in r.get("UserIdGroupPairs") or [])
                       for r in rules)

        good = [g["GroupId"] for g in groups if self_all(g.get("IpPermissions") or [], g["GroupId"])
                and self_all(g.get("IpPermissionsEgress") or [], g["GroupId"])]
        if good:
            return CheckLine("efa-security-group", PASS, f"{good[0]} lets all traffic in from and out to itself.")
        sg = ids[0]
        return CheckLine("efa-security-group", FAIL, f"None of {', '.join(ids)} allows all traffic in from and out "
                         "to itself: EFA traffic between the nodes is dropped.",
                         f"aws ec2 authorize-security-group-ingress --group-id {sg} --protocol -1 --source-group {sg}; "
                         f"aws ec2 authorize-security-group-egress --group-id {sg} "
                         f"--ip-permissions 'IpProtocol=-1,UserIdGroupPairs=[{{GroupId={sg}}}]'")

    def nodegroup_quota(self) -> CheckLine:
        eks, names, token = self.target.eks, [], None
        while True:
            page = self._aws("listing node groups (eks:ListNodegroups)", eks.list_nodegroups,
                             clusterName=self.target.eks_name, **({"nextToken": token} if token else {}))
            names += page.get("nodegroups") or []
            token = page.get("nextToken")
            if not token:
                break
        left = NODEGROUP_QUOTA - len(names)
        evidence = f"{len(names)} of {NODEGROUP_QUOTA} node groups used: room for {max(left, 0) // 2} deployment(s)."
        if left < NODEGROUPS_PER_DEPLOYMENT:
            return CheckLine("nodegroup-quota", FAIL, evidence, "Delete unused node groups, or ask AWS for more "
                             "(Service Quotas: Amazon EKS, Managed node groups per cluster).")
        return CheckLine("nodegroup-quota", PASS, evidence)
