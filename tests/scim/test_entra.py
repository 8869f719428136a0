"""Microsoft Entra ID's provisioning, as its documentation records the requests (recorded.py): its enterprise
extension and group schema, capitalised operations, members removed by value, and `active` as the string "False"."""
from django.contrib.auth import get_user_model
from scim2_models import Context, User

from deployments.models import Event, Membership, ScimGroup
from tests.scim import recorded


def test_entra_creates_updates_groups_disables_and_deletes_a_user(scim_http, team):
    created = scim_http.post("Users", json=recorded.ENTRA_CREATE_USER)
    assert created.status_code == 201, created.text
    user_id = User.model_validate(created.json(), scim_ctx=Context.RESOURCE_CREATION_RESPONSE).id
    assert scim_http.get("Users", params=recorded.ENTRA_FIND_USER).json()["Resources"][0]["externalId"] == \
        recorded.ENTRA_CREATE_USER["externalId"]

    updated = scim_http.patch(f"Users/{user_id}", json=recorded.ENTRA_UPDATE_USER)
    assert updated.status_code == 200, updated.text
    user = get_user_model().objects.get(pk=user_id)
    assert (user.email, user.last_name) == ("updatedEmail@microsoft.com", "updatedFamilyName")
    assert Event.objects.get(kind="user_updated").after == {"email": "updatedEmail@microsoft.com",
                                                             "last_name": "updatedFamilyName"}

    group = scim_http.post("Groups", json=recorded.ENTRA_CREATE_GROUP)
    assert group.status_code == 201, group.text
    group_id = group.json()["id"]
    scim_http.patch(f"Groups/{group_id}", json=recorded.entra_add_member(user_id))
    assert Membership.objects.get(user=user).role == Membership.Role.ADMIN  # "displayName" maps to admin
    listed = scim_http.get("Groups", params=recorded.ENTRA_FIND_GROUP).json()
    assert [r["id"] for r in listed["Resources"]] == [group_id]
    assert "members" not in listed["Resources"][0]  # excludedAttributes=members
    scim_http.patch(f"Groups/{group_id}", json=recorded.entra_remove_member(user_id))
    assert not Membership.objects.filter(user=user).exists()
    assert not ScimGroup.objects.get(pk=group_id).members.exists()

    disabled = scim_http.patch(f"Users/{user_id}", json=recorded.ENTRA_DISABLE_USER)
    assert disabled.status_code == 200 and disabled.json()["active"] is False
    assert not get_user_model().objects.get(pk=user_id).is_active

    assert scim_http.delete(f"Users/{user_id}").status_code == 204
    assert scim_http.get(f"Users/{user_id}").status_code == 404
    assert Event.objects.get(kind="user_deleted").before["user"] == recorded.ENTRA_USER_NAME
