"""The API's request rates (429 with Retry-After, counted in Redis across processes) and responses that carry a
new secret, which no cache may keep."""
import pytest
from rest_framework.test import APIClient

from deployments.models import AccessToken, ApiKey
from deployments.services.credentials import credential_mint

pytestmark = pytest.mark.django_db


@pytest.fixture
def rates(settings, redis_client):
    """Low rates for this test; the counts start from nothing (the Redis cache is emptied around each test)."""
    def set_rates(user: str, anon: str):
        settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"user": user, "anon": anon}}
    return set_rates


def test_a_token_holder_over_the_rate_gets_429_with_retry_after(rates, member, redis_client):
    rates(user="3/min", anon="100/min")
    _, raw = credential_mint(model=AccessToken, user=member, name="ci")
    api = APIClient(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert [api.get("/api/v1/deployments/").status_code for _ in range(3)] == [200, 200, 200]
    refused = api.get("/api/v1/deployments/")
    assert refused.status_code == 429 and 1 <= int(refused["Retry-After"]) <= 60
    assert "throttled" in refused.json()["detail"].lower()
    # The count lives in the shared Redis cache, not in this process: a fresh client is refused as well.
    assert APIClient(HTTP_AUTHORIZATION=f"Bearer {raw}").get("/api/v1/teams/").status_code == 429
    assert any(b"throttle_user" in k for k in redis_client.keys("tandem-cache*"))


def test_each_user_has_their_own_count(rates, member, team_admin, api):
    rates(user="2/min", anon="100/min")
    api.force_authenticate(member)
    assert [api.get("/api/v1/teams/").status_code for _ in range(3)] == [200, 200, 429]
    api.force_authenticate(team_admin)
    assert api.get("/api/v1/teams/").status_code == 200


# The schema is the API's one anonymous resource (and costly to build): anonymous callers are counted by address.
def test_anonymous_callers_are_limited_by_address(rates):
    rates(user="100/min", anon="2/min")
    codes = [APIClient(REMOTE_ADDR="203.0.113.7").get("/api/schema/").status_code for _ in range(3)]
    assert codes == [200, 200, 429]
    assert APIClient(REMOTE_ADDR="203.0.113.8").get("/api/schema/").status_code == 200


def test_a_forged_forwarded_for_does_not_reset_the_anonymous_count(rates):
    rates(user="100/min", anon="2/min")
    codes = [APIClient(REMOTE_ADDR="203.0.113.7", HTTP_X_FORWARDED_FOR=f"198.51.100.{i}")
             .get("/api/schema/").status_code for i in range(3)]
    assert codes == [200, 200, 429]


def no_store(response) -> bool:
    return "no-store" in response.get("Cache-Control", "")


def test_api_key_create_and_rotate_are_never_cached(api, member, team):
    api.force_authenticate(member)
    created = api.post("/api/v1/api-keys/", {"team": team.slug, "name": "bot"}, format="json")
    assert created.status_code == 201 and created.json()["secret"].startswith("tdm_") and no_store(created)
    rotated = api.post(f"/api/v1/api-keys/{ApiKey.objects.get().pk}/rotate/")
    assert rotated.status_code == 201 and rotated.json()["secret"].startswith("tdm_") and no_store(rotated)
    assert not no_store(api.get("/api/v1/api-keys/"))  # lists carry no secret


def test_access_token_create_is_never_cached(api, member):
    api.force_authenticate(member)
    created = api.post("/api/v1/tokens/", {"name": "laptop"}, format="json")
    assert created.status_code == 201 and created.json()["secret"].startswith("tdp_") and no_store(created)
