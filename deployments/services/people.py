"""People: who exists (create, update) and who stops being trusted (deactivate: a leaver loses every way in at
once; reactivate; delete).

Every entry point goes through here: Django's user admin, SCIM provisioning from the company directory
(`actor=None`: Tandem acting on what the identity provider says) and anything added later. Deactivation takes away
what each part of Tandem checks: team memberships (`teams.membership_remove`, audited), the gateway keys the person
created (revoked and announced to every gateway replica), personal access tokens (the API), portal sessions, the
platform-admin flag, and `is_active` (which the token authentication, password sign-in and the OIDC callback
refuse). Sessions are deleted as well, not left to each sign-in backend's check of `is_active` (mozilla-django-oidc's
own `get_user` does not look at it).
"""
from django.contrib.auth import get_user_model
from django.contrib.sessions.models import Session
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from deployments.errors import Conflict, NotAllowed
from deployments.event_kinds import EventKind
from deployments.models import Deployment, Membership
from deployments.permissions import is_platform_admin
from deployments.services.access_tokens import access_tokens_revoke_for_person
from deployments.services.api_keys import api_keys_revoke_for_person
from deployments.services.events import event_record
from deployments.services.teams import membership_remove, platform_admin_set


def _require_may_manage(*, actor, user, doing: str) -> None:
    """Platform admins manage people; `user` (when named) not themselves: no one locks out the last admin by
    accident. Tandem (`actor=None`) manages anyone the directory provisions."""
    if actor is None:
        return
    if not is_platform_admin(actor):
        raise NotAllowed(f"Only platform admins can {doing} people.")
    if user is not None and actor.pk == user.pk:
        raise NotAllowed(f"You cannot {doing} yourself; ask another platform admin.")


DETAILS = ("username", "email", "first_name", "last_name")


@transaction.atomic
def user_create(*, actor, username: str, password: str | None = None, message: str = "", about: dict | None = None,
                **details):
    """A new user (platform admins; Tandem for the directory or a first sign-in): with a password, or none usable
    (they sign in through the identity provider). A username taken in any case is a Conflict. `about` adds to what
    the audit event records (e.g. the identity a sign-in came with)."""
    _require_may_manage(actor=actor, user=None, doing="create")
    User = get_user_model()
    if User.objects.filter(username__iexact=username).exists():
        raise Conflict(f"A user named {username!r} exists already.", field="userName")
    user = User.objects.create_user(username=username, password=password, **details)
    event_record(kind=EventKind.USER_CREATED, actor=actor, message=message, after={"user": username, **(about or {})})
    return user


@transaction.atomic
def user_update(*, actor, user, message: str = "", **changes):
    """Change a user's username, e-mail or name (platform admins, themselves included; Tandem for the directory),
    audited with what each was. The username is what an OIDC sign-in and the directory match them by."""
    _require_may_manage(actor=actor, user=None, doing="change")
    User = get_user_model()
    user = User.objects.select_for_update().get(pk=user.pk)
    changes = {f: v for f, v in changes.items() if getattr(user, f) != v}
    if not changes:
        return user
    if set(changes) - set(DETAILS):
        raise ValueError(f"user_update changes only {', '.join(DETAILS)}")
    if "username" in changes and User.objects.filter(username__iexact=changes["username"]).exclude(pk=user.pk).exists():
        raise Conflict(f"A user named {changes['username']!r} exists already.", field="userName")
    before = {f: getattr(user, f) for f in changes}
    for f, v in changes.items():
        setattr(user, f, v)
    user.save(update_fields=list(changes))
    event_record(kind=EventKind.USER_UPDATED, actor=actor, message=message, before=before, after=changes)
    return user


def _sessions_end(user) -> int:
    """Delete every portal session signed in as `user`; their next request is signed out. Sessions are stored
    signed, not indexed by user, so the live ones are read."""
    ended = [s.pk for s in Session.objects.filter(expire_date__gt=timezone.now()).iterator()
             if s.get_decoded().get("_auth_user_id") == str(user.pk)]
    Session.objects.filter(pk__in=ended).delete()
    return len(ended)


@transaction.atomic
def user_deactivate(*, actor, user, message: str = ""):
    """Take away every way in (see the module's docstring) and mark the user inactive; one `user_deactivated`
    event lists what went, beside the events of each membership, key and token. Returns the user as stored."""
    _require_may_manage(actor=actor, user=user, doing="deactivate")
    user = get_user_model().objects.select_for_update().get(pk=user.pk)
    if not user.is_active:
        return user
    username = user.get_username()
    why = message or f"{username} was deactivated."
    memberships = list(Membership.objects.select_related("team", "user").filter(user=user).order_by("team__slug"))
    for m in memberships:
        membership_remove(actor=actor, membership=m, message=why)
    # What membership_remove left: keys in teams they had already left, tokens of a person in no team.
    keys = api_keys_revoke_for_person(actor=actor, user=user, message=why)
    tokens = access_tokens_revoke_for_person(actor=actor, user=user, message=why)
    platform_admin_set(actor=actor, user=user, is_admin=False, message=why)
    sessions = _sessions_end(user)
    user.is_active = False
    user.save(update_fields=["is_active"])
    event_record(kind=EventKind.USER_DEACTIVATED, actor=actor, message=message,
                 before={"user": username, "teams": [m.team.slug for m in memberships]},
                 after={"user": username, "api_keys_revoked": keys, "access_tokens_revoked": tokens,
                        "sessions_ended": sessions})
    return user


@transaction.atomic
def user_reactivate(*, actor, user, message: str = ""):
    """Let a deactivated user sign in again. Nothing taken at deactivation comes back: memberships return with
    the directory's next group push or sign-in (or by hand), keys and tokens are created anew."""
    _require_may_manage(actor=actor, user=user, doing="reactivate")
    user = get_user_model().objects.select_for_update().get(pk=user.pk)
    if user.is_active:
        return user
    user.is_active = True
    user.save(update_fields=["is_active"])
    event_record(kind=EventKind.USER_REACTIVATED, actor=actor, message=message, after={"user": user.get_username()})
    return user


@transaction.atomic
def user_delete(*, actor, user, message: str = "") -> None:
    """Deactivate, then delete the user. The audit trail stays: events name the user in their before/after, not
    only by a key that the deletion empties. Refused, with nothing changed, for someone whose name is on a
    deployment request: that history outlives them, so they stay deactivated instead."""
    _require_may_manage(actor=actor, user=user, doing="delete")
    if Deployment.objects.filter(Q(requested_by=user) | Q(proposed_by=user)).exists():
        raise Conflict(f"{user.get_username()} requested or proposed deployments, whose history keeps their name: "
                       "deactivate them instead.")
    user = user_deactivate(actor=actor, user=user, message=message)
    username, email = user.get_username(), user.email
    user.delete()
    event_record(kind=EventKind.USER_DELETED, actor=actor, message=message, before={"user": username, "email": email})
