"""Minting and checking secrets shown once: API keys and personal access tokens (format in credential_format),
and how long a new one may live."""
import datetime as dt
from dataclasses import dataclass

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
from deployments.errors import ActionError
from deployments.models import Team


@dataclass(frozen=True)
class Lifetimes:
    """A default and a longest lifetime in days, and whose rule they are (named in refusals)."""

    default_days: int
    max_days: int
    source: str


def team_lifetimes(team) -> Lifetimes:
    """A team's keys follow the team's own settings."""
    return Lifetimes(team.credential_default_days, team.credential_max_days, f"Team {team.slug}")


def user_lifetimes(user) -> Lifetimes:
    """A personal token reaches every team of its owner, so the strictest of those teams applies (the shortest
    longest lifetime, and the shortest default); a user in no team gets the platform's settings."""
    teams = list(Team.objects.filter(memberships__user=user).order_by("credential_max_days", "slug"))
    if not teams:
        return Lifetimes(settings.TANDEM_CREDENTIAL_DEFAULT_DAYS, settings.TANDEM_CREDENTIAL_MAX_DAYS, "Tandem")
    longest = teams[0].credential_max_days
    default = min(min(t.credential_default_days for t in teams), longest)
    return Lifetimes(default, longest, f"Team {teams[0].slug}")


def credential_expiry(expires_at: dt.datetime | None, rule: Lifetimes) -> dt.datetime:
    """The expiry a new credential gets: the rule's default when none is named; refused when past or beyond the
    longest lifetime."""
    now = timezone.now()
    if expires_at is None:
        return now + dt.timedelta(days=rule.default_days)
    if expires_at <= now:
        raise ActionError("The expiry must be in the future.", field="expires_at")
    latest = now + dt.timedelta(days=rule.max_days)
    if expires_at > latest:
        raise ActionError(f"{rule.source} lets keys and tokens live at most {rule.max_days} days (until "
                          f"{latest:%Y-%m-%d}); pick an earlier expiry.", field="expires_at")
    return expires_at


def credential_mint(*, model, **fields):
    """Create a credential row; returns (row, plaintext). The plaintext exists only in this return value."""
    key_id, raw = credential_new(model.PREFIX, hmac_secret=settings.TANDEM_KEY_HMAC_SECRET)
    digest = credential_digest(raw, hmac_secret=settings.TANDEM_KEY_HMAC_SECRET)
    row = model.objects.create(key_id=key_id, digest=digest, last4=raw[-4:], **fields)
    return row, raw


def credential_check(*, model, raw: str, related: tuple[str, ...] = ()):
    """The live credential this secret belongs to, or None (unknown, wrong, revoked or expired), with `related`
    joined in (the caller's next read, in the same query). A secret whose check segment is wrong is refused without
    a query."""
    parsed = credential_split(raw, model.PREFIX)
    if parsed is None:
        return None
    key_id, checked = parsed
    if checked and not credential_check_ok(raw, check_key=credential_check_key(settings.TANDEM_KEY_HMAC_SECRET)):
        return None
    rows = model.objects.select_related(*related) if related else model.objects  # no names would join every FK
    row = rows.filter(key_id=key_id).first()
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
