"""A cluster's credential is sent as a bearer token to URLs its registration names: a reference may name only
environment variables with the declared prefix and files inside the secrets directory (by real path)."""
import pytest
from django.urls import reverse

from deployments.models import Cluster
from deployments.secret_refs import SecretRefError, secret_resolve
from gateway.routing import Route
from tests.factories import ClusterFactory
from workers.clients import ray_dashboard_client
from workers.targets.base import PermanentError

pytestmark = pytest.mark.django_db
CONTROL_PLANE_SECRET = "postgres://tandem:the-real-password@db/tandem"


@pytest.fixture
def secrets_dir(tmp_path, settings):
    """The configured secrets directory, with one credential in it and a file of someone else's beside it."""
    inside = tmp_path / "cluster-secrets"
    inside.mkdir()
    (inside / "ray-token").write_text("the-ray-token")
    (tmp_path / "worker-aws-credentials").write_text(CONTROL_PLANE_SECRET)
    (inside / "link-out").symlink_to(tmp_path / "worker-aws-credentials")
    settings.TANDEM_CLUSTER_SECRETS_DIR = str(inside)
    return inside


def register(api, platform_admin, secret_ref: str):
    api.force_authenticate(platform_admin)
    return api.post("/api/v1/clusters/", {"name": "evil", "kind": "ray", "secret_ref": secret_ref,
                                          "config": {"dashboard_url": "https://collector.example.com"}}, format="json")


@pytest.mark.parametrize("ref", ["env:DATABASE_URL", "env:AWS_SECRET_ACCESS_KEY", "env:TANDEM_KEY_HMAC_SECRET",
                                 "file:/proc/self/environ", "file:{outside}", "file:{inside}/../worker-aws-credentials",
                                 "file:{inside}/link-out", "file:{inside}"])
def test_registering_a_cluster_whose_secret_names_the_control_planes_own_secrets_is_refused(
        api, platform_admin, secrets_dir, monkeypatch, ref):
    monkeypatch.setenv("DATABASE_URL", CONTROL_PLANE_SECRET)
    ref = ref.format(inside=secrets_dir, outside=secrets_dir.parent / "worker-aws-credentials")
    r = register(api, platform_admin, ref)
    assert r.status_code == 400, r.json()
    message = r.json()["errors"]["secret_ref"][0]
    assert "TANDEM_CLUSTER_*" in message or str(secrets_dir) in message
    assert not Cluster.objects.filter(name="evil").exists()


@pytest.mark.parametrize("ref", ["env:TANDEM_CLUSTER_RAY_TOKEN", "file:{inside}/ray-token", ""])
def test_a_credential_set_aside_for_clusters_registers(api, platform_admin, secrets_dir, ref):
    r = register(api, platform_admin, ref.format(inside=secrets_dir))
    assert r.status_code == 201, r.json()


def test_the_admin_form_refuses_the_same(admin_client, secrets_dir):
    response = admin_client.post(reverse("admin:deployments_cluster_add"), {
        "name": "lab", "kind": "ray", "config": '{"dashboard_url": "http://127.0.0.1:8265"}',
        "secret_ref": "env:DATABASE_URL"})
    assert response.status_code == 200 and "TANDEM_CLUSTER_*" in response.content.decode()
    assert not Cluster.objects.filter(name="lab").exists()


@pytest.mark.parametrize("ref", ["env:DATABASE_URL", "file:{inside}/link-out"])
def test_a_reference_stored_before_the_rule_is_never_resolved_nor_sent(secrets_dir, monkeypatch, ref):
    """A row registered earlier (or written around the API) cannot send the value to its URL either."""
    monkeypatch.setenv("DATABASE_URL", CONTROL_PLANE_SECRET)
    ref = ref.format(inside=secrets_dir)
    cluster = ClusterFactory(kind="ray", secret_ref=ref, config={"dashboard_url": "https://collector.example.com"})
    with pytest.raises(SecretRefError) as caught:
        secret_resolve(ref)
    assert CONTROL_PLANE_SECRET not in str(caught.value) and str(secrets_dir) not in str(caught.value)
    # The worker's dashboard client and the gateway's upstream headers both refuse it.
    with pytest.raises(PermanentError, match="not allowed"):
        ray_dashboard_client(base_url=cluster.config["dashboard_url"], secret_ref=cluster.secret_ref)
    route = Route.from_row({"id": 1, "name": "d", "model_id": "m", "status": "running", "max_model_len": None,
                            "endpoint_url": "https://collector.example.com", "cluster_kind": "ray",
                            "cluster_secret_ref": ref})
    # Key holders read the gateway's message: it says the credential is not available, never where it lives.
    assert route.headers == () and not route.serving and "credential" in route.problem
    assert CONTROL_PLANE_SECRET not in route.problem and "DATABASE_URL" not in route.problem


def test_the_environment_prefix_is_a_setting(secrets_dir, settings, monkeypatch):
    monkeypatch.setenv("ACME_RAY_TOKEN", "acme")
    with pytest.raises(SecretRefError):
        secret_resolve("env:ACME_RAY_TOKEN")
    settings.TANDEM_CLUSTER_SECRET_ENV_PREFIX = "ACME_"
    assert secret_resolve("env:ACME_RAY_TOKEN") == "acme"
