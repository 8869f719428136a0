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
