"""Minting and checking secrets shown once: API keys and personal access tokens (format in credential_format)."""
from django.conf import settings
from django.utils import timezone

from deployments.credential_format import (
    credential_check_key,
    credential_check_ok,
    credential_digest,
    credential_matches,
    credential_new,
    credential_split,
)


def credential_mint(*, model, **fields):
    """Create a credential row; returns (row, plaintext). The plaintext exists only in this return value."""
    key_id, raw = credential_new(model.PREFIX, hmac_secret=settings.TANDEM_KEY_HMAC_SECRET)
    digest = credential_digest(raw, hmac_secret=settings.TANDEM_KEY_HMAC_SECRET)
    row = model.objects.create(key_id=key_id, digest=digest, last4=raw[-4:], **fields)
    return row, raw


def credential_check(*, model, raw: str):
    """The live credential this secret belongs to, or None (unknown, wrong, revoked or expired). A secret whose
    check segment is wrong is refused without a query."""
    parsed = credential_split(raw, model.PREFIX)
    if parsed is None:
        return None
    key_id, checked = parsed
    if checked and not credential_check_ok(raw, check_key=credential_check_key(settings.TANDEM_KEY_HMAC_SECRET)):
        return None
    row = model.objects.filter(key_id=key_id).first()
    if row is None or not credential_matches(raw, row.digest, hmac_secret=settings.TANDEM_KEY_HMAC_SECRET):
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
