"""Requests as Okta and Microsoft Entra ID send them to a SCIM 2.0 service, copied from their public documentation
(the URL above each). Only placeholders change: the ids a service handed out (filled in by the tests) and Okta's
`okta.local` e-mail domain, a reserved name that e-mail validation refuses (the userName keeps it).
"""

# https://developer.okta.com/docs/api/openapi/okta-scim/guides/scim-20 ("Create the User", "Retrieve Users",
# "Update a specific User (PATCH)", "Create Groups", "Update a specific Group name / membership")
OKTA_USER_NAME = "test.user@okta.local"
OKTA_FIND_USER = {"filter": f'userName eq "{OKTA_USER_NAME}"', "startIndex": "1", "count": "100"}
OKTA_CREATE_USER = {
    "schemas": ["urn:ietf:params:scim:schemas:core:2.0:User"],
    "userName": OKTA_USER_NAME,
    "name": {"givenName": "Test", "familyName": "User"},
    "emails": [{"primary": True, "value": "test.user@example.com", "type": "work"}],
    "displayName": "Test User",
    "locale": "en-US",
    "externalId": "00ujl29u0le5T6Aj10h7",
    "groups": [],
    "password": "1mz050nq",
    "active": True,
}
OKTA_DEACTIVATE_USER = {
    "schemas": ["urn:ietf:params:scim:api:messages:2.0:PatchOp"],
    "Operations": [{"op": "replace", "value": {"active": False}}],
}
OKTA_CREATE_GROUP = {
    "schemas": ["urn:ietf:params:scim:schemas:core:2.0:Group"],
    "displayName": "Test SCIMv2",
    "members": [],
}


def okta_add_members(*user_ids) -> dict:
    return {"schemas": ["urn:ietf:params:scim:api:messages:2.0:PatchOp"],
            "Operations": [{"op": "add", "path": "members",
                            "value": [{"value": str(i), "display": OKTA_USER_NAME} for i in user_ids]}]}


def okta_remove_member(user_id) -> dict:
    return {"schemas": ["urn:ietf:params:scim:api:messages:2.0:PatchOp"],
            "Operations": [{"op": "remove", "path": f'members[value eq "{user_id}"]'}]}


def okta_rename_group(group_id, name) -> dict:
    return {"schemas": ["urn:ietf:params:scim:api:messages:2.0:PatchOp"],
            "Operations": [{"op": "replace", "value": {"id": str(group_id), "displayName": name}}]}


# https://learn.microsoft.com/en-us/entra/identity/app-provisioning/use-scim-to-provision-users-and-groups
# ("Create User", "Get User by query", "Update User [Multi-valued properties]", "Create Group", "Update Group
# [Add Members]", "Update Group [Remove Members]", "Get Group by displayName")
ENTRA_USER_NAME = "Test_User_ab6490ee-1e48-479e-a20b-2d77186b5dd1"
ENTRA_FIND_USER = {"filter": f'userName eq "{ENTRA_USER_NAME}"'}
ENTRA_CREATE_USER = {
    "schemas": ["urn:ietf:params:scim:schemas:core:2.0:User",
                "urn:ietf:params:scim:schemas:extension:enterprise:2.0:User"],
    "externalId": "0a21f0f2-8d2a-4f8e-bf98-7363c4aed4ef",
    "userName": ENTRA_USER_NAME,
    "active": True,
    "emails": [{"primary": True, "type": "work",
                "value": "Test_User_fd0ea19b-0777-472c-9f96-4f70d2226f2e@testuser.com"}],
    "meta": {"resourceType": "User"},
    "name": {"formatted": "givenName familyName", "familyName": "familyName", "givenName": "givenName"},
    "roles": [],
}
ENTRA_UPDATE_USER = {
    "schemas": ["urn:ietf:params:scim:api:messages:2.0:PatchOp"],
    "Operations": [{"op": "Replace", "path": 'emails[type eq "work"].value', "value": "updatedEmail@microsoft.com"},
                   {"op": "Replace", "path": "name.familyName", "value": "updatedFamilyName"}],
}
ENTRA_CREATE_GROUP = {
    "schemas": ["urn:ietf:params:scim:schemas:core:2.0:Group",
                "http://schemas.microsoft.com/2006/11/ResourceManagement/ADSCIM/Group"],
    "externalId": "8aa1a0c0-c4c3-4bc0-b4a5-2ef676900159",
    "displayName": "displayName",
    "meta": {"resourceType": "Group"},
}
ENTRA_FIND_GROUP = {"excludedAttributes": "members", "filter": 'displayName eq "displayName"'}


def entra_add_member(user_id) -> dict:
    return {"schemas": ["urn:ietf:params:scim:api:messages:2.0:PatchOp"],
            "Operations": [{"op": "Add", "path": "members", "value": [{"$ref": None, "value": str(user_id)}]}]}


def entra_remove_member(user_id) -> dict:
    return {"schemas": ["urn:ietf:params:scim:api:messages:2.0:PatchOp"],
            "Operations": [{"op": "Remove", "path": "members", "value": [{"$ref": None, "value": str(user_id)}]}]}


# https://learn.microsoft.com/en-us/entra/identity/app-provisioning/application-provisioning-config-problem-scim-compatibility
# (the provisioning job's PATCH of a user's `active`: capitalised op, the boolean as a string)
ENTRA_DISABLE_USER = {
    "schemas": ["urn:ietf:params:scim:api:messages:2.0:PatchOp"],
    "Operations": [{"op": "Replace", "path": "active", "value": "False"}],
}
