"""Django admin writes through the services: audited, announced and torn down like the API's writes.

Each test drives the real admin views as a signed-in superuser, over real PostgreSQL (and Redis and a running
gateway for revocation).
"""
import pytest
from django.urls import reverse

from deployments.lifecycle import Status
from deployments.models import ClusterCheck, Deployment, Event, ExternalIdentity, Membership
from deployments.services.access_tokens import access_token_create
from deployments.services.api_keys import api_key_create
from deployments.services.events import event_record
from deployments.services.identities import identity_link
from tests.factories import ClusterFactory, DeploymentFactory, MembershipFactory, UserFactory
from tests.support.processes import start_gateway
from tests.support.revocation import assert_key_refused_within


@pytest.fixture
def admin_client(client, platform_admin):
    client.force_login(platform_admin)
    return client


def team_form(team, **changes) -> dict:
    """The team change form as the admin page submits it: the team's fields and one row per member."""
    members = list(team.memberships.order_by("pk"))
    data = {"slug": team.slug, "name": team.name, "gpu_quota": team.gpu_quota,
            "memberships-TOTAL_FORMS": len(members), "memberships-INITIAL_FORMS": len(members),
            "memberships-MIN_NUM_FORMS": 0, "memberships-MAX_NUM_FORMS": 1000}
    if team.allow_self_approval:
        data["allow_self_approval"] = "on"
    for i, m in enumerate(members):
        data |= {f"memberships-{i}-id": m.pk, f"memberships-{i}-team": team.pk, f"memberships-{i}-role": m.role}
    return data | changes


def post_team(admin_client, team, **changes):
    response = admin_client.post(reverse("admin:deployments_team_change", args=[team.pk]), team_form(team, **changes))
    assert response.status_code == 302, response.content.decode()[:3000]
    return response


def run_action(admin_client, model: str, action: str, *objs):
    response = admin_client.post(reverse(f"admin:deployments_{model}_changelist"),
                                 {"action": action, "_selected_action": [o.pk for o in objs]})
    assert response.status_code == 302
    return response


def test_changing_a_quota_in_admin_is_audited(admin_client, platform_admin, team):
    post_team(admin_client, team, gpu_quota=32)

    team.refresh_from_db()
    assert team.gpu_quota == 32
    event = Event.objects.get(kind="team_updated", team=team)
    assert (event.actor, event.before, event.after) == (platform_admin, {"gpu_quota": 16}, {"gpu_quota": 32})


def test_changing_a_role_in_admin_is_audited(admin_client, platform_admin, team, member):
    post_team(admin_client, team, **{"memberships-0-role": Membership.Role.ADMIN})

    assert Membership.objects.get(team=team, user=member).role == Membership.Role.ADMIN
    event = Event.objects.get(kind="member_role_changed", team=team)
    assert event.actor == platform_admin
    assert (event.before["role"], event.after["role"]) == ("member", "admin")
    assert not Event.objects.filter(kind="team_updated").exists()  # the team's own fields did not change


def test_adding_and_removing_members_in_admin_is_audited(admin_client, team, member):
    newcomer = UserFactory()
    post_team(admin_client, team, **{"memberships-0-DELETE": "on", "memberships-TOTAL_FORMS": 2,
                                     "memberships-1-team": team.pk, "memberships-1-user": newcomer.pk,
                                     "memberships-1-role": Membership.Role.MEMBER})

    assert list(team.memberships.values_list("user", flat=True)) == [newcomer.pk]
    assert Event.objects.get(kind="member_removed", team=team).before["user"] == member.username
    assert Event.objects.get(kind="member_added", team=team).after["user"] == newcomer.username


def test_a_seat_cannot_be_handed_to_someone_else_in_admin(admin_client, team, member):
    other = UserFactory()
    post_team(admin_client, team, **{"memberships-0-user": other.pk})

    assert list(team.memberships.values_list("user", flat=True)) == [member.pk]


def test_creating_a_team_with_a_member_in_admin_is_audited(admin_client, platform_admin):
    lead = UserFactory()
    response = admin_client.post(reverse("admin:deployments_team_add"), {
        "slug": "vision", "name": "Vision", "gpu_quota": 8, "memberships-TOTAL_FORMS": 1,
        "memberships-INITIAL_FORMS": 0, "memberships-MIN_NUM_FORMS": 0, "memberships-MAX_NUM_FORMS": 1000,
        "memberships-0-user": lead.pk, "memberships-0-role": Membership.Role.ADMIN})
    assert response.status_code == 302, response.content.decode()[:3000]

    created = Event.objects.get(kind="team_created")
    assert (created.actor, created.team.slug, created.after["gpu_quota"]) == (platform_admin, "vision", 8)
    added = Event.objects.get(kind="member_added", team=created.team)
    assert added.after == {"user": lead.username, "role": "admin"}


def test_registering_a_cluster_in_admin_is_audited(admin_client, platform_admin):
    response = admin_client.post(reverse("admin:deployments_cluster_add"), {
        "name": "lab", "kind": "ray", "config": '{"dashboard_url": "http://127.0.0.1:8265"}', "secret_ref": ""})
    assert response.status_code == 302, response.content.decode()[:3000]

    event = Event.objects.get(kind="cluster_registered")
    assert (event.actor, event.after["name"], event.after["config"]) == (
        platform_admin, "lab", {"dashboard_url": "http://127.0.0.1:8265"})


def test_revoking_a_key_in_admin_is_audited(admin_client, platform_admin, team, member):
    key, _ = api_key_create(actor=member, team=team, name="ci")
    run_action(admin_client, "apikey", "revoke", key)

    key.refresh_from_db()
    assert key.revoked_at is not None
    event = Event.objects.get(kind="api_key_revoked", team=team)
    assert (event.actor, event.before["key_id"]) == (platform_admin, key.key_id)


def test_moving_a_key_to_its_team_in_admin_is_audited(admin_client, platform_admin, team, member):
    key, _ = api_key_create(actor=member, team=team, name="chat-backend")
    run_action(admin_client, "apikey", "transfer_to_team", key)

    key.refresh_from_db()
    assert key.owner is None and key.revoked_at is None
    event = Event.objects.get(kind="api_key_transferred", team=team)
    assert (event.actor, event.before["owner"], event.after["owner"]) == (platform_admin, member.username, None)


def test_revoking_an_access_token_in_admin_is_audited(admin_client, platform_admin, member):
    token, _ = access_token_create(user=member, name="laptop")
    run_action(admin_client, "accesstoken", "revoke", token)

    token.refresh_from_db()
    assert token.revoked_at is not None
    event = Event.objects.get(kind="access_token_revoked")
    assert (event.actor, event.before) == (platform_admin, {"key_id": token.key_id, "user": member.username})


def test_deleting_a_deployment_in_admin_tears_it_down(admin_client, platform_admin, team):
    d = DeploymentFactory(team=team, status=Status.RUNNING)
    run_action(admin_client, "deployment", "tear_down", d)

    d.refresh_from_db()  # the row stays, with its history
    assert d.status == Status.DELETING
    event = Event.objects.get(kind="delete_requested", deployment=d)
    assert event.actor == platform_admin
    # The admin's own delete page, which would drop the row, is not offered.
    assert admin_client.get(reverse("admin:deployments_deployment_delete", args=[d.pk])).status_code == 403


def test_spec_is_not_editable_in_admin(admin_client, team):
    d = DeploymentFactory(team=team, status=Status.RUNNING)
    url = reverse("admin:deployments_deployment_change", args=[d.pk])

    page = admin_client.get(url)
    assert page.status_code == 200
    assert 'name="spec"' not in page.content.decode()
    assert admin_client.post(url, {"spec": "{}", "status": Status.FAILED}).status_code == 403
    assert Deployment.objects.get(pk=d.pk).spec == d.spec


def test_events_cannot_be_deleted_in_admin(admin_client, team):
    event = event_record(kind="team_updated", team=team)
    assert admin_client.get(reverse("admin:deployments_event_delete", args=[event.pk])).status_code == 403
    assert Event.objects.filter(pk=event.pk).exists()


@pytest.mark.django_db(transaction=True)
def test_a_key_revoked_in_admin_is_refused_by_a_running_gateway_within_a_second(
        admin_client, team, tmp_path):
    member = MembershipFactory(team=team).user
    key, raw = api_key_create(actor=member, team=team, name="ci")
    gateway = start_gateway(tmp_path)
    try:
        assert_key_refused_within([gateway.base_url], raw, lambda: run_action(admin_client, "apikey", "revoke", key))
    finally:
        gateway.stop()


def test_editing_a_clusters_config_in_admin_goes_through_the_service(admin_client, platform_admin):
    cluster = ClusterFactory(name="lab", kind="ray", config={"dashboard_url": "http://127.0.0.1:8265"})
    url = reverse("admin:deployments_cluster_change", args=[cluster.pk])

    bad = admin_client.post(url, {"config": '{"dashboard_url": "not a url"}', "secret_ref": ""})
    assert bad.status_code == 200 and "dashboard_url" in bad.content.decode()  # the form again, with the error
    response = admin_client.post(url, {"name": "renamed", "kind": "eks",  # read-only here: ignored
                                       "config": '{"dashboard_url": "http://127.0.0.1:8266"}', "secret_ref": ""})
    assert response.status_code == 302, response.content.decode()[:3000]

    cluster.refresh_from_db()
    assert (cluster.name, cluster.kind, cluster.config) == ("lab", "ray", {"dashboard_url": "http://127.0.0.1:8266"})
    event = Event.objects.get(kind="cluster_updated")
    assert (event.actor, event.before["config"], event.after["config"]) == (
        platform_admin, {"dashboard_url": "http://127.0.0.1:8265"}, {"dashboard_url": "http://127.0.0.1:8266"})
    assert ClusterCheck.objects.filter(cluster=cluster).count() == 1  # the preflight ran again (a ray cluster: at once)


def test_identities_are_listed_in_admin_and_linked_only_by_the_service(admin_client, member):
    identity_link(actor=None, user=member, issuer="https://sso.corp.example", subject="00u1a2b3c4")
    listing = admin_client.get(reverse("admin:deployments_externalidentity_changelist")).content.decode()
    assert "00u1a2b3c4" in listing and member.username in listing
    identity = ExternalIdentity.objects.get()
    assert admin_client.get(reverse("admin:deployments_externalidentity_add")).status_code == 403
    assert admin_client.post(reverse("admin:deployments_externalidentity_delete", args=[identity.pk]),
                             {"post": "yes"}).status_code == 403
    assert ExternalIdentity.objects.filter(pk=identity.pk, user=member).exists()


def test_rollouts_are_read_only_in_admin_and_steered_through_the_services(admin_client, platform_admin, team,
                                                                          team_admin, cluster):
    from deployments.models import Rollout
    from tests.support.rollouts import rollout_at_step, rollout_started

    r = rollout_at_step(rollout_started(team=team, cluster=cluster, admin=team_admin), 0, 10)
    page = admin_client.get(reverse("admin:deployments_rollout_change", args=[r.pk])).content.decode()
    assert "shifting" in page and 'name="_save"' not in page  # shown, never edited
    assert admin_client.get(reverse("admin:deployments_rollout_add")).status_code == 403

    run_action(admin_client, "rollout", "pause", r)
    r.refresh_from_db()
    assert r.paused is True
    assert Event.objects.get(kind="rollout_paused").actor == platform_admin
    run_action(admin_client, "rollout", "resume", r)
    r.refresh_from_db()
    assert r.paused is False

    asked = admin_client.post(reverse("admin:deployments_rollout_changelist"),
                              {"action": "abort", "_selected_action": [r.pk]})
    assert asked.status_code == 200 and 'name="reason" required' in asked.content.decode()
    r.refresh_from_db()
    assert r.state == "shifting"  # nothing happens before the reason is given
    admin_client.post(reverse("admin:deployments_rollout_changelist"),
                      {"action": "abort", "_selected_action": [r.pk], "reason": "capacity review", "confirm": "Abort"})
    r.refresh_from_db()
    assert r.state == Rollout.State.ROLLING_BACK
    assert r.reason == f"Aborted by {platform_admin.username}: capacity review"
    # Rolling back: the service refuses a pause, and the page says why instead of changing it.
    refused = admin_client.post(reverse("admin:deployments_rollout_changelist"),
                                {"action": "pause", "_selected_action": [r.pk]}, follow=True).content.decode()
    assert "rolling back already" in refused
    r.refresh_from_db()
    assert (r.state, r.paused) == (Rollout.State.ROLLING_BACK, False)
