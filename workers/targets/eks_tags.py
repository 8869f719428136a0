"""Tandem's tags on what the eks driver makes in AWS (node groups, launch templates, placement groups, the EFA security
group): whose each one is. The driver's IAM policy (deploy/iam/) conditions its writes on them."""
TAG_MANAGED = "tandem.dev/managed-by"
TAG_DEPLOYMENT_ID = "tandem.dev/deployment-id"
TAG_TEAM, TAG_NAME = "tandem.dev/team", "tandem.dev/deployment"  # for people reading the console, and errors
TAG_POOL = "tandem.dev/pool"  # the stage: on a node group, its launch template and all they launch
# On a node group: its instance type, which DescribeNodegroup does not report where the launch template holds it
# (botocore: a node group's instanceTypes "is null" when deployed with a launch template's; a Capacity Block's is).
TAG_INSTANCE_TYPE = "tandem.dev/instance-type"
# On a launch template: the EFA security group it uses, or "none"; the group goes once no template uses it.
TAG_EFA_SECURITY_GROUP, NO_EFA = "tandem.dev/efa-security-group", "none"


def deployment_tags(deployment) -> dict[str, str]:
    """Whose a resource is: Tandem's, this deployment's (by id, which the IAM policy and ownership checks read), and
    its team's and name for people reading the console."""
    return {TAG_MANAGED: "tandem", TAG_DEPLOYMENT_ID: str(deployment.pk), TAG_TEAM: deployment.team.slug,
            TAG_NAME: deployment.name}


def pool_tags(deployment, stage: str) -> dict[str, str]:
    """What a pool's node group, launch template and placement group, and its instances, volumes and network
    interfaces, carry: who pays for them and which stage they serve."""
    return {**deployment_tags(deployment), TAG_POOL: stage}


def tag_spec(resource_type: str, tags: dict[str, str]) -> list[dict]:
    """EC2's TagSpecifications for one resource type."""
    return [{"ResourceType": resource_type, "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}]
