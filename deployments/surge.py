"""How replicas map onto a pool's nodes, and what a side-by-side rollout's surge adds: the one rule that node
groups, worker groups, quota and cost read.

A replica spans `tensor_parallel_size` GPUs of one node, so a node holds `gpus_per_node // tensor_parallel_size`
replicas. During a side-by-side rollout (deployments.models.Rollout) a pool runs at most its spec's replicas
(`replicas_min`: the rollout fixes them there) plus `rollout.max_surge` more; its nodes grow only as far as those
replicas need, never below the spec's own (which hold `replicas_max`). Quota counts the surge as the nodes it adds
where Tandem provisions whole nodes (deployments.quota_rules.WHOLE_NODE_KINDS), else as the surge replicas' GPUs;
cost counts the nodes it adds. Both count it for as long as the rollout is in progress, as the rollout holds its
node pools (workers.rollout).
"""
from dataclasses import dataclass

from deployments.quota_rules import WHOLE_NODE_KINDS, node_quota_gpus
from deployments.spec import STAGES, DeploymentSpec, PoolSpec


def replicas_per_node(pool: PoolSpec) -> int:
    """Replicas one node of the pool holds (one on the CPU runtime, whose pools have no GPUs)."""
    return max(pool.gpus_per_node // pool.tensor_parallel_size, 1)


def nodes_for_replicas(pool: PoolSpec, replicas: int) -> int:
    """Nodes that `replicas` replicas of the pool need."""
    return -(-max(replicas, 0) // replicas_per_node(pool))


def pool_nodes(pool: PoolSpec, extra: int = 0) -> int:
    """Nodes the pool is provisioned with while it holds `extra` replicas beyond the spec's (its replicas_min, what
    a generation runs while a rollout fixes its replicas: workers.rollout_plan.wanted_replicas): the spec's nodes,
    or as many as those replicas need, whichever is more."""
    return max(pool.nodes, nodes_for_replicas(pool, pool.replicas_min + extra)) if extra > 0 else pool.nodes


@dataclass(frozen=True)
class Surge:
    """What a side-by-side rollout of `spec` holds beyond the spec, per pool: nodes added and GPUs counted."""

    nodes: dict[str, int]
    gpus: dict[str, int]

    @property
    def total_gpus(self) -> int:
        return sum(self.gpus.values())


def rollout_surge(spec: DeploymentSpec, *, target_kind: str) -> Surge:
    """The surge of a side-by-side rollout to `spec` on this kind of cluster (max_surge replicas per pool)."""
    nodes, gpus = {}, {}
    for stage in STAGES:
        pool = spec.pool(stage)
        nodes[stage] = pool_nodes(pool, spec.rollout.max_surge) - pool.nodes
        if target_kind in WHOLE_NODE_KINDS:
            gpus[stage] = nodes[stage] * node_quota_gpus(instance_type=pool.instance_type,
                                                         gpus_per_node=pool.gpus_per_node, target_kind=target_kind)
        else:  # each surge replica's GPUs (none on the CPU runtime, whose pools have none)
            gpus[stage] = spec.rollout.max_surge * pool.tensor_parallel_size if pool.gpus_per_node else 0
    return Surge(nodes=nodes, gpus=gpus)
