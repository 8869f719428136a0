"""Okta's provisioning, request by request as its SCIM 2.0 reference shows them (recorded.py), against a live
Tandem: a user is found or created, pushed groups make them a member of the team they map to, and deactivation
takes everything away."""
from django.contrib.auth import get_user_model
from scim2_models import Context, Group, User

from deployments.models import Event, Membership
from tests.scim import recorded

SCIM_JSON = "application/scim+json"


def test_okta_creates_a_user_pushes_a_group_and_deactivates_them(scim_http, team):
    assert scim_http.get("Users", params=recorded.OKTA_FIND_USER).json()["totalResults"] == 0
    created = scim_http.post("Users", json=recorded.OKTA_CREATE_USER, headers={"Content-Type": SCIM_JSON})
    assert created.status_code == 201, created.text
    assert created.headers["Content-Type"] == SCIM_JSON
    body = User.model_validate(created.json(), scim_ctx=Context.RESOURCE_CREATION_RESPONSE)
    assert created.headers["Location"].endswith(f"/scim/v2/Users/{body.id}")
    user = get_user_model().objects.get(pk=body.id)
    assert (user.username, user.email, user.first_name, user.last_name, user.is_active) == (
        recorded.OKTA_USER_NAME, "test.user@example.com", "Test", "User", True)
    assert not user.has_usable_password()  # Okta's password is not kept: people sign in through the IdP
    found = scim_http.get("Users", params=recorded.OKTA_FIND_USER).json()
    assert (found["totalResults"], found["Resources"][0]["id"]) == (1, body.id)

    group = scim_http.post("Groups", json=recorded.OKTA_CREATE_GROUP)
    assert group.status_code == 201, group.text
    group_id = Group.model_validate(group.json(), scim_ctx=Context.RESOURCE_CREATION_RESPONSE).id
    added = scim_http.patch(f"Groups/{group_id}", json=recorded.okta_add_members(user.pk))
    assert added.status_code == 200, added.text
    assert [m["value"] for m in added.json()["members"]] == [str(user.pk)]
    assert Membership.objects.get(user=user).team == team  # "Test SCIMv2" maps to ml-research (conftest)

    removed = scim_http.patch(f"Groups/{group_id}", json=recorded.okta_remove_member(user.pk))
    assert removed.status_code == 200 and "members" not in removed.json()
    assert not Membership.objects.filter(user=user).exists()
    renamed = scim_http.patch(f"Groups/{group_id}", json=recorded.okta_rename_group(group_id, "Renamed"))
    assert renamed.json()["displayName"] == "Renamed"

    scim_http.patch(f"Groups/{group_id}", json=recorded.okta_add_members(user.pk))
    off = scim_http.patch(f"Users/{user.pk}", json=recorded.OKTA_DEACTIVATE_USER)
    assert off.status_code == 200 and off.json()["active"] is False
    user.refresh_from_db()
    assert not user.is_active
    kinds = list(Event.objects.filter(actor=None).order_by("id").values_list("kind", flat=True))
    assert kinds == ["user_created", "scim_group_created", "scim_group_updated", "member_added",
                     "scim_group_updated", "member_removed", "scim_group_updated", "scim_group_updated",
                     "user_deactivated"]
    assert Event.objects.get(kind="member_added").message == "From the company directory's groups (SCIM)."
    assert scim_http.delete(f"Groups/{group_id}").status_code == 204
    assert scim_http.get(f"Groups/{group_id}").status_code == 404


def test_a_user_who_signed_in_already_is_found_by_username_not_created_twice(scim_http, member):
    found = scim_http.get("Users", params={"filter": f'userName eq "{member.username.upper()}"'}).json()
    assert [r["id"] for r in found["Resources"]] == [str(member.pk)]
    again = scim_http.post("Users", json=recorded.OKTA_CREATE_USER | {"userName": member.username})
    assert again.status_code == 409 and again.json()["scimType"] == "uniqueness"
    assert get_user_model().objects.filter(username=member.username).count() == 1


def test_a_deactivated_user_stays_out_of_teams_until_reactivated(scim_http, team):
    user_id = scim_http.post("Users", json=recorded.OKTA_CREATE_USER).json()["id"]
    group_id = scim_http.post("Groups", json=recorded.OKTA_CREATE_GROUP).json()["id"]
    scim_http.patch(f"Groups/{group_id}", json=recorded.okta_add_members(user_id))
    scim_http.patch(f"Users/{user_id}", json=recorded.OKTA_DEACTIVATE_USER)
    assert not Membership.objects.filter(user_id=user_id).exists()

    # The directory still lists the leaver in the group; a rename pushes it again: nothing comes back.
    scim_http.patch(f"Groups/{group_id}", json=recorded.okta_rename_group(group_id, "Test SCIMv2"))
    scim_http.put(f"Groups/{group_id}", json=recorded.OKTA_CREATE_GROUP | {"members": [{"value": user_id}]})
    assert not Membership.objects.filter(user_id=user_id).exists()

    back = scim_http.patch(f"Users/{user_id}", json={"schemas": ["urn:ietf:params:scim:api:messages:2.0:PatchOp"],
                                                     "Operations": [{"op": "replace", "value": {"active": True}}]})
    assert back.json()["active"] is True
    assert Membership.objects.get(user_id=user_id).team == team  # the groups it is still in map to ml-research
    assert Event.objects.filter(kind="user_reactivated", actor=None).count() == 1
