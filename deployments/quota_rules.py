"""How many GPUs a spec counts against quota: what Tandem provisions, not what the engines use.

Where Tandem provisions whole nodes (EKS managed node groups, and Kubernetes pools pinned to an instance type by
node selector) each node's every GPU is taken, whatever `gpus_per_node` says: a p5.48xlarge asked for with
`gpus_per_node: 1` holds 8. On an existing Ray cluster Tandem provisions nothing and the engines hold
`nodes × gpus_per_node`. One rule for the quota check, the API and the plan shown on the request form.
"""
from deployments.catalog import INSTANCE_TYPES
from deployments.serve_config import STAGES
from deployments.spec import DeploymentSpec

WHOLE_NODE_KINDS = frozenset({"eks", "kubernetes"})
KIND_WORDS = {"eks": "an EKS cluster", "kubernetes": "a Kubernetes cluster", "ray": "an existing Ray cluster"}


def node_quota_gpus(*, instance_type, gpus_per_node, target_kind: str) -> int | None:
    """GPUs one node of a pool counts (None while the input is not readable, as on a half-typed form)."""
    if target_kind in WHOLE_NODE_KINDS and instance_type in INSTANCE_TYPES:
        return INSTANCE_TYPES[instance_type].gpus
    return gpus_per_node if isinstance(gpus_per_node, int) and not isinstance(gpus_per_node, bool) else None


def quota_gpus(spec: DeploymentSpec, *, target_kind: str) -> int:
    """GPUs the spec holds against its team's quota on this kind of cluster."""
    return pools_quota_gpus({s: (spec.pool(s).instance_type, spec.pool(s).nodes, spec.pool(s).gpus_per_node)
                             for s in STAGES}, target_kind=target_kind)


def pools_quota_gpus(pools: dict[str, tuple], *, target_kind: str) -> int:
    """The same count from each stage's (instance type, nodes, GPUs per node): what a grouped SQL query returns
    (deployments.services.quota), so a team's total needs no spec loaded per deployment."""
    return sum(nodes * node_quota_gpus(instance_type=instance_type, gpus_per_node=gpus_per_node,
                                       target_kind=target_kind)
               for instance_type, nodes, gpus_per_node in pools.values())


def quota_basis(pools: dict[str, tuple], *, target_kind: str) -> str:
    """The arithmetic in words, for the plan: `pools` maps a stage to (instance type, nodes, GPUs per node)."""
    whole = target_kind in WHOLE_NODE_KINDS
    terms, total, used = [], 0, 0
    for stage, (instance_type, nodes, gpus_per_node) in pools.items():
        per_node = node_quota_gpus(instance_type=instance_type, gpus_per_node=gpus_per_node,
                                   target_kind=target_kind)
        if not isinstance(nodes, int) or per_node is None:
            return ""
        terms.append(f"{stage} {nodes} × {instance_type} × {per_node} GPUs" if whole
                     else f"{stage} {nodes} × {per_node} GPUs per node")
        total += nodes * per_node
        used += nodes * (gpus_per_node if isinstance(gpus_per_node, int) else per_node)
    if whole:
        unused = f" (the engines use {used}; the rest of each node is held all the same)" if used < total else ""
        return (f"Quota counts what is provisioned: on {KIND_WORDS[target_kind]} Tandem provisions whole nodes, "
                f"so {' + '.join(terms)} = {total} GPUs{unused}.")
    return (f"Quota counts what is provisioned: on {KIND_WORDS.get(target_kind, 'this cluster')} Tandem provisions "
            "no nodes, "
            f"so {' + '.join(terms)} = {total} GPUs.")
