"""Who a company sign-in is: the identity provider's issuer and subject (`iss`, `sub`), never an e-mail alone.

A known (issuer, subject) signs in as its account, whatever e-mail it carries today. A new one is linked to an
existing account by e-mail only when the provider says the address is verified, the account has no Tandem password
(a local account is never taken over by a sign-in) and the account has no other identity from that issuer (a
company alias handed to a new person does not bring the previous owner's account). The same holds for the account
the company directory provisioned (SCIM) under the name the provider's username claim gives, when that claim is not
an unverified e-mail: Entra ID sends no `email_verified`. Any other new identity gets an
account of its own, under a username no existing account has. Platform admins link an account on purpose with
`identity_link` (`manage.py identity_link`).
"""
import hashlib

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from deployments.errors import ActionError, NotAllowed
from deployments.event_kinds import EventKind
from deployments.models import ExternalIdentity
from deployments.permissions import is_platform_admin
from deployments.services.events import event_record
from deployments.services.people import user_create


class SignInRefused(NotAllowed):
    """A sign-in Tandem will not complete: `message` is for the person, `reason` a word for the audit trail."""

    def __init__(self, message: str, *, reason: str, account: str | None = None):
        super().__init__(message)
        self.reason = reason
        self.account = account


def email_is_verified(claims: dict) -> bool:
    """The provider vouches for the e-mail: `email_verified` true (some providers send the string "true")."""
    return claims.get("email_verified") in (True, "true")


def identity_user_for_sign_in(*, issuer: str, claims: dict):
    """The account the identity (issuer, claims' `sub`) signs in as: its own, one its verified e-mail links to, or a
    new one; raises SignInRefused. Call inside the sign-in's transaction."""
    subject = str(claims["sub"])
    identity = (ExternalIdentity.objects.select_for_update().select_related("user")
                .filter(issuer=issuer, subject=subject).first())
    if identity is not None:
        _require_active(identity.user)
        identity.last_seen_at = timezone.now()
        identity.save(update_fields=["last_seen_at"])
        return identity.user
    account, how = _account_to_link(claims)
    if account is not None:
        provider, name = settings.TANDEM_OIDC_PROVIDER_NAME, account.username
        if account.has_usable_password():
            raise SignInRefused(f"There is already a Tandem account {name} that signs in with a password. A "
                                f"platform admin can link it to your {provider} sign-in.",
                                reason="password_account", account=name)
        if account.external_identities.filter(issuer=issuer).exists():
            raise SignInRefused(f"The Tandem account {name} belongs to another {provider} identity. A platform "
                                "admin can link it to yours if it is yours.",
                                reason="alias_reused", account=name)
        _require_active(account)
        _identity_save(actor=None, user=account, issuer=issuer, subject=subject,
                       message=f"Linked at first sign-in by {how}.")
        return account
    return _user_create(issuer=issuer, subject=subject, claims=claims)


def _account_to_link(claims: dict):
    """(account, why) a new identity may link to, or (None, ""): the account its verified e-mail names, or the one
    the company directory provisioned (SCIM) under the name its trusted username claim gives (Entra ID sends no
    `email_verified`; the directory and the provider are the same company's)."""
    User = get_user_model()
    email = claims.get("email")
    if email and email_is_verified(claims):
        account = User.objects.select_for_update().filter(username=email).first()
        if account is not None:
            return account, f"the verified e-mail {email}"
    name = _trusted_username(claims)
    if name:
        account = User.objects.select_for_update().filter(username=name, scim__isnull=False).first()
        if account is not None:
            return account, f"the account the company directory provisioned as {name}"
    return None, ""


def _trusted_username(claims: dict) -> str:
    """The username claim's value when the provider vouches for it: any claim but an unverified e-mail."""
    value = str(claims.get(settings.TANDEM_OIDC_USERNAME_CLAIM) or "")
    return value if settings.TANDEM_OIDC_USERNAME_CLAIM != "email" or email_is_verified(claims) else ""


def _require_active(user) -> None:
    if not user.is_active:
        raise SignInRefused("Your Tandem account is deactivated. Ask a platform admin.", reason="inactive",
                            account=user.username)


def _new_username(*, issuer: str, subject: str, claims: dict) -> str:
    """The username claim's value (the subject without one); with a suffix only this identity has when an account
    already has that name, or when the name is an e-mail the provider does not vouch for."""
    User = get_user_model()
    value = str(claims.get(settings.TANDEM_OIDC_USERNAME_CLAIM) or "")
    trusted = bool(_trusted_username(claims))
    if not value:
        value, trusted = subject, True
    if trusted and not User.objects.filter(username__iexact=value).exists():  # as people.user_create compares
        return value
    suffix = hashlib.sha256(f"{issuer} {subject}".encode()).hexdigest()[:10]
    return f"{value[:User._meta.get_field('username').max_length - 11]}~{suffix}"


def _user_create(*, issuer: str, subject: str, claims: dict):
    user = user_create(actor=None, username=_new_username(issuer=issuer, subject=subject, claims=claims),
                       message="First sign-in through the identity provider.",
                       about={"issuer": issuer, "subject": subject})
    ExternalIdentity.objects.create(user=user, issuer=issuer, subject=subject, last_seen_at=timezone.now())
    return user


def _identity_save(*, actor, user, issuer: str, subject: str, message: str, identity=None) -> None:
    before = {"user": identity.user.username, "issuer": issuer, "subject": subject} if identity else None
    if identity is None:
        identity = ExternalIdentity(issuer=issuer, subject=subject)
    identity.user = user
    identity.save()
    event_record(kind=EventKind.IDENTITY_LINKED, actor=actor, message=message, before=before,
                 after={"user": user.username, "issuer": issuer, "subject": subject})


@transaction.atomic
def identity_link(*, actor, user, issuer: str, subject: str) -> bool:
    """Make the identity (issuer, subject) sign in as `user`, on purpose: a platform admin, or the command line
    (`actor` None). An identity that already signs in as someone else moves to `user` (the event keeps whose it
    was). Returns whether anything changed."""
    if actor is not None and not is_platform_admin(actor):
        raise NotAllowed("Only platform admins can link company identities to accounts.")
    issuer, subject = issuer.strip(), subject.strip()
    if not issuer or not subject:
        raise ActionError("Name both the issuer (the provider's `iss`) and the subject (`sub`).")
    identity = ExternalIdentity.objects.select_for_update().select_related("user").filter(
        issuer=issuer, subject=subject).first()
    if identity is not None and identity.user_id == user.pk:
        return False
    _identity_save(actor=actor, user=user, issuer=issuer, subject=subject, identity=identity,
                   message=f"Linked to {user.username} by a platform admin.")
    return True
