"""Personal access tokens for the REST API: create (secret shown once) and revoke, each audited."""
import datetime as dt

from django.db import transaction

from deployments.models import AccessToken
from deployments.services.credentials import credential_mint, credential_revoke
from deployments.services.events import event_record


@transaction.atomic
def access_token_create(*, user, name: str, expires_at: dt.datetime | None = None) -> tuple[AccessToken, str]:
    """Returns (token, plaintext); the plaintext is never stored."""
    token, raw = credential_mint(model=AccessToken, user=user, name=name, expires_at=expires_at)
    event_record(kind="access_token_created", actor=user, after={"name": token.name, "key_id": token.key_id})
    return token, raw


@transaction.atomic
def access_token_revoke(*, user, token: AccessToken) -> None:
    """Revoke once; `user` is who revokes it: the owner, or a platform admin in Django admin."""
    if credential_revoke(row=token):
        event_record(kind="access_token_revoked", actor=user,
                     before={"key_id": token.key_id, "user": token.user.get_username()})
