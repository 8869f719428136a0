"""Which changes to a running deployment need an approver again, and how quota counts what is provisioned."""
import pytest

from deployments.catalog import INSTANCE_TYPES
from deployments.cost import ON_DEMAND
from deployments.quota_rules import quota_basis, quota_gpus
from deployments.spec import spec_parse
from deployments.spec_diff import changes_needing_approval, proposal_summary, spec_changes
from tests.factories import local_spec_input, spec_input

POOL = {"instance_type": "g6e.12xlarge", "nodes": 2, "gpus_per_node": 4, "tensor_parallel_size": 2,
        "replicas_min": 2, "replicas_max": 4}


def spec(**over):
    """A running deployment's spec: 2 nodes × 4 GPUs per pool, 2 to 4 replicas of TP 2; `over` patches it by
    dotted path ("prefill.nodes": 3)."""
    data = spec_input(prefill=dict(POOL), decode=dict(POOL))
    for path, value in over.items():
        *parents, leaf = path.split(".")
        node = data
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return spec_parse(data, target_kind="eks")


# (what changes, the fields that need approval). Empty: applied at once.
TABLE = [
    ({}, []),
    # Free: replica bounds within the approved ones, engine tuning that leaves memory per GPU alone.
    ({"prefill.replicas_max": 3}, []),
    ({"decode.replicas_min": 3}, []),
    ({"prefill.replicas_min": 3, "prefill.replicas_max": 3}, []),
    ({"engine.max_model_len": 4096}, []),
    ({"engine.max_model_len": 16384}, []),
    # Replica bounds beyond the approved ones.
    ({"prefill.replicas_min": 1}, ["prefill.replicas_min"]),
    ({"decode.replicas_max": 5, "decode.nodes": 3}, ["decode.nodes", "decode.replicas_max"]),
    # What costs.
    ({"prefill.instance_type": "p5.48xlarge", "prefill.gpus_per_node": 4}, ["prefill.instance_type"]),
    ({"decode.nodes": 1, "decode.replicas_max": 2}, ["decode.nodes"]),
    ({"prefill.gpus_per_node": 2, "prefill.replicas_max": 4, "prefill.nodes": 4},
     ["prefill.nodes", "prefill.gpus_per_node"]),
    # What runs, or what the approver judged.
    ({"model.source": "s3://someone-else/weights"}, ["model_source"]),
    ({"model.id": "llama-3-70b"}, ["model_id"]),
    ({"prefill.tensor_parallel_size": 4, "prefill.replicas_min": 1, "prefill.replicas_max": 2},
     ["prefill.tensor_parallel_size", "prefill.replicas_min"]),
    ({"engine.dtype": "float16"}, ["engine.dtype"]),
    ({"engine.gpu_memory_utilization": 0.95}, ["engine.gpu_memory_utilization"]),
    ({"expected_load.requests_per_second": 50}, ["expected_load.requests_per_second"]),
]


@pytest.mark.parametrize("changes,needs", TABLE, ids=[",".join(c) or "nothing" for c, _ in TABLE])
def test_changes_needing_approval(changes, needs):
    assert changes_needing_approval(spec(), spec(**changes)) == needs


def test_another_runtime_needs_approval():
    old = spec_parse(spec_input(), target_kind="ray")
    new = spec_parse(local_spec_input(model={"id": old.model_id, "source": old.model_source}), target_kind="ray")
    assert changes_needing_approval(old, new)[:2] == ["runtime", "prefill.instance_type"]


def test_a_change_lists_every_field_old_to_new_with_cost_before_and_after():
    old, new = spec(), spec(**{"prefill.instance_type": "p5.48xlarge", "engine.max_model_len": 4096})
    summary = proposal_summary(old, new, prices=ON_DEMAND)
    by_field = {c["field"]: c for c in summary["changes"]}
    assert by_field["prefill.instance_type"] == {"field": "prefill.instance_type", "old": "g6e.12xlarge",
                                                 "new": "p5.48xlarge", "needs_approval": True}
    assert by_field["engine.max_model_len"]["needs_approval"] is False
    g6e, p5 = INSTANCE_TYPES["g6e.12xlarge"].hourly_usd, INSTANCE_TYPES["p5.48xlarge"].hourly_usd
    assert summary["hourly_usd_before"] == pytest.approx(4 * g6e, abs=1e-3)
    assert summary["hourly_usd_after"] == pytest.approx(2 * g6e + 2 * p5, abs=1e-3)
    assert [c.field for c in spec_changes(old, old)] == []


def one_gpu_of_p5(kind):
    pool = {"instance_type": "p5.48xlarge", "nodes": 1, "gpus_per_node": 1, "tensor_parallel_size": 1}
    return spec_parse(spec_input(prefill=dict(pool), decode=dict(pool)), target_kind=kind)


@pytest.mark.parametrize("kind,gpus", [("eks", 16), ("kubernetes", 16), ("ray", 2)])
def test_quota_counts_whole_nodes_where_tandem_provisions_them(kind, gpus):
    """`gpus_per_node: 1` on a p5.48xlarge provisions a whole 8-GPU node on EKS and Kubernetes."""
    assert quota_gpus(one_gpu_of_p5(kind), target_kind=kind) == gpus


def test_the_plan_says_how_quota_counts():
    pools = {"prefill": ("p5.48xlarge", 1, 1), "decode": ("p5.48xlarge", 1, 1)}
    assert quota_basis(pools, target_kind="eks") == (
        "Quota counts what is provisioned: on an EKS cluster Tandem provisions whole nodes, so prefill 1 × "
        "p5.48xlarge × 8 GPUs + decode 1 × p5.48xlarge × 8 GPUs = 16 GPUs (the engines use 2; the rest of each "
        "node is held all the same).")
    assert "provisions no nodes, so prefill 1 × 1 GPUs per node + decode 1 × 1 GPUs per node = 2 GPUs" in \
        quota_basis(pools, target_kind="ray")
