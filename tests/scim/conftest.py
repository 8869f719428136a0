"""A live Tandem (pytest-django's live_server: the real URLconf, middleware and PostgreSQL) and SCIM clients of it
holding a token a platform admin created: `scim_http`, the HTTP client scim2-client drives, for requests sent byte
for byte as recorded; `scim`, scim2-client itself, which discovers the service and validates what it answers."""
import httpx2
import pytest
from scim2_client.engines.httpx2 import SyncSCIMClient

from deployments.services.scim import scim_token_create

# The directory's groups as the settings map them, as at OIDC sign-in (recorded.py names the groups).
GROUP_MAP = {"Test SCIMv2": ("ml-research", "member"), "displayName": ("ml-research", "admin")}


@pytest.fixture(autouse=True)
def mapping(settings):
    settings.TANDEM_OIDC_GROUP_MAP = GROUP_MAP
    settings.TANDEM_OIDC_PLATFORM_ADMIN_GROUPS = ["platform-admins"]


@pytest.fixture
def scim_token(platform_admin) -> str:
    return scim_token_create(actor=platform_admin, name="okta")[1]


@pytest.fixture
def scim_http(live_server, scim_token):
    with httpx2.Client(base_url=f"{live_server.url}/scim/v2/", timeout=30,
                       headers={"Authorization": f"Bearer {scim_token}"}) as client:
        yield client


@pytest.fixture
def scim(scim_http):
    client = SyncSCIMClient(scim_http)
    client.discover()
    return client
