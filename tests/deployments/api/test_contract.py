"""The contract a generated client relies on, asserted directly (schemathesis covers it broadly in
test_schema_fuzz.py): what is refused and how, and what the schema says of the fields clients read."""
import pytest

from deployments.event_kinds import EventKind
from deployments.lifecycle import Status


@pytest.fixture
def schema(api, db):
    return api.get("/api/schema/?format=json").json()


def test_a_form_encoded_body_is_refused_with_415_not_a_server_error(api, platform_admin):
    api.force_authenticate(platform_admin)
    r = api.post("/api/v1/clusters/", "name=x&kind=ray", content_type="application/x-www-form-urlencoded")
    assert r.status_code == 415 and "application/x-www-form-urlencoded" in r.json()["detail"]


@pytest.mark.parametrize("query", ["offset=null", "offset=-1", "limit=0", "limit=abc", "limit=100000"])
def test_pagination_it_cannot_read_is_a_400_naming_the_parameter(api, member, query):
    api.force_authenticate(member)
    r = api.get(f"/api/v1/deployments/?{query}")
    assert r.status_code == 400 and set(r.json()["errors"]) == {query.split("=")[0]}


def test_a_status_filter_outside_the_enum_is_a_400(api, member):
    api.force_authenticate(member)
    assert api.get("/api/v1/deployments/?status=paused").status_code == 200
    assert api.get("/api/v1/deployments/?status=sleeping").status_code == 400


def test_event_kinds_are_an_enum_in_the_schema_and_the_kind_filter_takes_only_those(api, member, schema):
    c = schema["components"]["schemas"]
    assert set(c["EventKindEnum"]["enum"]) == set(EventKind.values)
    assert c["Event"]["properties"]["kind"]["allOf"][0]["$ref"].endswith("/EventKindEnum")
    assert c["KindEnum"]["enum"] == ["eks", "kubernetes", "ray"]  # clusters' kinds keep their name
    kind = next(p for p in schema["paths"]["/api/v1/events/"]["get"]["parameters"] if p["name"] == "kind")
    assert set(kind["schema"]["enum"]) == set(EventKind.values)
    api.force_authenticate(member)
    assert api.get("/api/v1/events/?kind=requested").status_code == 200
    r = api.get("/api/v1/events/?kind=team_note")
    assert r.status_code == 400 and set(r.json()["errors"]) == {"kind"}


def test_the_dry_runs_are_operations_of_their_own(schema):
    for path, method, body in (("/api/v1/deployments/preview/", "post", "DeploymentCreateRequest"),
                               ("/api/v1/deployments/{id}/preview/", "post", "DeploymentEditRequest")):
        op = schema["paths"][path][method]
        assert op["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(f"/{body}")
        assert op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/DeploymentPreview")
        assert {"400", "403", "409"} <= set(op["responses"])
    assert set(schema["components"]["schemas"]["OutcomeEnum"]["enum"]) == {"created", "unchanged", "edited",
                                                                            "updated", "proposed"}


@pytest.mark.parametrize("query", ["deployment=1&deployment=2", "deployment=", "status=&team=x"])
def test_a_query_parameter_given_twice_or_empty_is_a_400_naming_it(api, member, query):
    # schemathesis's finds: each answered 200 before, as if the filter were not there
    api.force_authenticate(member)
    r = api.get(f"/api/v1/deployments/?{query}")
    assert r.status_code == 400 and set(r.json()["errors"]) == {query.split("=")[0]}
    assert api.get("/api/v1/deployments/?team=x").status_code == 200
    assert api.generic("TRACE", f"/api/v1/deployments/?{query}").status_code == 405  # a method it does not serve


def test_an_unknown_api_path_answers_json(api, member):
    api.force_authenticate(member)
    r = api.get("/api/v1/no-such-thing/")
    assert r.status_code == 404 and r.json() == {"detail": "Not found."}


def test_every_operation_documents_its_errors_with_one_body(schema):
    for path, item in schema["paths"].items():
        for method, op in item.items():
            codes = set(op["responses"])
            assert {"401", "403", "429"} <= codes, (method, path)
            if "requestBody" in op:
                assert {"400", "415"} <= codes, (method, path)
            if "{" in path:
                assert "404" in codes, (method, path)
            if method in ("post", "put", "patch", "delete"):
                assert "409" in codes, (method, path)
            assert op["responses"]["404" if "{" in path else "401"]["content"]["application/json"]["schema"] == {
                "$ref": "#/components/schemas/Error"}


def test_the_schema_marks_nullable_fields_enums_and_the_actions_bodies(schema):
    c = schema["components"]["schemas"]
    assert c["Event"]["properties"]["deployment"]["nullable"] is True
    assert c["Event"]["properties"]["team"]["nullable"] is True
    assert set(c["DeploymentStatusEnum"]["enum"]) == set(Status.values) >= {"pausing", "paused"}
    assert c["Deployment"]["properties"]["status"]["allOf"][0]["$ref"].endswith("/DeploymentStatusEnum")
    assert c["Cluster"]["properties"].get("secret_ref") is None and "secret_ref" in c["ClusterRequest"]["properties"]
    approve = schema["paths"]["/api/v1/deployments/{id}/approve/"]["post"]
    body = approve["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
    assert c[body]["required"] == ["generation"]
    assert "202" in schema["paths"]["/api/v1/deployments/{id}/pause/"]["post"]["responses"]
    assert schema["paths"]["/api/v1/deployments/"]["post"]["responses"]["201"]["links"]
