"""deploy/iam/eks-driver-policy.json against what the `eks` driver calls: every EKS operation it makes is allowed,
nothing else is, and what it may change is limited to Tandem's own node groups."""
import ast
import json
import re

from tests.deploy.render import ROOT

# Calls that need more than their own action: creating a node group with tags is also eks:TagResource on it, and
# naming its node role is iam:PassRole on that role.
IMPLIED = {"CreateNodegroup": {"eks:TagResource", "iam:PassRole"}}


def operations_the_driver_calls() -> set[str]:
    """EKS API operations used in workers/targets/eks.py (`self.eks.<operation>`, called or passed on)."""
    tree = ast.parse((ROOT / "workers" / "targets" / "eks.py").read_text())
    ops = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "eks" \
                and isinstance(node.value.value, ast.Name) and node.value.value.id == "self":
            ops.add("".join(part.capitalize() for part in node.attr.split("_")))
    return ops


def test_the_policy_allows_exactly_the_operations_the_eks_driver_makes():
    policy = json.loads((ROOT / "deploy" / "iam" / "eks-driver-policy.json").read_text())
    allowed = {a for s in policy["Statement"] if s["Effect"] == "Allow" for a in s["Action"]}
    ops = operations_the_driver_calls()
    assert ops == {"DescribeCluster", "DescribeNodegroup", "CreateNodegroup", "UpdateNodegroupConfig",
                   "DeleteNodegroup"}
    needed = {f"eks:{op}" for op in ops} | set().union(*(IMPLIED.get(op, set()) for op in ops))
    assert allowed == needed
    assert not [s for s in policy["Statement"] if "*" in "".join(s["Action"]) or s["Resource"] == "*"]


def test_changes_are_limited_to_tandems_node_groups_and_the_node_role():
    statements = json.loads((ROOT / "deploy" / "iam" / "eks-driver-policy.json").read_text())["Statement"]
    by_action = {a: s for s in statements for a in s["Action"]}
    for action in ("eks:UpdateNodegroupConfig", "eks:DeleteNodegroup"):
        assert by_action[action]["Condition"] == {"StringEquals": {"aws:ResourceTag/tandem.dev/managed-by": "tandem"}}
    assert by_action["eks:CreateNodegroup"]["Condition"] == \
        {"StringEquals": {"aws:RequestTag/tandem.dev/managed-by": "tandem"}}
    assert re.fullmatch(r"arn:aws:eks:\$\{AWS_REGION\}:\$\{AWS_ACCOUNT_ID\}:nodegroup/\$\{CLUSTER_NAME\}/tandem-\*/\*",
                        by_action["eks:DeleteNodegroup"]["Resource"])
    passrole = by_action["iam:PassRole"]
    assert passrole["Resource"] == "arn:aws:iam::${AWS_ACCOUNT_ID}:role/${NODE_ROLE_NAME}"
    assert passrole["Condition"] == {"StringEquals": {"iam:PassedToService": "eks.amazonaws.com"}}
