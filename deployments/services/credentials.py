"""Minting and checking secrets shown once: API keys and personal access tokens.

A secret is `<prefix>_<key_id>_<random>`; only HMAC-SHA256(server secret, whole string) is stored.
"""
import hashlib
import hmac
import secrets

from django.conf import settings
from django.utils import timezone


def credential_digest(raw: str) -> str:
    return hmac.new(settings.TANDEM_KEY_HMAC_SECRET.encode(), raw.encode(), hashlib.sha256).hexdigest()


def credential_split(raw: str, prefix: str) -> str | None:
    """The key id of a well-formed secret with this prefix, else None."""
    parts = raw.split("_") if isinstance(raw, str) else []
    if len(parts) != 3 or parts[0] != prefix or not parts[1] or len(parts[2]) < 32:
        return None
    return parts[1]


def credential_mint(*, model, **fields):
    """Create a credential row; returns (row, plaintext). The plaintext exists only in this return value."""
    key_id = secrets.token_hex(6)
    raw = f"{model.PREFIX}_{key_id}_{secrets.token_urlsafe(32).replace('_', 'x')}"
    row = model.objects.create(key_id=key_id, digest=credential_digest(raw), last4=raw[-4:], **fields)
    return row, raw


def credential_check(*, model, raw: str):
    """The live credential this secret belongs to, or None (unknown, wrong, revoked or expired)."""
    key_id = credential_split(raw, model.PREFIX)
    if key_id is None:
        return None
    row = model.objects.filter(key_id=key_id).first()
    if row is None or not hmac.compare_digest(row.digest, credential_digest(raw)):
        return None
    now = timezone.now()
    if row.revoked_at or (row.expires_at and row.expires_at <= now):
        return None
    return row


def credential_revoke(*, row) -> bool:
    """Revoke once; returns False when it already was."""
    if row.revoked_at:
        return False
    row.revoked_at = timezone.now()
    row.save(update_fields=["revoked_at"])
    return True
