"""`manage.py tandem_scim_token NAME --by ADMIN`: a token for the company directory to call /scim/v2/ with."""
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from deployments.errors import ActionError
from deployments.services.scim import scim_token_create


class Command(BaseCommand):
    help = "Create a SCIM token (shown once) for an identity provider, as the platform admin named by --by."

    def add_arguments(self, parser):
        parser.add_argument("name", help="What the token is for, e.g. okta")
        parser.add_argument("--by", required=True, help="Username of the platform admin creating it (audited)")

    def handle(self, *args, name, by, **options):
        actor = get_user_model().objects.filter(username=by, is_active=True).first()
        if actor is None:
            raise CommandError(f"No active user {by!r}.")
        try:
            _, raw = scim_token_create(actor=actor, name=name)
        except ActionError as e:
            raise CommandError(e.message) from e
        self.stderr.write("The SCIM token, shown this once (Tandem keeps only its hash):")
        self.stdout.write(raw)
