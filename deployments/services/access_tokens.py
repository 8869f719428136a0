"""Personal access tokens for the REST API: create (secret shown once) and revoke, each audited."""
import datetime as dt

from django.db import transaction

from deployments.event_kinds import EventKind
from deployments.models import AccessToken
from deployments.services.credentials import credential_expiry, credential_mint, credential_revoke, user_lifetimes
from deployments.services.events import event_record


@transaction.atomic
def access_token_create(*, user, name: str, expires_at: dt.datetime | None = None) -> tuple[AccessToken, str]:
    """Returns (token, plaintext); the plaintext is never stored. Its lifetime follows the strictest of the
    user's teams (credentials.user_lifetimes): their default when none is named, never beyond their longest."""
    expires_at = credential_expiry(expires_at, user_lifetimes(user))
    token, raw = credential_mint(model=AccessToken, user=user, name=name, expires_at=expires_at)
    event_record(kind=EventKind.ACCESS_TOKEN_CREATED, actor=user, after={"name": token.name, "key_id": token.key_id,
                                                                "expires_at": expires_at.isoformat()})
    return token, raw


@transaction.atomic
def access_tokens_revoke_for_person(*, actor, user, message: str) -> list[str]:
    """Revoke every live personal access token of `user` (`actor` revokes them: see below); returns their display
    strings."""
    tokens = AccessToken.objects.select_related("user").filter(user=user, revoked_at__isnull=True).order_by("pk")
    revoked = []
    for token in tokens:
        access_token_revoke(user=actor, token=token, message=message)
        revoked.append(token.display)
    return revoked


@transaction.atomic
def access_token_revoke(*, user, token: AccessToken, message: str = "") -> None:
    """Revoke once; `user` is who revokes it: the owner, a platform admin in Django admin, or the team admin who
    removes the owner from their last team."""
    if credential_revoke(row=token):
        event_record(kind=EventKind.ACCESS_TOKEN_REVOKED, actor=user, message=message,
                     before={"key_id": token.key_id, "user": token.user.get_username()})
