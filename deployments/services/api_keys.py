"""Team API keys for the gateway: create (secret shown once), revoke, rotate.

Revocation is announced to every gateway replica after commit (services.announcements), so each drops the key
from its cache at once.
"""
import datetime as dt

from django.db import transaction
from django.utils import timezone

from deployments.errors import ActionError, NotAllowed
from deployments.event_kinds import EventKind
from deployments.models import ApiKey, Deployment, Membership, Team
from deployments.permissions import api_key_may_manage, team_require_admin, team_role
from deployments.services.announcements import key_change_announce
from deployments.services.credentials import credential_expiry, credential_mint, credential_revoke, team_lifetimes
from deployments.services.events import event_record


def _public(key: ApiKey) -> dict:
    """What the audit trail keeps of a key: never its secret or digest; `owner` None for a team key."""
    return {"name": key.name, "key_id": key.key_id, "last4": key.last4,
            "owner": key.owner.get_username() if key.owner_id else None}


@transaction.atomic
def api_key_create(*, actor, team: Team, name: str, team_key: bool = False, all_deployments: bool = True,
                   deployments=(), expires_at: dt.datetime | None = None, requests_per_minute: int | None = None,
                   tokens_per_minute: int | None = None) -> tuple[ApiKey, str]:
    """A team member creates a key of their own, or a team admin a team key (`team_key`: no owner, so it stays when
    people leave); returns (key, plaintext) and the plaintext is never stored. It lives the team's default lifetime
    unless an earlier expiry is named, and never beyond the team's longest."""
    role = team_role(user=actor, team=team)
    if role is None:
        raise NotAllowed(f"You are not a member of team {team.slug}.")
    if team_key and role != Membership.Role.ADMIN:
        raise NotAllowed(f"Only admins of team {team.slug} can create team keys; create a key of your own.")
    return _issue(actor=actor, team=team, owner=None if team_key else actor, name=name,
                  all_deployments=all_deployments, deployments=deployments, expires_at=expires_at,
                  requests_per_minute=requests_per_minute, tokens_per_minute=tokens_per_minute)


@transaction.atomic
def api_key_create_for_tandem(*, deployment: Deployment, name: str, lifetime: dt.timedelta,
                              message: str) -> tuple[ApiKey, str]:
    """A key Tandem holds itself (`is_service`: no owner, no creator) for one deployment, living `lifetime` (the
    conformance runner's, revoked with `api_key_revoke(actor=None)` when its run ends); recorded on the
    deployment's timeline with `message`."""
    return _issue(actor=None, team=deployment.team, owner=None, name=name, all_deployments=False,
                  deployments=[deployment], expires_at=timezone.now() + lifetime, requests_per_minute=None,
                  tokens_per_minute=None, is_service=True, about=deployment, message=message)


def _issue(*, actor, team: Team, owner, name: str, all_deployments: bool, deployments, expires_at,
           requests_per_minute, tokens_per_minute, is_service: bool = False, about: Deployment | None = None,
           message: str = "") -> tuple[ApiKey, str]:
    """Mint a key for `owner` (None: the team, or Tandem for a service key) once the caller has checked that
    `actor` may; the event goes on `about`'s timeline when the key is for one deployment's sake."""
    expires_at = credential_expiry(expires_at, team_lifetimes(team))
    deployments = list(deployments)
    if any(d.team_id != team.pk for d in deployments):
        raise ActionError("A key can only be scoped to its own team's deployments.", field="deployments")
    if not all_deployments and not deployments:
        raise ActionError("Pick the deployments this key may call, or allow all of the team's.", field="deployments")
    key, raw = credential_mint(model=ApiKey, team=team, name=name, created_by=actor, owner=owner,
                               is_service=is_service, all_deployments=all_deployments, expires_at=expires_at,
                               requests_per_minute=requests_per_minute, tokens_per_minute=tokens_per_minute)
    if deployments:
        key.deployments.set(deployments)
    event_record(kind=EventKind.API_KEY_CREATED, team=team, deployment=about, actor=actor, message=message,
                 after=_public(key) | {"expires_at": expires_at.isoformat()})
    return key, raw


def _require_key_manager(*, actor, key: ApiKey, doing: str) -> None:
    """Who manages a key (deployments.permissions.api_key_may_manage), or NotAllowed naming who may."""
    role = team_role(user=actor, team=key.team)
    if role is None:
        raise NotAllowed(f"You are not a member of team {key.team.slug}.")
    if not api_key_may_manage(user=actor, key=key, team_admin=role == Membership.Role.ADMIN):
        raise NotAllowed(f"Only the owner of {key.name} or an admin of team {key.team.slug} can {doing} it.")


@transaction.atomic
def api_key_revoke(*, actor, key: ApiKey, message: str = "") -> ApiKey:
    """Revoke once and tell every gateway replica. `actor=None` is Tandem itself revoking a key it owns
    (the conformance runner's service keys) or a leaver's; a person must be its owner or an admin of its team."""
    if actor is not None:
        _require_key_manager(actor=actor, key=key, doing="revoke")
    if credential_revoke(row=key):
        event_record(kind=EventKind.API_KEY_REVOKED, team=key.team, actor=actor, message=message, before=_public(key))
        key_change_announce(key_id=key.key_id)
    return key


@transaction.atomic
def api_keys_revoke_for_person(*, actor, user, message: str, team: Team | None = None) -> list[str]:
    """Revoke the live keys `user` owns (in `team` only, when given), each announced to every gateway replica;
    returns their display strings. Team keys, those moved to the team included, stay."""
    # Locked: a key a team admin moves to the team at this moment is either moved first (and no longer matches
    # here) or revoked first (and the move is refused), never revoked after it was moved.
    keys = ApiKey.objects.select_for_update(no_key=True, of=("self",)).select_related("team", "owner").filter(
        owner=user, revoked_at__isnull=True)
    if team is not None:
        keys = keys.filter(team=team)
    return [api_key_revoke(actor=actor, key=key, message=message).display for key in keys.order_by("pk")]


@transaction.atomic
def api_key_transfer_to_team(*, actor, key: ApiKey, message: str = "") -> ApiKey:
    """A team admin makes a person's key a team key, so it stays when that person leaves (a service that runs on
    it keeps working). Audited; a team key stays as it is."""
    team_require_admin(user=actor, team=key.team)
    key = ApiKey.objects.select_for_update(no_key=True, of=("self",)).select_related("team", "owner").get(pk=key.pk)
    if key.revoked_at:
        raise ActionError(f"{key.name} is revoked; create a team key instead.")
    if key.owner_id is None:
        return key
    before = _public(key)
    key.owner = None
    key.save(update_fields=["owner"])
    event_record(kind=EventKind.API_KEY_TRANSFERRED, team=key.team, actor=actor, message=message, before=before,
                 after=_public(key))
    return key


@transaction.atomic
def api_key_rotate(*, actor, key: ApiKey) -> tuple[ApiKey, str]:
    """Revoke a key and create its replacement with the same name, owner, scope and limits; the replacement lives
    the team's default lifetime from now (the old expiry may be past, or beyond what the team allows today)."""
    _require_key_manager(actor=actor, key=key, doing="rotate")
    new, raw = _issue(
        actor=actor, team=key.team, owner=key.owner, name=key.name, all_deployments=key.all_deployments,
        deployments=list(key.deployments.all()), expires_at=None, requests_per_minute=key.requests_per_minute,
        tokens_per_minute=key.tokens_per_minute,
    )
    api_key_revoke(actor=actor, key=key)
    return new, raw


def deployments_for_scope(*, team: Team, ids) -> list[Deployment]:
    return list(Deployment.objects.filter(team=team, pk__in=ids))
