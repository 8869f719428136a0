"""`manage.py identity_link --user U --issuer ISS --subject SUB`: a platform admin links an account to a company
identity on purpose (deployments.services.identities.identity_link; audited)."""
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from deployments.errors import ActionError
from deployments.services.identities import identity_link


class Command(BaseCommand):
    help = ("Make the identity provider's identity (its issuer `iss` and subject `sub`) sign in as an existing "
            "account, e.g. a local account a person kept before company sign-in, or after a provider sent no "
            "verified e-mail. An identity that signs in as another account moves to this one.")

    def add_arguments(self, parser):
        parser.add_argument("--user", required=True, help="the Tandem username")
        parser.add_argument("--issuer", required=True, help="the provider's issuer, exactly as in its ID tokens")
        parser.add_argument("--subject", required=True, help="the person's `sub` at that provider")

    def handle(self, *args, user, issuer, subject, **options):
        account = get_user_model().objects.filter(username=user).first()
        if account is None:
            raise CommandError(f"No user {user!r}.")
        try:
            changed = identity_link(actor=None, user=account, issuer=issuer, subject=subject)
        except ActionError as e:
            raise CommandError(e.message) from None
        self.stdout.write(f"{subject} at {issuer} signs in as {user}" + ("." if changed else " already."))
