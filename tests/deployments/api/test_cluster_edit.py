"""Editing a registered cluster (`PATCH /api/v1/clusters/<name>/`): how a platform admin applies the fix the
preflight names. Name and kind stay, the config is checked as at registration, the edit is audited without the
secret reference, and the preflight runs again."""
import pytest

from deployments.catalog import INSTANCE_TYPES
from deployments.lifecycle import Status
from deployments.models import Cluster, ClusterCheck, Event
from tests.factories import ClusterFactory, DeploymentFactory

pytestmark = pytest.mark.django_db
ZONE_A, ZONE_B = "subnet-0aaa1111bbbb22223", "subnet-0ccc3333dddd44445"
CONFIG = {"region": "us-west-2", "cluster_name": "prod", "node_role_arn": "arn:aws:iam::123456789012:role/nodes",
          "subnet_ids": [ZONE_A, ZONE_B]}
URL = "/api/v1/clusters/prod-eks/"


@pytest.fixture
def eks(db):
    return ClusterFactory(name="prod-eks", kind=Cluster.Kind.EKS, config=CONFIG,
                          secret_ref="env:TANDEM_CLUSTER_PROD_TOKEN")


def test_a_platform_admin_keeps_one_zones_subnets_and_the_preflight_runs_again(api, platform_admin, eks):
    api.force_authenticate(platform_admin)
    r = api.patch(URL, {"config": {**CONFIG, "subnet_ids": [ZONE_A]}}, format="json")

    assert r.status_code == 200, r.content
    assert r.json()["config"]["subnet_ids"] == [ZONE_A] and "secret_ref" not in r.json()
    eks.refresh_from_db()
    assert (eks.name, eks.kind, eks.config["subnet_ids"]) == ("prod-eks", "eks", [ZONE_A])
    assert eks.secret_ref == "env:TANDEM_CLUSTER_PROD_TOKEN"  # not sent: kept
    event = Event.objects.get(kind="cluster_updated")
    assert event.actor == platform_admin
    assert (event.before["config"]["subnet_ids"], event.after["config"]["subnet_ids"]) == ([ZONE_A, ZONE_B], [ZONE_A])
    run = ClusterCheck.objects.get(cluster=eks)
    assert (run.status, run.requested_by) == (ClusterCheck.Status.RUNNING, platform_admin)


def test_a_new_secret_reference_is_audited_without_its_value(api, platform_admin, eks):
    api.force_authenticate(platform_admin)
    r = api.patch(URL, {"secret_ref": "env:TANDEM_CLUSTER_PROD_TOKEN_2"}, format="json")

    assert r.status_code == 200 and "secret_ref" not in r.json()
    eks.refresh_from_db()
    assert eks.secret_ref == "env:TANDEM_CLUSTER_PROD_TOKEN_2" and eks.config == CONFIG
    event = Event.objects.get(kind="cluster_updated")
    assert "TANDEM_CLUSTER_PROD_TOKEN" not in str([event.before, event.after, event.message])
    assert event.message == "Secret reference changed." and "config" not in event.after


def test_a_member_cannot_edit_a_cluster(api, member, eks):
    api.force_authenticate(member)
    r = api.patch(URL, {"config": {**CONFIG, "subnet_ids": [ZONE_A]}}, format="json")

    assert r.status_code == 403
    eks.refresh_from_db()
    assert eks.config == CONFIG
    assert not Event.objects.filter(kind="cluster_updated").exists() and not ClusterCheck.objects.exists()


@pytest.mark.parametrize("body, field, words", [
    ({"config": {**CONFIG, "subnet_ids": ["subnet-nope"]}}, "config", "subnet_ids"),
    ({"config": {**CONFIG, "dashboard_url": "http://127.0.0.1:8265"}}, "config", "Unknown setting 'dashboard_url'"),
    ({"secret_ref": "hunter2"}, "secret_ref", "not the secret itself"),
    ({"kind": "ray"}, "kind", "do not change"),
    ({"name": "renamed"}, "name", "do not change"),
])
def test_a_bad_edit_is_a_400_naming_the_field_and_nothing_changes(api, platform_admin, eks, body, field, words):
    api.force_authenticate(platform_admin)
    r = api.patch(URL, body, format="json")

    assert r.status_code == 400 and list(r.json()["errors"]) == [field]
    assert any(words in m for m in r.json()["errors"][field]), r.json()
    assert "hunter2" not in r.text
    eks.refresh_from_db()
    assert (eks.name, eks.kind, eks.config, eks.secret_ref) == (
        "prod-eks", "eks", CONFIG, "env:TANDEM_CLUSTER_PROD_TOKEN")
    assert not Event.objects.filter(kind="cluster_updated").exists() and not ClusterCheck.objects.exists()


def test_an_edit_that_changes_nothing_records_nothing(api, platform_admin, eks):
    api.force_authenticate(platform_admin)
    r = api.patch(URL, {"config": CONFIG, "secret_ref": "env:TANDEM_CLUSTER_PROD_TOKEN"}, format="json")

    assert r.status_code == 200 and r.json()["config"] == CONFIG
    assert not Event.objects.filter(kind="cluster_updated").exists() and not ClusterCheck.objects.exists()


def test_an_unknown_cluster_is_a_404(api, platform_admin):
    api.force_authenticate(platform_admin)
    assert api.patch("/api/v1/clusters/nowhere/", {"config": CONFIG}, format="json").status_code == 404


def test_the_clusters_own_prices_set_what_its_running_deployments_cost_an_hour_from_then_on(
        api, platform_admin, member, team, eks):
    running = DeploymentFactory(team=team, cluster=eks, requested_by=member, status=Status.RUNNING)
    api.force_authenticate(member)
    on_demand = api.get(f"/api/v1/deployments/{running.pk}/cost/").json()["hourly_usd"]
    assert on_demand == pytest.approx(2 * INSTANCE_TYPES["g6e.12xlarge"].hourly_usd, abs=1e-3)
    api.force_authenticate(platform_admin)
    assert api.patch(URL, {"config": {**CONFIG, "prices": {"g6e.12xlarge": 7.5}}}, format="json").status_code == 200
    api.force_authenticate(member)
    assert api.get(f"/api/v1/deployments/{running.pk}/cost/").json()["hourly_usd"] == 15.0
