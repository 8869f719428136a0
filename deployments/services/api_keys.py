"""Team API keys for the gateway: create (secret shown once), revoke, rotate.

Revocation is announced on the Redis channel `KEY_EVENTS_CHANNEL` after commit, so every gateway replica
drops the key from its cache at once.
"""
import datetime as dt
import logging

from django.db import transaction
from redis.exceptions import RedisError

from controlplane.redis_client import redis_client
from deployments.credential_format import KEY_EVENTS_CHANNEL
from deployments.errors import ActionError, NotAllowed
from deployments.event_kinds import EventKind
from deployments.models import ApiKey, Deployment, Membership, Team
from deployments.services.credentials import credential_expiry, credential_mint, credential_revoke, team_lifetimes
from deployments.services.events import event_record
from deployments.services.teams import team_role

log = logging.getLogger(__name__)


def _announce(key_id: str) -> None:
    def publish():
        # Redis away must not fail a committed revocation: the gateways re-read every key from PostgreSQL and
        # refuse it within their staleness limit (TANDEM_GATEWAY_KEY_MAX_STALE_S) without the announcement.
        try:
            redis_client(timeout=2).publish(KEY_EVENTS_CHANNEL, key_id)
        except RedisError:
            log.warning("could not announce the revocation of key %s on Redis; gateways refuse it within their "
                        "staleness limit", key_id)

    transaction.on_commit(publish)


def _public(key: ApiKey) -> dict:
    return {"name": key.name, "key_id": key.key_id, "last4": key.last4}


@transaction.atomic
def api_key_create(*, actor, team: Team, name: str, all_deployments: bool = True, deployments=(),
                   expires_at: dt.datetime | None = None, requests_per_minute: int | None = None,
                   tokens_per_minute: int | None = None) -> tuple[ApiKey, str]:
    """A team member creates a key of their own; returns (key, plaintext) and the plaintext is never stored. It
    lives the team's default lifetime unless an earlier expiry is named, and never beyond the team's longest."""
    if team_role(user=actor, team=team) is None:
        raise NotAllowed(f"You are not a member of team {team.slug}.")
    expires_at = credential_expiry(expires_at, team_lifetimes(team))
    deployments = list(deployments)
    if any(d.team_id != team.pk for d in deployments):
        raise ActionError("A key can only be scoped to its own team's deployments.", field="deployments")
    if not all_deployments and not deployments:
        raise ActionError("Pick the deployments this key may call, or allow all of the team's.", field="deployments")
    key, raw = credential_mint(model=ApiKey, team=team, name=name, created_by=actor, all_deployments=all_deployments,
                               expires_at=expires_at, requests_per_minute=requests_per_minute,
                               tokens_per_minute=tokens_per_minute)
    if deployments:
        key.deployments.set(deployments)
    event_record(kind=EventKind.API_KEY_CREATED, team=team, actor=actor,
                 after=_public(key) | {"expires_at": expires_at.isoformat()})
    return key, raw


def _require_key_manager(*, actor, key: ApiKey, doing: str) -> None:
    """A member manages the keys they created; the team's admins (and platform admins) manage every key."""
    role = team_role(user=actor, team=key.team)
    if role is None:
        raise NotAllowed(f"You are not a member of team {key.team.slug}.")
    if role != Membership.Role.ADMIN and key.created_by_id != actor.pk:
        raise NotAllowed(f"Only whoever created {key.name} or an admin of team {key.team.slug} can {doing} it.")


@transaction.atomic
def api_key_revoke(*, actor, key: ApiKey, message: str = "") -> ApiKey:
    """Revoke once and tell every gateway replica. `actor=None` is Tandem itself revoking a key it owns
    (the conformance runner's service keys); a person must be its creator or an admin of its team."""
    if actor is not None:
        _require_key_manager(actor=actor, key=key, doing="revoke")
    if credential_revoke(row=key):
        event_record(kind=EventKind.API_KEY_REVOKED, team=key.team, actor=actor, message=message, before=_public(key))
        _announce(key.key_id)
    return key


@transaction.atomic
def api_keys_revoke_for_person(*, actor, user, message: str = "", team: Team | None = None) -> list[str]:
    """Revoke every live key `user` created (in `team` only, when named), each audited and announced; returns
    their display names."""
    keys = ApiKey.objects.select_related("team").filter(created_by=user, revoked_at__isnull=True)
    if team is not None:
        keys = keys.filter(team=team)
    return [api_key_revoke(actor=actor, key=k, message=message).display for k in keys]


@transaction.atomic
def api_key_rotate(*, actor, key: ApiKey) -> tuple[ApiKey, str]:
    """Revoke a key and create its replacement with the same name, scope and limits; the replacement lives the
    team's default lifetime from now (the old expiry may be past, or beyond what the team allows today)."""
    _require_key_manager(actor=actor, key=key, doing="rotate")
    new, raw = api_key_create(
        actor=actor, team=key.team, name=key.name, all_deployments=key.all_deployments,
        deployments=list(key.deployments.all()), requests_per_minute=key.requests_per_minute,
        tokens_per_minute=key.tokens_per_minute,
    )
    api_key_revoke(actor=actor, key=key)
    return new, raw


def deployments_for_scope(*, team: Team, ids) -> list[Deployment]:
    return list(Deployment.objects.filter(team=team, pk__in=ids))
