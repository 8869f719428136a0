"""Ray's placement rules before any GPU is bought: the bundles Tandem's serve config makes Ray Serve LLM ask for, on
the nodes Tandem's worker pods make, judged by the stand-ins' copy of Ray's rules (tests/support/ray_rules, checked
against Ray's own code in test_placement_ray.py) and refused at request time in the user's words."""
import pytest

from deployments.catalog import INSTANCE_TYPES
from deployments.manifests import manifests_build
from deployments.placement import node_resources, stage_problems
from deployments.serve_config import serve_config_build
from deployments.spec import SpecError, spec_parse
from deployments.yamlio import yaml_load
from tests.factories import RUNTIME_IMAGE, spec_input
from tests.support import ray_rules

GPU_TYPES = [name for name, i in INSTANCE_TYPES.items() if i.gpus]
# What main's serve config wrote for a p4d prefill pool of 8 GPUs: Ray's 40G type, which no node is labelled with.
MAIN_P4D_PREFILL = {"accelerator_type": "A100-40G",
                    "placement_group_config": {"bundles": [{"GPU": 1, "prefill_pool": 1}] * 8,
                                               "strategy": "STRICT_PACK"},
                    "deployment_config": {"autoscaling_config": {"min_replicas": 1, "max_replicas": 1}},
                    "engine_kwargs": {"tensor_parallel_size": 8}}


def _spec(itype: str, *, tp: int | None = None, kind: str = "eks"):
    gpus = INSTANCE_TYPES[itype].gpus
    pool = {"instance_type": itype, "gpus_per_node": gpus, "tensor_parallel_size": tp or gpus}
    return spec_parse(spec_input(prefill=pool, decode={**pool, "tensor_parallel_size": 1}), target_kind=kind)


def _rendered(spec):
    """What Tandem applies: the RayService's serve config (as KubeRay reads it) and its worker groups by stage."""
    rs = manifests_build(name="llama", namespace="tdm-team", team_slug="team", spec=spec, target_kind="eks",
                         image=RUNTIME_IMAGE)[-1]
    args = yaml_load(rs["spec"]["serveConfigV2"])["applications"][0]["args"]
    return args, {g["groupName"]: g for g in rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]}


@pytest.mark.parametrize("itype", GPU_TYPES)
def test_each_stages_replica_places_on_a_node_of_its_own_pool_and_only_there(itype):
    args, groups = _rendered(_spec(itype))
    product = INSTANCE_TYPES[itype].gpu_product
    nodes = {stage: ray_rules.pod_resources(groups[stage], gpu_name=product) for stage in ("prefill", "decode")}
    for stage, other in (("prefill", "decode"), ("decode", "prefill")):
        bundles, strategy = ray_rules.replica_bundles(args[f"{stage}_config"])
        assert ray_rules.place(bundles, strategy, [nodes[stage]]) is not None, (itype, stage, bundles, nodes[stage])
        assert ray_rules.place(bundles, strategy, [nodes[other]]) is None, (itype, stage)


@pytest.mark.parametrize("itype", GPU_TYPES)
def test_tandem_knows_what_its_worker_pods_give_ray(itype):
    spec = _spec(itype)
    _, groups = _rendered(spec)
    for stage in ("prefill", "decode"):
        pod = ray_rules.pod_resources(groups[stage], gpu_name=INSTANCE_TYPES[itype].gpu_product)
        assert node_resources(stage=stage, instance=INSTANCE_TYPES[itype],
                              gpus_per_node=spec.pool(stage).gpus_per_node) == pod


def test_a_p4d_node_takes_the_bundles_tandem_asks_for_and_not_mains():
    args, groups = _rendered(_spec("p4d.24xlarge"))
    node = ray_rules.pod_resources(groups["prefill"], gpu_name="NVIDIA A100-SXM4-40GB")
    assert args["prefill_config"]["accelerator_type"] == "A100"
    assert node["accelerator_type:A100"] == 1 and "accelerator_type:A100-40G" not in node
    assert ray_rules.place(*ray_rules.replica_bundles(MAIN_P4D_PREFILL), [node]) is None


def test_bundles_no_node_takes_are_refused_with_the_bundle_and_the_node_side_by_side():
    problems = stage_problems(stage="prefill", instance=INSTANCE_TYPES["p4d.24xlarge"], gpus_per_node=8,
                              stage_config=MAIN_P4D_PREFILL)
    assert problems == [
        "Ray Serve LLM asks each prefill replica for 8 bundles of {GPU: 1, prefill_pool: 1, "
        "accelerator_type:A100-40G: 0.001}, the first with the replica's own CPU: 1, on one node (STRICT_PACK); "
        "a p4d.24xlarge node of this pool advertises {GPU: 8, prefill_pool: 8, accelerator_type:A100: 1, CPU: 94, "
        "memory: 1036Gi}: it has no accelerator_type:A100-40G."]
    fewer = stage_problems(stage="prefill", instance=INSTANCE_TYPES["p4d.24xlarge"], gpus_per_node=4,
                           stage_config={**MAIN_P4D_PREFILL, "accelerator_type": "A100"})
    assert fewer[0].endswith(": it has 4 GPU and the replica needs 8; it has 4 prefill_pool and the replica needs 8.")


@pytest.mark.parametrize("kind", ["eks", "kubernetes", "ray", None])
def test_every_gpu_instance_type_of_the_catalog_passes_ray_s_rules_on_every_target(kind):
    for itype in GPU_TYPES:
        try:
            _spec(itype, kind=kind)
        except SpecError as e:
            pytest.fail(f"{itype} on {kind}: {e}")
