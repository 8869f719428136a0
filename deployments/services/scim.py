"""Provisioning from the company directory (SCIM 2.0, /scim/v2/): the identity provider creates, changes, deactivates
and deletes users, and pushes groups whose members it keeps.

Tandem acts on what the directory says (`actor=None` in the audit trail, with DIRECTORY in the message). A user it
marks inactive is deactivated as any leaver is (deployments.services.people): memberships, keys, tokens and
sessions go at once. Group membership drives team membership through the same mapping OIDC sign-in uses
(`TANDEM_OIDC_GROUP_MAP`, `sign_in.sign_in_sync_memberships`): a member's mapped teams follow the names of the
pushed groups they are in. Users are matched to OIDC sign-ins by userName, the OIDC username claim.
"""
from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from deployments.errors import Conflict, NotAllowed
from deployments.event_kinds import EventKind
from deployments.models import ScimGroup, ScimToken, ScimUser
from deployments.permissions import is_platform_admin
from deployments.services.credentials import credential_check, credential_mint, credential_revoke
from deployments.services.events import event_record
from deployments.services.people import (DETAILS, user_create, user_deactivate, user_delete, user_reactivate,
                                          user_update)
from deployments.services.sign_in import sign_in_sync_memberships

DIRECTORY = "From the company directory (SCIM)."


@dataclass(frozen=True)
class UserFields:
    """What the directory says about a person, as Tandem stores it."""

    username: str
    external_id: str = ""
    email: str = ""
    first_name: str = ""
    last_name: str = ""
    active: bool | None = None  # None: the directory did not say

    def details(self) -> dict:
        return {f: getattr(self, f) for f in DETAILS}


@transaction.atomic
def scim_token_create(*, actor, name: str) -> tuple[ScimToken, str]:
    """A token for an identity provider to call /scim/v2/ with (platform admins only); returns (token, plaintext)
    and the plaintext is never stored. It lives until revoked: the directory calls unattended."""
    if not is_platform_admin(actor):
        raise NotAllowed("Only platform admins can create SCIM tokens.")
    token, raw = credential_mint(model=ScimToken, name=name, created_by=actor)
    event_record(kind=EventKind.SCIM_TOKEN_CREATED, actor=actor, after={"name": name, "key_id": token.key_id})
    return token, raw


@transaction.atomic
def scim_token_revoke(*, actor, token: ScimToken) -> None:
    if not is_platform_admin(actor):
        raise NotAllowed("Only platform admins can revoke SCIM tokens.")
    if credential_revoke(row=token):
        event_record(kind=EventKind.SCIM_TOKEN_REVOKED, actor=actor, before={"name": token.name,
                                                                            "key_id": token.key_id})


def scim_token_check(raw: str) -> ScimToken | None:
    """The live token this secret belongs to, or None; notes its use at most once a minute."""
    token = credential_check(model=ScimToken, raw=raw)
    now = timezone.now()
    if token is not None and (token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60):
        ScimToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token


def _sync_teams(user) -> None:
    """Make the user's mapped teams follow the pushed groups they are in (nothing for a deactivated user)."""
    groups = list(user.scim_groups.values_list("display_name", flat=True))
    sign_in_sync_memberships(user=user, groups=groups, source="the company directory's groups (SCIM)")


@transaction.atomic
def scim_user_create(*, fields: UserFields):
    """A user the directory provisions; a userName taken already is a Conflict (the directory then looks the user
    up by userName and links to it)."""
    user = user_create(actor=None, message=DIRECTORY, **fields.details())
    ScimUser.objects.create(user=user, external_id=fields.external_id)
    if fields.active is False:
        user = user_deactivate(actor=None, user=user, message=DIRECTORY)
    return user


@transaction.atomic
def scim_user_update(*, user, fields: UserFields):
    """Apply what the directory says now: details (audited), its id for the user, and whether they are active
    (deactivation takes every way in away; reactivation gives back the teams their groups map to)."""
    user = user_update(actor=None, user=user, message=DIRECTORY, **fields.details())
    ScimUser.objects.update_or_create(user=user, defaults={"external_id": fields.external_id})
    if fields.active is False:
        user = user_deactivate(actor=None, user=user, message=DIRECTORY)
    elif fields.active and not user.is_active:
        user = user_reactivate(actor=None, user=user, message=DIRECTORY)
        _sync_teams(user)
    return user


def scim_user_delete(*, user) -> None:
    """The directory removed the user: deactivated, then deleted (people.user_delete). The deactivation commits on
    its own first: someone whose name is on deployment requests is not deleted (Conflict), but never keeps access."""
    user_deactivate(actor=None, user=user, message=DIRECTORY)
    user_delete(actor=None, user=user, message=DIRECTORY)


def _group_state(group: ScimGroup) -> dict:
    return {"group": group.display_name, "members": sorted(group.members.values_list("username", flat=True))}


@transaction.atomic
def scim_group_create(*, display_name: str, external_id: str = "", members=()) -> ScimGroup:
    if ScimGroup.objects.filter(display_name__iexact=display_name).exists():
        raise Conflict(f"A group named {display_name!r} exists already.", field="displayName")
    group = ScimGroup.objects.create(display_name=display_name, external_id=external_id)
    group.members.set(members)
    event_record(kind=EventKind.SCIM_GROUP_CREATED, actor=None, message=DIRECTORY, after=_group_state(group))
    for user in members:
        _sync_teams(user)
    return group


@transaction.atomic
def scim_group_update(*, group: ScimGroup, display_name: str, external_id: str = "", members=()) -> ScimGroup:
    """Rename a group and set its members; the teams of everyone whose groups changed follow."""
    group = ScimGroup.objects.select_for_update().get(pk=group.pk)
    if ScimGroup.objects.filter(display_name__iexact=display_name).exclude(pk=group.pk).exists():
        raise Conflict(f"A group named {display_name!r} exists already.", field="displayName")
    before = _group_state(group)
    old, new = set(group.members.all()), set(members)
    renamed = group.display_name != display_name
    group.display_name, group.external_id = display_name, external_id
    group.save()
    group.members.set(new)
    after = _group_state(group)
    if after != before:
        event_record(kind=EventKind.SCIM_GROUP_UPDATED, actor=None, message=DIRECTORY, before=before, after=after)
    for user in (old | new) if renamed else (old ^ new):
        _sync_teams(user)
    return group


@transaction.atomic
def scim_group_delete(*, group: ScimGroup) -> None:
    members = list(group.members.all())
    event_record(kind=EventKind.SCIM_GROUP_DELETED, actor=None, message=DIRECTORY, before=_group_state(group))
    group.delete()
    for user in members:
        _sync_teams(user)
