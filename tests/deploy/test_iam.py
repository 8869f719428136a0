"""deploy/iam/eks-driver-policy.json against what the `eks` driver calls: every EKS and EC2 operation it makes is
allowed, nothing else is, and what it may change is limited to Tandem's own (tagged) node groups, launch
templates, placement groups and security group."""
import ast
import json
import re

from tests.deploy.render import ROOT
from tests.support.iam_simulator import iam_decision as policy_decision

# Calls that need more than their own action: creating a node group with tags is also eks:TagResource on it, naming
# its node role is iam:PassRole on that role, and naming a launch template makes EKS check that the caller may read
# it (ec2:DescribeLaunchTemplateVersions; without it EKS answers "You are not authorized to describe the launch
# template version") and, where the template tags what it launches, launch and tag with it ("The IAM entity calling
# the CreateNodegroup ... APIs must have permissions for ec2:RunInstances and ec2:CreateTags", EKS user guide,
# "Customize managed nodes with launch templates", Tagging Amazon EC2 instances). EC2 creations with
# TagSpecifications are also ec2:CreateTags (tag on create).
IMPLIED = {"eks:CreateNodegroup": {"eks:TagResource", "iam:PassRole", "ec2:DescribeLaunchTemplateVersions",
                                   "ec2:RunInstances", "ec2:CreateTags"},
           "ec2:CreateLaunchTemplate": {"ec2:CreateTags"}, "ec2:CreatePlacementGroup": {"ec2:CreateTags"},
           "ec2:CreateSecurityGroup": {"ec2:CreateTags"}}
# What the preflight (workers/preflight/) needs beside the driver's calls: IAM's simulation of the driver's and the
# node role's rights and ECR's answer whether each registered runtime image exists (its other reads, ListNodegroups,
# the EC2 Describes and the vCPU quotas, are the driver's own).
PREFLIGHT = {"iam:SimulatePrincipalPolicy", "ecr:DescribeImages"}
# The driver's modules that call AWS, and the client attribute each service is reached through.
DRIVER_MODULES = ("eks.py", "eks_ec2.py", "eks_capacity.py")
CLIENTS = {"eks": "eks", "ec2": "ec2", "quotas": "servicequotas"}
TAGGED = {"StringEquals": {"aws:ResourceTag/tandem.dev/managed-by": "tandem"}}
TAGGING = {"StringEquals": {"aws:RequestTag/tandem.dev/managed-by": "tandem"}}


def _policy() -> list[dict]:
    return json.loads((ROOT / "deploy" / "iam" / "eks-driver-policy.json").read_text())["Statement"]


def _resources(statement) -> list[str]:
    r = statement["Resource"]
    return r if isinstance(r, list) else [r]


def operations_the_driver_calls() -> set[str]:
    """AWS operations used in the driver's modules (`self.eks.<operation>`, `target.quotas.<operation>`, called or
    passed on), as IAM actions."""
    ops = set()
    for module in DRIVER_MODULES:
        tree = ast.parse((ROOT / "workers" / "targets" / module).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) \
                    and node.value.attr in CLIENTS and isinstance(node.value.value, ast.Name) \
                    and node.value.value.id in ("self", "target"):
                ops.add(f"{CLIENTS[node.value.attr]}:" + "".join(part.capitalize() for part in node.attr.split("_")))
    return ops


def test_the_policy_allows_exactly_the_operations_the_eks_driver_makes():
    statements = _policy()
    allowed = {a for s in statements if s["Effect"] == "Allow" for a in s["Action"]}
    ops = operations_the_driver_calls()
    assert ops == {"eks:DescribeCluster", "eks:DescribeNodegroup", "eks:ListNodegroups", "eks:CreateNodegroup",
                   "eks:UpdateNodegroupConfig", "eks:DeleteNodegroup",
                   "ec2:DescribeSubnets", "ec2:DescribeSecurityGroups", "ec2:CreateSecurityGroup",
                   "ec2:DeleteSecurityGroup", "ec2:AuthorizeSecurityGroupIngress",
                   "ec2:AuthorizeSecurityGroupEgress", "ec2:CreatePlacementGroup", "ec2:DeletePlacementGroup",
                   "ec2:CreateLaunchTemplate", "ec2:DeleteLaunchTemplate", "ec2:DescribeLaunchTemplates",
                   "ec2:DescribeCapacityReservations", "ec2:DescribeInstanceTypeOfferings",
                   "servicequotas:GetServiceQuota"}
    assert allowed == ops | set().union(*(IMPLIED.get(op, set()) for op in ops)) | PREFLIGHT
    assert not [s for s in statements if "*" in "".join(s["Action"])]
    # EC2's Describe calls and Service Quotas' reads take no resource-level permissions: only they may name every
    # resource.
    assert {a for s in statements if "*" in _resources(s) for a in s["Action"]} == \
        {"ec2:DescribeSubnets", "ec2:DescribeSecurityGroups", "ec2:DescribeLaunchTemplates",
         "ec2:DescribeLaunchTemplateVersions", "ec2:DescribeCapacityReservations",
         "ec2:DescribeInstanceTypeOfferings", "servicequotas:GetServiceQuota"}


def test_changes_are_limited_to_tandems_node_groups_and_the_node_role():
    statements = _policy()
    by_action = {a: s for s in statements for a in s["Action"] if "vpc/" not in "".join(_resources(s))}
    for action in ("eks:UpdateNodegroupConfig", "eks:DeleteNodegroup"):
        assert by_action[action]["Condition"] == TAGGED
    assert by_action["eks:CreateNodegroup"]["Condition"] == TAGGING
    assert re.fullmatch(r"arn:aws:eks:\$\{AWS_REGION\}:\$\{AWS_ACCOUNT_ID\}:nodegroup/\$\{CLUSTER_NAME\}/tandem-\*/\*",
                        by_action["eks:DeleteNodegroup"]["Resource"])
    passrole = by_action["iam:PassRole"]
    assert passrole["Resource"] == "arn:aws:iam::${AWS_ACCOUNT_ID}:role/${NODE_ROLE_NAME}"
    assert passrole["Condition"] == {"StringEquals": {"iam:PassedToService": "eks.amazonaws.com"}}


LAUNCHED = r"arn:aws:ec2:\$\{AWS_REGION\}:\$\{AWS_ACCOUNT_ID\}:(instance|volume|network-interface)/\*"


def test_ec2_writes_carry_the_same_tag_conditions_as_the_node_groups():
    statements = _policy()
    for statement in statements:
        writes = [a for a in statement["Action"] if a.startswith("ec2:") and not a.startswith("ec2:Describe")]
        if not writes or writes == ["ec2:RunInstances"]:  # EKS's launch check: evaluated below
            continue
        resources = _resources(statement)
        if all(re.fullmatch(LAUNCHED, r) for r in resources):
            # what the node groups launch, tagged from their launch template, and at launch only
            assert writes == ["ec2:CreateTags"] and statement["Condition"] == {"StringEquals": {
                "aws:RequestTag/tandem.dev/managed-by": "tandem", "ec2:CreateAction": "RunInstances"}}
            continue
        if resources == ["arn:aws:ec2:${AWS_REGION}:${AWS_ACCOUNT_ID}:vpc/${VPC_ID}"]:
            # A security group is created in the cluster's VPC, which carries no Tandem tag: only that VPC.
            assert statement["Action"] == ["ec2:CreateSecurityGroup"] and "Condition" not in statement
            continue
        assert all(re.fullmatch(r"arn:aws:ec2:\$\{AWS_REGION\}:\$\{AWS_ACCOUNT_ID\}:"
                                r"(launch-template/\*|placement-group/tandem-\*|security-group/\*)", r)
                   for r in resources), resources
        condition = statement["Condition"]["StringEquals"]
        if any(a.startswith(("ec2:Create")) for a in writes):
            assert condition["aws:RequestTag/tandem.dev/managed-by"] == "tandem"
            if writes == ["ec2:CreateTags"]:  # tags only as part of Tandem's own creations
                assert sorted(condition["ec2:CreateAction"]) == ["CreateLaunchTemplate", "CreatePlacementGroup",
                                                                 "CreateSecurityGroup"]
        else:
            assert statement["Condition"] == TAGGED


# --- the policy evaluated as IAM evaluates a request: an explicit Deny wins, then any Allow, else it is denied ----
SUBSTITUTIONS = {"${AWS_REGION}": "us-east-1", "${AWS_ACCOUNT_ID}": "111122223333", "${CLUSTER_NAME}": "prod",
                 "${NODE_ROLE_NAME}": "tandem-node", "${VPC_ID}": "vpc-0abc"}
CLUSTER_ARN = "arn:aws:eks:us-east-1:111122223333:cluster/prod"
OURS = {"tandem.dev/managed-by": "tandem", "tandem.dev/deployment-id": "7", "tandem.dev/team": "ml-research",
        "tandem.dev/deployment": "llama"}


def _nodegroup(name: str) -> str:
    return f"arn:aws:eks:us-east-1:111122223333:nodegroup/prod/{name}/4ec8a6e2-0a1b-4c2d-9e3f-1234567890ab"


def iam_decision(action: str, resource: str, context: dict) -> str:
    """"Allow", "ExplicitDeny" or "ImplicitDeny" for one request under the driver policy alone."""
    return policy_decision(json.loads(_substituted()), action, resource, context)


def _substituted() -> str:
    text = json.dumps(_policy())
    for placeholder, value in SUBSTITUTIONS.items():
        text = text.replace(placeholder, value)
    return text


def _request_tags(tags: dict) -> dict:
    return {**{f"aws:RequestTag/{k}": v for k, v in tags.items()}, "aws:TagKeys": list(tags)}


def _resource_tags(tags: dict) -> dict:
    return {f"aws:ResourceTag/{k}": v for k, v in tags.items()}


def test_the_driver_creates_its_node_groups_with_their_tags_then_resizes_and_deletes_them():
    assert iam_decision("eks:CreateNodegroup", CLUSTER_ARN, _request_tags(OURS)) == "Allow"
    # tag on create: the node group does not exist yet, so it has no tags of its own
    assert iam_decision("eks:TagResource", _nodegroup("tandem-d7-prefill"), _request_tags(OURS)) == "Allow"
    for action in ("eks:UpdateNodegroupConfig", "eks:DeleteNodegroup"):
        assert iam_decision(action, _nodegroup("tandem-d7-prefill"), _resource_tags(OURS)) == "Allow"


def test_a_tandem_node_groups_ownership_tags_cannot_be_rewritten_or_removed():
    """With the worker's credentials, point deployment 8's node group at deployment 7 (whose deletion then takes
    it), or strip Tandem's mark from it: refused, whatever else the role is given (an explicit Deny)."""
    theirs = {**OURS, "tandem.dev/deployment-id": "8"}
    rewrite = {**_resource_tags(theirs), **_request_tags({"tandem.dev/managed-by": "tandem",
                                                          "tandem.dev/deployment-id": "7"})}
    assert iam_decision("eks:TagResource", _nodegroup("tandem-d8-decode"), rewrite) == "ExplicitDeny"
    for key in ("tandem.dev/deployment-id", "tandem.dev/managed-by"):
        assert iam_decision("eks:UntagResource", _nodegroup("tandem-d8-decode"),
                            {**_resource_tags(theirs), "aws:TagKeys": [key]}) == "ExplicitDeny"


def test_a_node_group_outside_tandems_names_or_with_another_owner_cannot_be_claimed():
    """Add managed-by=tandem to someone else's node group, to resize or delete it next: refused when it is not
    named as Tandem names its node groups, and when it carries Tandem's mark for another cluster's Tandem or an
    earlier owner. (One named tandem-* that carries no Tandem tag cannot be told from a node group being created:
    deploy/iam/README.md says what guards it.)"""
    claim = _request_tags({"tandem.dev/managed-by": "tandem", "tandem.dev/deployment-id": "7"})
    assert iam_decision("eks:TagResource", _nodegroup("search-gpu"), claim) == "ImplicitDeny"
    marked = {**_resource_tags({"tandem.dev/managed-by": "tandem"}), **claim}
    assert iam_decision("eks:TagResource", _nodegroup("tandem-legacy"), marked) == "ExplicitDeny"
    assert iam_decision("eks:UpdateNodegroupConfig", _nodegroup("search-gpu"), _resource_tags(OURS)) == \
        "ImplicitDeny"


def _ec2(kind: str, name: str = "x") -> str:
    return f"arn:aws:ec2:us-east-1:111122223333:{kind}/{name}"


def test_eks_may_launch_only_tandem_tagged_nodes_from_tandem_launch_templates():
    """EKS checks that whoever creates a node group whose template tags what it launches may run instances and tag
    them: the driver may, for instances, volumes and network interfaces tagged as Tandem's, from Tandem's launch
    templates, and may tag nothing else of that kind, nor anything after its launch."""
    ours = {**_request_tags(OURS)}
    for kind in ("instance", "volume", "network-interface"):
        assert iam_decision("ec2:RunInstances", _ec2(kind), ours) == "Allow"
        assert iam_decision("ec2:RunInstances", _ec2(kind), _request_tags({"team": "x"})) == "ImplicitDeny"
        assert iam_decision("ec2:CreateTags", _ec2(kind), {**ours, "ec2:CreateAction": "RunInstances"}) == "Allow"
        assert iam_decision("ec2:CreateTags", _ec2(kind), ours) == "ImplicitDeny"  # someone's running instance
    assert iam_decision("ec2:RunInstances", _ec2("launch-template", "lt-1"), _resource_tags(OURS)) == "Allow"
    assert iam_decision("ec2:RunInstances", _ec2("launch-template", "lt-2"), {}) == "ImplicitDeny"
    for kind in ("subnet", "security-group", "placement-group", "capacity-reservation"):
        assert iam_decision("ec2:RunInstances", _ec2(kind), {}) == "Allow"
    assert iam_decision("ec2:RunInstances", "arn:aws:ec2:us-east-1::image/ami-1", {}) == "Allow"
    assert iam_decision("ec2:TerminateInstances", _ec2("instance"), _resource_tags(OURS)) == "ImplicitDeny"
