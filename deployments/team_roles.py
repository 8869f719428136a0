"""Per-team AWS identities of Ray pods on an `eks` cluster: the role each team's pods assume (IRSA), and the IAM
policy that role needs to read that team's model weights from S3 and nothing else.

The cluster's config names the roles: `"team_roles": {"<team slug>": "arn:aws:iam::<account>:role/<name>"}`. The
kubernetes driver annotates the team's Ray service account with `eks.amazonaws.com/role-arn` set to it; a team
without an entry gets no AWS identity (its pods can read no S3 weights). `manage.py tandem_team_policy` prints the
policy for a platform admin to attach to that role.
"""
from deployments.cluster_config import EksConfig, KubernetesConfig
from deployments.model_sources import s3_parts, source_roots_for

IRSA_ANNOTATION = "eks.amazonaws.com/role-arn"


def team_role_arn(config: EksConfig | KubernetesConfig, team_slug: str) -> str | None:
    """The IAM role a team's Ray pods assume on this cluster, or None."""
    return config.team_roles.get(team_slug)


def team_weights_policy(config: EksConfig, team_slug: str) -> dict:
    """Read access to exactly the S3 roots the team may load weights from on this cluster (`model_sources`: the
    cluster-wide ones and the team's own): GetObject under each root's prefix, ListBucket limited to it."""
    reads, lists = [], {}
    for root in source_roots_for(config.model_sources, team_slug).s3:
        parts = s3_parts(root)
        if parts is None:
            continue
        bucket, segments = parts
        prefix = "/".join(segments)
        reads.append(f"arn:aws:s3:::{bucket}/{prefix}/*" if prefix else f"arn:aws:s3:::{bucket}/*")
        lists.setdefault(bucket, []).extend([prefix, f"{prefix}/*"] if prefix else ["*"])
    statements = []
    if reads:
        statements.append({"Sid": "ReadTheTeamsWeights", "Effect": "Allow", "Action": ["s3:GetObject"],
                           "Resource": reads})
    for bucket, prefixes in lists.items():
        statement = {"Sid": f"ListTheTeamsWeights{len(statements)}", "Effect": "Allow", "Action": ["s3:ListBucket"],
                     "Resource": f"arn:aws:s3:::{bucket}"}
        if "*" not in prefixes:
            statement["Condition"] = {"StringLike": {"s3:prefix": prefixes}}
        statements.append(statement)
    return {"Version": "2012-10-17", "Statement": statements}
