"""The spec in the contract: /api/schema/ describes it completely (generated from the dataclasses, so the two
cannot drift), and every write refuses a key the spec does not have, naming its path."""
from dataclasses import fields

import jsonschema
import pytest

from deployments.lifecycle import Status
from deployments.spec import DeploymentSpec, SpecError, request_fields, request_section, spec_parse
from deployments.spec_diff import FREE_FIELDS
from tests.factories import DeploymentFactory, local_spec_input, spec_input

pytestmark = pytest.mark.django_db
POOL = {"instance_type": "g6e.12xlarge", "nodes": 1, "gpus_per_node": 4, "tensor_parallel_size": 4}
TYPO = {"spec.prefill.replcas_max": ["unknown field; did you mean replicas_max?"]}
MISPLACED = {"spec.wake_on_request": ["unknown field; it belongs under spec.pause"]}


def _json_schema(node):
    """OpenAPI 3.0's dialect as JSON Schema: `nullable: true` becomes "or null"."""
    if isinstance(node, list):
        return [_json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    node = {k: _json_schema(v) for k, v in node.items()}
    if node.pop("nullable", False):
        return {"anyOf": [{"type": "null"}, node]}
    return node


@pytest.fixture
def served(api, member):
    """The spec's schema as /api/schema/ serves it: where POST /api/v1/deployments/ takes `spec`, with the
    document's components to resolve its references."""
    api.force_authenticate(member)
    document = api.get("/api/schema/?format=json").json()
    body = document["paths"]["/api/v1/deployments/"]["post"]["requestBody"]["content"]["application/json"]
    create = document["components"]["schemas"][body["schema"]["$ref"].rsplit("/", 1)[1]]
    return _json_schema({**create["properties"]["spec"], "components": document["components"]})


VALID = [
    spec_input(),
    local_spec_input(),
    spec_input(runtime="ray-2.60.0-vllm-0.29.0", pause={"idle_minutes": 30, "wake_on_request": True},
               targets={"ttft_p95_ms": 500, "itl_p95_ms": None, "share": 0.9},
               engine={"max_model_len": 4096, "dtype": "float16", "gpu_memory_utilization": 0.85,
                       "kv_connector": "NixlConnector", "kv_transport": "tcp"},
               decode={**POOL, "replicas_min": 1, "replicas_max": 1}),
    spec_input(runtime={"ray": "2.60.0", "vllm": "0.29.0", "accelerator": "gpu"}, engine=None, targets=None),
    spec_input(rollout={"steps": [5, 25, 100], "max_surge": 2, "step_seconds": 30, "max_ttft_ratio": 1.2}),
    spec_input(rollout=None),
]


@pytest.mark.parametrize("spec", VALID)
def test_the_served_schema_accepts_the_specs_the_api_accepts(served, spec):
    spec_parse(spec)
    jsonschema.validate(spec, served)


@pytest.mark.parametrize("overrides,where", [
    ({"replcas": 3}, ""),
    ({"model": {"id": "llama-3-8b", "source": "s3://models/llama-3-8b", "revision": "main"}}, "model"),
    ({"runtime": {"ray": "2.60.0", "vllm": "0.29.0", "vlm": "x"}}, "runtime"),
    ({"prefill": {**POOL, "replcas_max": 3}}, "prefill"),
    ({"decode": {**POOL, "node": 2}}, "decode"),
    ({"engine": {"max_model_length": 4096}}, "engine"),
    ({"expected_load": {"requests_per_sec": 3}}, "expected_load"),
    ({"pause": {"idle_minute": 30}}, "pause"),
    ({"targets": {"ttft_p95_ms": 500, "p95": True}}, "targets"),
])
def test_the_served_schema_refuses_an_unknown_key_at_every_level(served, overrides, where):
    with pytest.raises(jsonschema.ValidationError) as e:
        jsonschema.validate(spec_input(**overrides), served)
    assert "Additional properties are not allowed" in str(e.value)


@pytest.mark.parametrize("steps", [[0, 100], [10, 101], [], [*range(1, 11), 100], "10,100", [10.5, 100],
                                   [True, 100]])
def test_the_served_schema_refuses_rollout_steps_the_api_refuses(served, steps):
    """spec.rollout.steps is a list of whole percentages (1-100, at most 10): the schema says so of the list and of
    each item, so a generated client refuses what the server would."""
    with pytest.raises(SpecError):
        spec_parse(spec_input(rollout={"steps": steps}))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(spec_input(rollout={"steps": steps}), served)


def _leaves(cls=DeploymentSpec, prefix=""):
    """(dotted request path, dataclass, field, whether it is a section) of every field a request gives, walked
    from the dataclasses."""
    for key, entry in request_fields(cls).items():
        inner = request_section(cls, entry)
        if inner is not None:
            yield from _leaves(inner, f"{prefix}{key}.")
        if not isinstance(entry, type):  # `model` is no field: its fields are model.id and model.source
            yield f"{prefix}{key}", cls, entry, inner is not None and not entry.metadata["or_object"]


def _property(document: dict, path: str) -> dict:
    """The schema of a dotted path of the spec, its references (sections, enums) followed."""
    schemas = document["components"]["schemas"]

    def resolved(node: dict) -> dict:
        for branch in node.get("allOf", []):
            node = {**schemas[branch["$ref"].rsplit("/", 1)[1]], **{k: v for k, v in node.items() if k != "allOf"}}
        return node

    node = schemas["DeploymentSpec"]
    for key in path.split("."):
        node = node["properties"][key]
        if "oneOf" in node and key == "runtime" and path != "runtime":
            node = schemas[node["oneOf"][1]["$ref"].rsplit("/", 1)[1]]
        node = resolved(node)
    return node


def test_every_field_of_the_dataclasses_is_in_the_served_schema_with_what_a_client_needs(api, member):
    """So they cannot drift: each field of each spec dataclass is a property of the served schema, described,
    typed, and (a value, not a section) saying whether changing it needs approval."""
    api.force_authenticate(member)
    document = api.get("/api/schema/?format=json").json()
    leaves = list(_leaves())
    walked = {id(entry) for _, _, entry, _ in leaves}
    stored_as = {entry.metadata["stored"] for _, _, entry, _ in leaves}  # model.id is model_id, ...
    classes = {cls for _, cls, _, _ in leaves}
    assert {c.__name__ for c in classes} == {"DeploymentSpec", "ModelRef", "RuntimePair", "PoolSpec", "EngineSpec",
                                             "LoadSpec", "PauseSpec", "TargetsSpec", "RolloutSpec"}
    for cls in classes:
        for f in fields(cls):
            assert id(f) in walked or f.name in stored_as, f"{cls.__name__}.{f.name}"
    for path, _, _, section in leaves:
        node = _property(document, path)
        assert node["description"], path
        assert "type" in node or "oneOf" in node, path
        if not section:
            assert node["x-needs-approval"] in ("always", "never", "outside_approved_range"), path


def test_the_schema_says_which_changes_need_approval_as_updates_decide_it(api, member):
    api.force_authenticate(member)
    document = api.get("/api/schema/?format=json").json()
    assert _property(document, "prefill.nodes")["x-needs-approval"] == "always"
    assert _property(document, "decode.replicas_max")["x-needs-approval"] == "outside_approved_range"
    assert _property(document, "targets.share")["x-needs-approval"] == "never"
    assert _property(document, "model.id")["x-needs-approval"] == "always"
    for field in FREE_FIELDS:
        assert _property(document, field)["x-needs-approval"] == "never", field
    pool = _property(document, "prefill.nodes")
    assert (pool["type"], pool["minimum"], pool["maximum"], pool["default"]) == ("integer", 1, 64, 1)
    dtype = _property(document, "engine.dtype")
    assert (dtype["enum"], dtype["default"]) == (["auto", "bfloat16", "float16"], "bfloat16")


def _create(api, team, cluster, spec):
    return api.post("/api/v1/deployments/", {"team": team.slug, "cluster": cluster.name, "name": "chat",
                                             "spec": spec}, format="json")


@pytest.mark.parametrize("overrides,errors", [
    ({"prefill": {**POOL, "replcas_max": 3}}, TYPO), ({"wake_on_request": True}, MISPLACED)])
def test_create_and_its_preview_refuse_a_misspelled_or_misplaced_field_naming_it(api, member, team, cluster,
                                                                                 overrides, errors):
    api.force_authenticate(member)
    for path in ("/api/v1/deployments/preview/", "/api/v1/deployments/"):
        r = api.post(path, {"team": team.slug, "cluster": cluster.name, "name": "chat",
                            "spec": spec_input(**overrides)}, format="json")
        assert (r.status_code, r.json()["errors"]) == (400, errors), path


@pytest.mark.parametrize("status", [Status.PENDING_APPROVAL, Status.RUNNING])
def test_update_edit_and_their_previews_refuse_a_misspelled_field_naming_it(api, member, team, cluster, status):
    d = DeploymentFactory(team=team, cluster=cluster, requested_by=member, status=status)
    api.force_authenticate(member)
    body = {"spec": spec_input(prefill={**POOL, "replcas_max": 3})}
    for r in (api.post(f"/api/v1/deployments/{d.pk}/preview/", body, format="json"),
              api.patch(f"/api/v1/deployments/{d.pk}/", body, format="json")):
        assert (r.status_code, r.json()["errors"]) == (400, TYPO)
    d.refresh_from_db()
    assert d.generation == 1 and d.proposed_spec is None


def test_a_plan_takes_the_same_typed_spec_and_names_a_misspelled_field_as_a_request_does(api, member):
    """POST /api/v1/plans/ states the spec it takes as the deployment writes do (a generated client gets the same
    type), and refuses a typo with the same path."""
    api.force_authenticate(member)
    document = api.get("/api/schema/?format=json").json()
    body = document["paths"]["/api/v1/plans/"]["post"]["requestBody"]["content"]["application/json"]
    plan = document["components"]["schemas"][body["schema"]["$ref"].rsplit("/", 1)[1]]
    assert plan["properties"]["spec"]["allOf"] == [{"$ref": "#/components/schemas/DeploymentSpec"}]
    assert plan["required"] == ["spec"]
    r = api.post("/api/v1/plans/", {"spec": spec_input(prefill={**POOL, "replcas_max": 3})}, format="json")
    assert (r.status_code, r.json()["errors"]) == (400, TYPO)
