"""What a SCIM client gets wrong is refused with a SCIM Error body (RFC 7644 §3.12: its schema, the status as a
string, a scimType), and nothing is changed: not the user, not the audit trail."""
import pytest
from django.contrib.auth import get_user_model

from deployments.models import Event, ScimGroup
from deployments.services.access_tokens import access_token_create
from tests.factories import DeploymentFactory
from tests.scim import recorded

ERROR_SCHEMA = "urn:ietf:params:scim:api:messages:2.0:Error"
PATCH_OP = "urn:ietf:params:scim:api:messages:2.0:PatchOp"


def snapshot():
    users = list(get_user_model().objects.order_by("pk").values())
    groups = [(g.display_name, sorted(g.members.values_list("pk", flat=True))) for g in ScimGroup.objects.all()]
    return users, groups, Event.objects.count()


def assert_refused(response, status: int, scim_type: str | None, before):
    body = response.json()
    assert response.status_code == status, response.text
    assert body["schemas"] == [ERROR_SCHEMA] and body["status"] == str(status)
    assert body.get("scimType") == scim_type, body
    assert body["detail"]
    assert snapshot() == before


def patch(*operations, schemas=(PATCH_OP,)):
    return {"schemas": list(schemas), "Operations": list(operations)}


@pytest.mark.parametrize("body, scim_type", [
    (patch({"op": "replace", "path": "active", "value": False}, {"op": "frobnicate", "path": "title", "value": "x"}),
     "invalidValue"),  # an operation RFC 7644 does not define, after one that alone would deactivate
    (patch({"op": "replace", "path": "active", "value": False}, {"op": "replace", "path": "shoeSize", "value": 9}),
     "invalidPath"),  # a path no schema declares
    (patch({"op": "remove", "path": "userName"}), "mutability"),  # a required attribute
    (patch({"op": "replace", "path": "id", "value": "7"}), "mutability"),  # read-only
    (patch({"op": "replace", "path": "active", "value": False}, schemas=["urn:example:params:scim:PatchOp"]),
     "invalidSyntax"),  # not a PatchOp
], ids=["unknown-op", "unknown-path", "remove-required", "read-only", "unknown-message-schema"])
def test_a_patch_it_does_not_support_changes_nothing(scim_http, member, body, scim_type):
    before = snapshot()
    assert_refused(scim_http.patch(f"Users/{member.pk}", json=body), 400, scim_type, before)
    member.refresh_from_db()
    assert member.is_active


def test_a_user_of_an_unknown_schema_is_refused(scim_http, db):
    before = snapshot()
    body = recorded.OKTA_CREATE_USER | {"schemas": ["urn:ietf:params:scim:schemas:core:2.0:User",
                                                    "urn:example:params:scim:schemas:extension:shoes:1.0:User"]}
    assert_refused(scim_http.post("Users", json=body), 400, "invalidSyntax", before)
    body = recorded.OKTA_CREATE_USER | {"schemas": ["urn:example:params:scim:schemas:core:2.0:Person"]}
    assert_refused(scim_http.post("Users", json=body), 400, "invalidSyntax", before)


@pytest.mark.parametrize("query", ['userName eqq "kim"', 'title eq "boss"', 'userName co "kim"',
                                   'userName eq "kim" or userName eq "lee"', 'nosuch eq "x"'])
def test_a_filter_it_cannot_answer_is_invalid_filter(scim_http, member, query):
    assert_refused(scim_http.get("Users", params={"filter": query}), 400, "invalidFilter", snapshot())


def test_a_group_naming_someone_who_is_not_a_user_changes_nothing(scim_http, member):
    group = scim_http.post("Groups", json=recorded.OKTA_CREATE_GROUP).json()
    before = snapshot()
    body = patch({"op": "add", "path": "members", "value": [{"value": str(member.pk)}, {"value": "999999"}]})
    assert_refused(scim_http.patch(f"Groups/{group['id']}", json=body), 400, "invalidValue", before)


def test_not_json_is_invalid_syntax(scim_http, member):
    response = scim_http.post("Users", content=b"{not json", headers={"Content-Type": "application/scim+json"})
    assert_refused(response, 400, "invalidSyntax", snapshot())


@pytest.mark.parametrize("header", [None, "Bearer tds_nope", "Basic dXNlcjpwYXNz", "personal-token"])
def test_only_a_scim_token_is_let_in(scim_http, member, header):
    if header == "personal-token":  # a platform admin's own API token is not a SCIM token
        header = f"Bearer {access_token_create(user=member, name='laptop')[1]}"
    headers = {"Authorization": header} if header else {}
    scim_http.headers.pop("Authorization")
    before = snapshot()
    response = scim_http.patch(f"Users/{member.pk}", json=recorded.OKTA_DEACTIVATE_USER, headers=headers)
    assert_refused(response, 401, None, before)
    assert response.headers["WWW-Authenticate"].startswith("Bearer")


def test_an_unknown_id_is_not_found(scim_http, db):
    assert_refused(scim_http.get("Users/424242"), 404, None, snapshot())
    assert_refused(scim_http.get("Groups/not-a-uuid"), 404, None, snapshot())


def test_someone_whose_name_is_on_deployment_requests_is_deactivated_not_deleted(scim_http, member):
    DeploymentFactory(requested_by=member)
    response = scim_http.delete(f"Users/{member.pk}")
    assert (response.status_code, response.json()["schemas"]) == (409, [ERROR_SCHEMA])
    assert "deactivate them instead" in response.json()["detail"]
    member.refresh_from_db()
    assert not member.is_active  # kept for the deployments' history, but with no way in
    assert scim_http.get(f"Users/{member.pk}").json()["active"] is False
