"""The ray driver over real HTTP against a stand-in Ray dashboard with token authentication."""
import time

import pytest

from deployments.models import Cluster
from deployments.spec import spec_parse
from tests.factories import ClusterFactory, DeploymentFactory, TeamFactory, local_spec_input
from tests.support.ray_dashboard import RayDashboard
from workers.targets.base import PermanentError, TransientError
from workers.targets.ray import RayTarget

RAY_TOKEN = "ray-token-not-a-secret"


@pytest.fixture
def dashboard():
    server = RayDashboard(token=RAY_TOKEN, ready_after=0.2).serve()
    yield server
    server.close()


@pytest.fixture
def deployment(db, dashboard, tmp_path, monkeypatch):
    monkeypatch.setenv("TEST_RAY_TOKEN", RAY_TOKEN)
    cluster = ClusterFactory(name="local", kind=Cluster.Kind.RAY, secret_ref="env:TEST_RAY_TOKEN",
                             config={"dashboard_url": dashboard.url, "serve_url": dashboard.url})
    spec = spec_parse(local_spec_input(), target_kind="ray").to_dict()
    return DeploymentFactory(team=TeamFactory(slug="ml"), cluster=cluster, name="tiny", spec=spec)


def _apply(target, d):
    config, _ = target.desired(d)
    return target.apply(d, config)


def test_deploys_follows_to_running_and_the_endpoint_lists_the_model(dashboard, deployment):
    target = RayTarget(deployment.cluster)
    assert not target.observe(deployment).exists
    _apply(target, deployment)
    _, desired_hash = target.desired(deployment)
    observed = target.observe(deployment)
    assert (observed.serve_status, observed.applied_hash) == ("DEPLOYING", desired_hash)
    time.sleep(0.25)
    observed = target.observe(deployment)
    assert observed.serve_status == "RUNNING"
    assert target.endpoint_answers(deployment, observed).ready
    assert dashboard.http_options == {"host": "127.0.0.1", "port": int(dashboard.url.rsplit(":", 1)[1])}


def test_other_applications_on_the_cluster_survive_apply_and_teardown(dashboard, deployment):
    dashboard.put({"applications": [{"name": "someone-else", "route_prefix": "/other", "import_path": "x:app"}]})
    target = RayTarget(deployment.cluster)
    step = _apply(target, deployment)
    assert "kept 1 other application" in step.message
    assert set(dashboard.apps) == {"someone-else", "tiny"}
    assert not target.teardown(deployment).ready
    time.sleep(0.25)
    assert target.teardown(deployment).ready
    assert set(dashboard.details()["applications"]) == {"someone-else"}


def test_defaults_ray_fills_in_are_not_drift(dashboard, deployment):
    target = RayTarget(deployment.cluster)
    _apply(target, deployment)
    _, desired_hash = target.desired(deployment)
    assert target.observe(deployment).applied_hash == desired_hash


def test_a_wrong_token_is_permanent_and_5xx_is_transient(dashboard, deployment, monkeypatch):
    dashboard.inject("GET", 503)
    with pytest.raises(TransientError, match="503"):
        RayTarget(deployment.cluster).observe(deployment)
    monkeypatch.setenv("TEST_RAY_TOKEN", "wrong")
    with pytest.raises(PermanentError, match="refused Tandem's token") as caught:
        RayTarget(deployment.cluster).observe(deployment)
    assert "wrong" not in str(caught.value)


def test_failure_messages_lose_ansi_colours_and_keep_the_cause(dashboard, deployment):
    dashboard.fail_apps = True
    target = RayTarget(deployment.cluster)
    _apply(target, deployment)
    time.sleep(0.25)
    observed = target.observe(deployment)
    assert observed.serve_status == "DEPLOY_FAILED"
    assert observed.message.endswith("ValueError: max_model_len (65536) is greater than the derived max_model_len")
    assert "\x1b" not in observed.message and "Failed to update" not in observed.message
