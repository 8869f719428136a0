"""What a side-by-side rollout's surge adds: nodes per pool from replicas per node, and the GPUs quota counts."""
import pytest

from deployments.cost import ON_DEMAND, surge_hourly_usd
from deployments.spec import spec_parse
from deployments.surge import pool_nodes, rollout_surge
from tests.factories import local_spec_input, spec_input


def _spec(itype, *, gpus, tp, nodes, replicas_min, replicas_max=None, max_surge=1):
    pool = {"instance_type": itype, "nodes": nodes, "gpus_per_node": gpus, "tensor_parallel_size": tp,
            "replicas_min": replicas_min, "replicas_max": replicas_max or replicas_min}
    return spec_parse(spec_input(prefill=pool, decode=pool, rollout={"max_surge": max_surge}),
                      target_kind="kubernetes")


@pytest.mark.parametrize(("spec", "nodes", "eks_gpus", "ray_gpus"), [
    # One replica per node: the surge replica needs a node of its own.
    (_spec("g6e.xlarge", gpus=1, tp=1, nodes=4, replicas_min=4), 1, 1, 1),
    # Two replicas per p5 node (8 GPUs, tensor parallel 4): five replicas need three nodes, one more than two.
    (_spec("p5.48xlarge", gpus=8, tp=4, nodes=2, replicas_min=4), 1, 8, 4),
    # Two surge replicas still fit that one extra node.
    (_spec("p5.48xlarge", gpus=8, tp=4, nodes=2, replicas_min=4, max_surge=2), 1, 8, 8),
    # Nodes the spec holds for autoscaling above replicas_min take the surge: nothing is added.
    (_spec("p5.48xlarge", gpus=8, tp=8, nodes=3, replicas_min=2, replicas_max=3), 0, 0, 8),
])
def test_the_surge_adds_the_nodes_its_replicas_need_and_quota_counts_them(spec, nodes, eks_gpus, ray_gpus):
    for kind in ("eks", "kubernetes"):
        surge = rollout_surge(spec, target_kind=kind)
        assert surge.nodes == {"prefill": nodes, "decode": nodes}
        assert surge.gpus == {"prefill": eks_gpus, "decode": eks_gpus} and surge.total_gpus == 2 * eks_gpus
    # On a Ray cluster Tandem provisions no nodes: the surge replicas' own GPUs count.
    assert rollout_surge(spec, target_kind="ray").gpus == {"prefill": ray_gpus, "decode": ray_gpus}
    price = ON_DEMAND.node_hour_usd(spec.prefill.instance_type)
    assert surge_hourly_usd(spec, rollout_surge(spec, target_kind="eks"), prices=ON_DEMAND) == \
        pytest.approx(2 * nodes * price)


def test_a_pool_without_extra_replicas_keeps_the_spec_s_nodes():
    spec = _spec("p5.48xlarge", gpus=8, tp=4, nodes=2, replicas_min=4)
    assert pool_nodes(spec.prefill) == pool_nodes(spec.prefill, 0) == 2
    assert pool_nodes(spec.prefill, 1) == pool_nodes(spec.prefill, 2) == 3
    assert pool_nodes(spec.prefill, 3) == 4


def test_a_cpu_deployment_s_surge_holds_no_gpu_of_its_team():
    """The local target's CPU pools have no GPUs: its rollouts fit a team with a quota of none (the rollout
    benchmark on the real stack was refused before this)."""
    spec = spec_parse(local_spec_input(), target_kind="ray")
    assert rollout_surge(spec, target_kind="ray").total_gpus == 0
