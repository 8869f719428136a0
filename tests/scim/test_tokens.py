"""SCIM tokens: a platform admin creates one in Django admin or with `manage.py tandem_scim_token` (the secret
shown once, stored hashed, audited), the directory calls /scim/v2/ with it, and a revoked one is refused."""
import io
import re

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse

from deployments.models import Event, ScimToken
from deployments.services.credentials import credential_digest

pytestmark = pytest.mark.django_db
CONFIG = "/scim/v2/ServiceProviderConfig"


def test_a_token_created_in_admin_is_shown_once_works_and_can_be_revoked(client, platform_admin, settings):
    client.force_login(platform_admin)
    page = client.post(reverse("admin:deployments_scimtoken_add"), {"name": "okta"})
    assert page.status_code == 200 and page["Cache-Control"].startswith("max-age=0")
    raw = re.search(r"tds_[A-Za-z0-9_]+", page.content.decode()).group()
    token = ScimToken.objects.get(name="okta")
    assert token.digest == credential_digest(raw, hmac_secret=settings.TANDEM_KEY_HMAC_SECRET) != raw
    event = Event.objects.get(kind="scim_token_created")
    assert (event.actor, event.after) == (platform_admin, {"name": "okta", "key_id": token.key_id})
    assert raw not in str(client.get(reverse("admin:deployments_scimtoken_changelist")).content)

    client.logout()  # the directory calls with the token alone
    assert client.get(CONFIG, HTTP_AUTHORIZATION=f"Bearer {raw}").status_code == 200
    client.force_login(platform_admin)
    client.post(reverse("admin:deployments_scimtoken_changelist"),
                {"action": "revoke", "_selected_action": [token.pk]})
    assert Event.objects.get(kind="scim_token_revoked").before["key_id"] == token.key_id
    assert client.get(CONFIG, HTTP_AUTHORIZATION=f"Bearer {raw}").status_code == 401


def test_the_command_prints_a_working_token_for_a_platform_admin_only(client, platform_admin, member):
    out = io.StringIO()
    call_command("tandem_scim_token", "entra", "--by", platform_admin.username, stdout=out, stderr=io.StringIO())
    raw = out.getvalue().strip()
    assert client.get(CONFIG, HTTP_AUTHORIZATION=f"Bearer {raw}").status_code == 200
    with pytest.raises(CommandError, match="Only platform admins"):
        call_command("tandem_scim_token", "entra", "--by", member.username, stdout=io.StringIO())
    assert ScimToken.objects.count() == 1
