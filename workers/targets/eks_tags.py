"""Tandem's tags on what the eks driver makes in AWS (node groups, launch templates, placement groups, the EFA security
group): whose each one is. The driver's IAM policy (deploy/iam/) conditions its writes on them."""
TAG_MANAGED = "tandem.dev/managed-by"
TAG_DEPLOYMENT_ID = "tandem.dev/deployment-id"
TAG_TEAM, TAG_NAME = "tandem.dev/team", "tandem.dev/deployment"  # for people reading the console, and errors
