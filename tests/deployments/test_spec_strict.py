"""A spec from a person or a pipeline is read strictly: a key the spec does not have is refused with its path and,
where it is close to one, the key that was probably meant, so a typo is never a silent no-op. Rows already stored
still load as they are."""
import pytest

from deployments.spec import SpecError, spec_load, spec_parse
from tests.factories import spec_input

POOL = {"instance_type": "g6e.12xlarge", "nodes": 1, "gpus_per_node": 4, "tensor_parallel_size": 4}


@pytest.mark.parametrize("overrides,path,message", [
    ({"prefill": {**POOL, "replcas_max": 3}}, "prefill.replcas_max", "unknown field; did you mean replicas_max?"),
    ({"decode": {**POOL, "node": 2}}, "decode.node", "unknown field; did you mean nodes?"),
    ({"wake_on_request": True}, "wake_on_request", "unknown field; it belongs under spec.pause"),
    ({"instance_type": "p5.48xlarge"}, "instance_type",
     "unknown field; it belongs under spec.prefill or spec.decode"),
    ({"modle": {"id": "x"}}, "modle", "unknown field; did you mean model?"),
    ({"model": {"id": "llama-3-8b", "source": "s3://models/llama-3-8b", "revision": "main"}}, "model.revision",
     "unknown field"),
    ({"runtime": {"ray": "2.60.0", "vllm": "0.29.0", "vlm": "0.29.0"}}, "runtime.vlm",
     "unknown field; did you mean vllm?"),
    ({"engine": {"max_model_length": 4096}}, "engine.max_model_length", "unknown field; did you mean max_model_len?"),
    ({"expected_load": {"requests_per_sec": 3}}, "expected_load.requests_per_sec",
     "unknown field; did you mean requests_per_second?"),
    ({"pause": {"idle_minute": 30}}, "pause.idle_minute", "unknown field; did you mean idle_minutes?"),
    ({"targets": {"ttft_p95_ms": 500, "p95": True}}, "targets.p95", "unknown field"),
    ({"engine": {"idle_minutes": 30}}, "engine.idle_minutes", "unknown field; it belongs under spec.pause"),
    ({"max_surge": 2}, "max_surge", "unknown field; it belongs under spec.rollout"),
    ({"rollout": {"stpes": [10, 100]}}, "rollout.stpes", "unknown field; did you mean steps?"),
])
def test_an_unknown_key_at_any_level_is_refused_naming_its_path_and_what_was_meant(overrides, path, message):
    with pytest.raises(SpecError) as e:
        spec_parse(spec_input(**overrides))
    assert e.value.errors == {path: [message]}


def test_every_unknown_key_is_reported_not_only_the_first():
    spec = spec_input(prefill={**POOL, "replcas_max": 3}, wake_on_request=True)
    with pytest.raises(SpecError) as e:
        spec_parse(spec)
    assert set(e.value.errors) == {"prefill.replcas_max", "wake_on_request"}


@pytest.mark.parametrize("section", ["engine", "expected_load", "pause", "targets", "rollout"])
@pytest.mark.parametrize("value", [[], 0, "", False])
def test_a_section_that_is_not_an_object_is_refused_even_when_empty(section, value):
    """null means "the defaults"; an empty list, 0, "" or false is not an object and was read as one."""
    with pytest.raises(SpecError) as e:
        spec_parse(spec_input(**{section: value}))
    assert e.value.errors == {section: ["Must be an object."]}


@pytest.mark.parametrize("accelerator", ["", "tpu", 0, False])
def test_a_runtime_pair_with_an_accelerator_that_is_not_gpu_or_cpu_is_refused(accelerator):
    with pytest.raises(SpecError) as e:
        spec_parse(spec_input(runtime={"ray": "2.60.0", "vllm": "0.29.0", "accelerator": accelerator}))
    assert list(e.value.errors) == ["runtime.accelerator"]


def test_a_number_too_large_for_a_float_is_a_400_not_a_crash():
    with pytest.raises(SpecError) as e:
        spec_parse(spec_input(expected_load={"requests_per_second": 10**400}))
    assert list(e.value.errors) == ["expected_load.requests_per_second"]


def test_stored_specs_still_load_strictness_is_for_input():
    """What is stored was written by to_dict(): it reloads, and its request shape parses back to the same spec."""
    from deployments.spec import spec_request_shape

    spec = spec_parse(spec_input(pause={"idle_minutes": 30, "wake_on_request": True},
                                 targets={"ttft_p95_ms": 500}, rollout={"steps": [20, 100], "max_surge": 2}))
    assert spec_load(spec.to_dict()) == spec
    assert spec_parse(spec_request_shape(spec)) == spec


def test_a_value_with_a_trailing_newline_is_refused_wherever_a_pattern_checks_it():
    """Python's `$` also matches before a final newline: every pattern check matches the whole value, so a name,
    model id, source, secret reference or cluster setting pasted with its line break is refused, not stored."""
    from deployments.cluster_config import cluster_config_errors
    from deployments.model_sources import model_sources_errors
    from deployments.secret_refs import secret_ref_errors
    from deployments.spec import dns_label_errors

    with pytest.raises(SpecError) as refused:
        spec_parse(spec_input(model={"id": "llama-3-8b\n", "source": "s3://models/llama-3-8b\n"}))
    assert set(refused.value.errors) == {"model.id", "model.source"}
    assert dns_label_errors("chat\n") and not dns_label_errors("chat")
    assert secret_ref_errors("env:TANDEM_CLUSTER_RAY\n") and not secret_ref_errors("env:TANDEM_CLUSTER_RAY")
    region = "region: an AWS region such as us-west-2."
    assert region in cluster_config_errors("eks", {"region": "us-east-1\n"})
    assert region not in cluster_config_errors("eks", {"region": "us-east-1"})
    assert model_sources_errors({"huggingface": ["meta-llama\n"]})
    assert not model_sources_errors({"huggingface": ["meta-llama"]})


@pytest.mark.parametrize("runtime,paths", [
    ({"ray": "", "vllm": {}}, {"runtime.vllm"}),  # found by the contract test's fuzzing: a 500, not a 400
    ({"ray": ["2.60.0"], "vllm": "0.29.0"}, {"runtime.ray"}),
    ({"vllm": "0.29.0"}, {"runtime.ray"}),
])
def test_a_runtime_pair_that_is_not_two_versions_is_refused_naming_the_field(runtime, paths):
    with pytest.raises(SpecError) as refused:
        spec_parse(spec_input(runtime=runtime))
    assert set(refused.value.errors) >= paths
