"""Tandem's placement rules (deployments.placement) and the stand-ins' (tests/support/ray_rules) against Ray's own code
in the runtime venv, for every GPU instance type of the catalog: the accelerator label Ray gives the node from its
GPU's name, and the bundles and strategy Ray Serve LLM asks for from the serve config Tandem renders.

One runtime-venv process answers every question (importing Ray Serve LLM and vLLM takes it most of a minute here)."""
import json
from pathlib import Path

import pytest

from deployments.catalog import GPU_PRODUCTS, INSTANCE_TYPES
from deployments.placement import accelerator_label, replica_ask
from deployments.serve_config import serve_config_build
from deployments.spec import spec_parse
from tests.factories import spec_input
from tests.support import ray_rules
from tests.support.ray_oracle import ask_ray

GPU_TYPES = [name for name, i in INSTANCE_TYPES.items() if i.gpus]
# NVML names beyond the catalog's, so the stand-ins' copy of Ray's rule is tried on its other branches too: another
# host's A100, an older datacenter card, the RTX line, a mixed-case consumer card, a vGPU profile.
OTHER_GPU_NAMES = ["NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-16GB", "NVIDIA RTX PRO 6000 Blackwell Server Edition",
                   "NVIDIA GeForce RTX 5090", "NVIDIA L4-12Q", "NVIDIA A100 80GB PCIe"]
LOCAL_CONFIG = Path(__file__).resolve().parents[2] / "local" / "pd_serve_config.json"


def _app_args(itype: str) -> dict:
    """The PD application's args Tandem renders for a RayService with both pools on `itype`: prefill spanning all
    of a node's GPUs, decode one GPU per replica."""
    gpus = INSTANCE_TYPES[itype].gpus
    spec = spec_parse(spec_input(prefill={"instance_type": itype, "gpus_per_node": gpus, "tensor_parallel_size": gpus},
                                 decode={"instance_type": itype, "gpus_per_node": gpus, "tensor_parallel_size": 1}),
                      target_kind="eks")
    return serve_config_build(app_name="llama", spec=spec, target_kind="eks")["applications"][0]["args"]


@pytest.fixture(scope="module")
def rendered() -> list[dict]:
    """Every GPU instance type's application, then the local CPU one (the config verified on the local PD stack)."""
    return [_app_args(itype) for itype in GPU_TYPES] + [json.loads(LOCAL_CONFIG.read_text())["applications"][0]["args"]]


@pytest.fixture(scope="module")
def ray(rendered) -> dict:
    return ask_ray({"gpu_names": [*GPU_PRODUCTS.values(), *OTHER_GPU_NAMES], "apps": rendered})


def _stages(rendered, ray):
    for args, answer in zip(rendered, ray["apps"], strict=True):
        for stage in ("prefill", "decode"):
            yield args[f"{stage}_config"], answer[stage]


def test_every_gpu_node_is_labelled_by_ray_as_tandems_bundles_ask(ray, rendered):
    for itype, args in zip(GPU_TYPES, rendered):
        instance = INSTANCE_TYPES[itype]
        assert ray["labels"][instance.gpu_product] == accelerator_label(instance), itype
        assert args["prefill_config"]["accelerator_type"] == accelerator_label(instance), itype


def test_ray_serve_llm_asks_each_replica_for_what_tandem_computes(ray, rendered):
    for stage_config, answer in _stages(rendered, ray):
        ask = replica_ask(stage_config)
        assert (list(ask.bundles), ask.strategy) == (answer["bundles"], answer["strategy"])
        assert ask.placement_group_bundles == answer["placement_group_bundles"]
        assert answer["placement_group_strategy"] == ask.strategy


def test_the_stand_ins_play_ray_as_ray_does(ray, rendered):
    for name, label in ray["labels"].items():
        assert ray_rules.accelerator_type(name) == label, name
    for stage_config, answer in _stages(rendered, ray):
        assert ray_rules.engine_bundles(stage_config) == (answer["bundles"], answer["strategy"])
        assert ray_rules.replica_bundles(stage_config) == (answer["placement_group_bundles"],
                                                           answer["placement_group_strategy"])


def test_the_stand_ins_say_what_serve_says_of_a_replica_no_node_takes():
    recorded = json.loads((LOCAL_CONFIG.parent / "examples" / "applications-unplaced-replica.json").read_text())
    deployment = recorded["applications"]["unplaced"]["deployments"]["Unplaced"]
    assert deployment["status"] == "UPDATING" and recorded["applications"]["unplaced"]["status"] == "DEPLOYING"
    assert deployment["message"] == ray_rules.pending_allocation_message(
        deployment="Unplaced", app="unplaced", replicas=1, required=[{"GPU": 1, "accelerator_type:A100-40G": 0.001}],
        available={"CPU": 2.0, "GPU": 8.0, "prefill_pool": 8.0, "accelerator_type:A100": 1.0})
