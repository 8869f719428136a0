"""The acceptance test of a leaver: a member with a gateway key, a personal API token and a portal session is
deactivated by the directory (Okta's PATCH, as recorded); a running gateway process refuses the key within a
second, the API refuses the token, the portal session is over at the next request, and the audit trail shows each."""
from deployments.models import Event
from deployments.services.access_tokens import access_token_create
from deployments.services.api_keys import api_key_create
from deployments.services.scim import DIRECTORY
from tests.factories import MembershipFactory
from tests.scim import recorded
from tests.support.processes import start_gateway
from tests.support.revocation import assert_key_refused_within


def test_a_user_deactivated_through_scim_loses_key_token_and_session_at_once(scim_http, team, client, api,
                                                                              tmp_path):
    member = MembershipFactory(team=team).user
    key, raw_key = api_key_create(actor=member, team=team, name="ci")
    token, raw_token = access_token_create(user=member, name="laptop")
    client.force_login(member)
    assert client.get("/deployments/").status_code == 200
    assert api.get("/api/v1/teams/", HTTP_AUTHORIZATION=f"Bearer {raw_token}").status_code == 200

    gateway = start_gateway(tmp_path)
    try:
        assert_key_refused_within([gateway.base_url], raw_key, lambda: scim_http.patch(
            f"Users/{member.pk}", json=recorded.OKTA_DEACTIVATE_USER).raise_for_status())
    finally:
        gateway.stop()

    refused = api.get("/api/v1/teams/", HTTP_AUTHORIZATION=f"Bearer {raw_token}")
    assert refused.status_code == 401
    assert client.get("/deployments/")["Location"].startswith("/accounts/login/")

    deactivated = Event.objects.get(kind="user_deactivated")
    assert (deactivated.actor, deactivated.message) == (None, DIRECTORY)
    assert deactivated.before == {"user": member.username, "teams": [team.slug]}
    assert deactivated.after["sessions_ended"] == 1
    assert Event.objects.get(kind="member_removed").before == {"user": member.username, "role": "member"}
    assert Event.objects.get(kind="api_key_revoked").before["key_id"] == key.key_id
    assert Event.objects.get(kind="access_token_revoked").before == {"key_id": token.key_id,
                                                                     "user": member.username}
