"""`manage.py tandem_bootstrap`: the admin, demo team and local cluster of `./tandem up` (idempotent)."""
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand

from deployments.local_setup import local_bootstrap, tandemctl_config_write
from tandemctl.config import config_path


class Command(BaseCommand):
    help = "Create the first admin, a demo team and the `local` Ray cluster, once."

    def add_arguments(self, parser):
        parser.add_argument("--web-url", default="http://127.0.0.1:8800")

    def handle(self, *args, web_url, **options):
        user, password = local_bootstrap(password_file=Path(settings.BASE_DIR) / "var" / "admin-password")
        self.stdout.write(f"Portal: {web_url}/  (sign in as {user} / {password}; kept in var/admin-password)")
        self.stdout.write(f"REST API docs: {web_url}/api/docs/   Django admin: {web_url}/admin/")
        path = config_path()
        if tandemctl_config_write(path=path, server=web_url):
            self.stdout.write(f"tandemctl: .venv/bin/tandemctl get  (server and an admin token written to {path})")
        else:
            self.stdout.write(f"tandemctl: .venv/bin/tandemctl get  (with your own {path}; for this Tandem set "
                              f"TANDEM_URL={web_url} and TANDEM_TOKEN, a token from the portal's Tokens page)")
