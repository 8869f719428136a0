"""Tandem's users and directory groups as SCIM 2.0 resources (scim2-models), and back; what this service declares
on its discovery endpoints; which filters it answers."""
from django.contrib.auth import get_user_model
from django.db.models import QuerySet
from scim2_models import (AuthenticationScheme, Bulk, ChangePassword, Email, EnterpriseUser, ETag, Filter, Group,
                          GroupMember, GroupMembership, InvalidFilterException, InvalidValueException, Meta, Name,
                          Patch, ResourceType, ScimFilter, ScimPolicy, ScimProvider, ServiceProviderConfig, Sort,
                          User)
from scim2_models.path import Comparison

from deployments.models import ScimGroup
from deployments.services.scim import UserFields

UserResource = User[EnterpriseUser]  # Entra sends the enterprise extension with its users
MAX_RESULTS = 200

PROVIDER = ScimProvider(
    models=[User, EnterpriseUser, Group],
    resource_types=[ResourceType.from_resource(UserResource), ResourceType.from_resource(Group)],
    config=ServiceProviderConfig(
        patch=Patch(supported=True), bulk=Bulk(supported=False, max_operations=0, max_payload_size=0),
        filter=Filter(supported=True, max_results=MAX_RESULTS), change_password=ChangePassword(supported=False),
        sort=Sort(supported=False), etag=ETag(supported=False),
        authentication_schemes=[AuthenticationScheme(
            type="oauthbearertoken", name="Bearer token", primary=True,
            description="A SCIM token (tds_...) a Tandem platform admin creates: Authorization: Bearer tds_...")]),
    # Microsoft Entra's readings of RFC 7644 §3.5.2 (a `remove` naming the members to remove in its value, a
    # filtered path that matches nothing yet creates the entry), as scim2-models names them.
    policy=ScimPolicy(remove_value_as_filter=ScimPolicy.RemoveValue.apply,
                      unmatched_path_filter=ScimPolicy.UnmatchedPathFilter.create),
)

# Entra lists a schema of its own, with no attributes, among a group's schemas; it says nothing Tandem stores.
ENTRA_GROUP_SCHEMA = "http://schemas.microsoft.com/2006/11/ResourceManagement/ADSCIM/Group"

# The filters Okta and Entra send to find what exists: `<attribute> eq "<value>"`, attribute → lookup.
USER_FILTERS = {"username": "username__iexact", "externalid": "scim__external_id"}
GROUP_FILTERS = {"displayname": "display_name__iexact", "externalid": "external_id"}


def user_resource(user, location: str) -> UserResource:
    email = [Email(value=user.email, type=Email.Type.work, primary=True)] if user.email else None
    external_id = getattr(getattr(user, "scim", None), "external_id", "") or None
    return UserResource(
        id=str(user.pk), external_id=external_id, user_name=user.username, active=user.is_active, emails=email,
        name=Name(given_name=user.first_name or None, family_name=user.last_name or None),
        groups=[GroupMembership(value=str(g.pk), display=g.display_name) for g in user.scim_groups.all()] or None,
        meta=Meta(resource_type="User", created=user.date_joined, last_modified=user.date_joined, location=location))


def user_fields(resource: User) -> UserFields:
    """What a validated (created, replaced or patched) resource says; its work or primary e-mail is the one kept."""
    emails = resource.emails or []
    email = next((e for e in emails if e.primary), None) or next((e for e in emails if e.type == "work"), None)
    name = resource.name or Name()
    return UserFields(username=resource.user_name, external_id=resource.external_id or "",
                      email=str(email.value) if email and email.value else "", first_name=name.given_name or "",
                      last_name=name.family_name or "", active=resource.active)


def group_resource(group: ScimGroup, location: str) -> Group:
    members = [GroupMember(value=str(u.pk), display=u.username, type="User") for u in group.members.all()]
    return Group(id=str(group.pk), external_id=group.external_id or None, display_name=group.display_name,
                 members=members or None,
                 meta=Meta(resource_type="Group", created=group.created_at, last_modified=group.updated_at,
                           location=location))


def group_members(resource: Group) -> list:
    """The users a group resource names; a member that is not a Tandem user is invalidValue."""
    ids = [m.value for m in resource.members or []]
    if not all(str(i).isdigit() for i in ids):
        raise InvalidValueException(detail="A group's members are users of this service, named by their id.")
    users = list(get_user_model().objects.filter(pk__in=ids))
    if missing := set(map(int, ids)) - {u.pk for u in users}:
        raise InvalidValueException(detail=f"No user with id {', '.join(map(str, sorted(missing)))}.")
    return users


def filtered(queryset: QuerySet, scim_filter: ScimFilter | None, lookups: dict[str, str]) -> QuerySet:
    """The rows a filter selects. Only `<attribute> eq "<value>"` on the attributes in `lookups` is answered, what
    identity providers send to find an existing user or group; any other is invalidFilter."""
    if scim_filter is None:
        return queryset
    node = scim_filter.ast
    if (isinstance(node, Comparison) and node.op.value == "eq" and not node.attr_path.sub_attr
            and (lookup := lookups.get(node.attr_path.attr.lower())) and isinstance(node.value, str)):
        return queryset.filter(**{lookup: node.value})
    raise InvalidFilterException(detail=f"This service answers filters of the form <attribute> eq \"<value>\" on "
                                        f"{', '.join(sorted(lookups))}; not {scim_filter}.")
