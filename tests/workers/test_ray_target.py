"""The ray driver over real HTTP against a stand-in Ray dashboard with token authentication."""
import threading
import time

import pytest
from django.db import connection

from deployments.models import Cluster
from deployments.spec import spec_parse
from tests.factories import ClusterFactory, DeploymentFactory, TeamFactory, local_spec_input
from tests.support.ray_dashboard import TEST_TOKEN as RAY_TOKEN
from workers.targets.base import PermanentError, TransientError
from workers.targets.ray import RESTART_ENV, RayTarget



@pytest.fixture
def deployment(db, dashboard, tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_CLUSTER_TEST_RAY_TOKEN", RAY_TOKEN)
    cluster = ClusterFactory(name="local", kind=Cluster.Kind.RAY, secret_ref="env:TANDEM_CLUSTER_TEST_RAY_TOKEN",
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
    assert set(dashboard.apps) == {"someone-else", f"tdm-{deployment.pk}-tiny"}
    assert not target.teardown(deployment).ready
    time.sleep(0.25)
    assert target.teardown(deployment).ready
    assert set(dashboard.details()["applications"]) == {"someone-else"}


def test_restarting_a_stage_stamps_only_that_stage_keeps_other_applications_and_is_no_drift(dashboard, deployment):
    dashboard.put({"applications": [{"name": "someone-else", "route_prefix": "/other", "import_path": "x:app"}]})
    target = RayTarget(deployment.cluster)
    _apply(target, deployment)
    _, desired_hash = target.desired(deployment)
    assert target.restart_stage(deployment, "decode").ready
    app = dashboard.details()["applications"][f"tdm-{deployment.pk}-tiny"]
    args = app["deployed_app_config"]["args"]
    assert RESTART_ENV in args["decode_config"]["runtime_env"]["env_vars"]
    assert RESTART_ENV not in args["prefill_config"]["runtime_env"]["env_vars"]
    assert app["status"] == "DEPLOYING"  # Serve has a new version of the application to roll out
    assert "someone-else" in dashboard.details()["applications"]
    assert target.observe(deployment).applied_hash == desired_hash


def test_restarting_a_stage_of_an_application_that_is_not_there_asks_nothing(dashboard, deployment):
    step = RayTarget(deployment.cluster).restart_stage(deployment, "decode")
    assert not step.ready and "is not on the cluster" in step.message
    assert dashboard.details()["applications"] == {}


def _chat(cluster, team: str, source: str):
    spec = spec_parse(local_spec_input(model={"id": "tiny-llama", "source": source}), target_kind="ray").to_dict()
    return DeploymentFactory(team=TeamFactory(slug=team), cluster=cluster, name="chat", spec=spec)


def _running(target, d):
    wait = time.monotonic() + 5
    while (observed := target.observe(d)).serve_status != "RUNNING" and time.monotonic() < wait:
        time.sleep(0.05)
    return observed


def _sources(dashboard) -> dict[str, str]:
    """Each live application's model source, by application name."""
    return {name: app["deployed_app_config"]["args"]["decode_config"]["model_loading_config"]["model_source"]
            for name, app in dashboard.details()["applications"].items() if app["status"] != "DELETING"}


def test_two_teams_with_the_same_deployment_name_and_model_keep_their_own_applications(dashboard, deployment):
    """Team B's `chat` must neither replace team A's nor take A's traffic, and B's teardown leaves A's running."""
    a, b = _chat(deployment.cluster, "ml-a", "/models/ml-a/weights"), _chat(deployment.cluster, "ml-research",
                                                                          "/models/ml-research/weights")
    target = RayTarget(deployment.cluster)
    _apply(target, a)
    _apply(target, b)
    assert sorted(_sources(dashboard).values()) == ["/models/ml-a/weights", "/models/ml-research/weights"]
    seen_a, seen_b = _running(target, a), _running(target, b)
    assert seen_a.endpoint_url != seen_b.endpoint_url  # the gateway sends each team's traffic to its own app
    assert target.endpoint_answers(a, seen_a).ready and target.endpoint_answers(b, seen_b).ready
    while not target.teardown(b).ready:
        time.sleep(0.05)
    assert list(_sources(dashboard).values()) == ["/models/ml-a/weights"]
    assert _running(target, a).serve_status == "RUNNING"
    assert ("DELETE", "/api/serve/applications/") not in dashboard.requests  # would stop every team's apps


def test_several_deployments_share_one_cluster_each_at_its_own_route_prefix(dashboard, deployment):
    other = DeploymentFactory(team=deployment.team, cluster=deployment.cluster, name="tiny-2", spec=deployment.spec)
    target = RayTarget(deployment.cluster)
    _apply(target, deployment)
    _apply(target, other)  # Serve refuses a second application at a route prefix already taken
    for d in (deployment, other):
        observed = _running(target, d)
        assert observed.endpoint_url == f"{dashboard.url}/d/{d.pk}"
        assert target.endpoint_answers(d, observed).ready
    # Their engines may share a node: each binds NIXL's side channel in ports of its own.
    ports = [app["config"]["args"][f"{stage}_config"]["experimental_configs"]["NIXL_SIDE_CHANNEL_PORT_BASE"]
             for app in dashboard.apps.values() for stage in ("prefill", "decode")]
    assert len(set(ports)) == 4


def test_defaults_ray_fills_in_are_not_drift(dashboard, deployment):
    target = RayTarget(deployment.cluster)
    _apply(target, deployment)
    _, desired_hash = target.desired(deployment)
    assert target.observe(deployment).applied_hash == desired_hash


def test_a_wrong_token_is_permanent_and_5xx_is_transient(dashboard, deployment, monkeypatch):
    dashboard.inject("GET", 503)
    with pytest.raises(TransientError, match="503"):
        RayTarget(deployment.cluster).observe(deployment)
    monkeypatch.setenv("TANDEM_CLUSTER_TEST_RAY_TOKEN", "wrong")
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
    # Serve's recorded answer: the cause from both stages' tracebacks, not its "Failed to update ..." summary
    assert observed.message.startswith("Decode:tiny-llama and Prefill:tiny-llama: RuntimeError: Failed to create "
                                       "vLLM engine config"), observed.message
    assert "User-specified max_model_len (65536) is greater than" in observed.message
    assert "\x1b" not in observed.message and "Failed to update" not in observed.message


@pytest.mark.django_db(transaction=True)
def test_two_workers_deploying_at_once_on_one_cluster_do_not_drop_each_others_application(dashboard, deployment):
    """PUT replaces every application: two passes that each read, then PUT back what they read, would lose one."""
    other = DeploymentFactory(team=TeamFactory(slug="vision"), cluster=deployment.cluster, name="tiny",
                              spec=deployment.spec)  # the same name: only the id tells them apart
    dashboard.get_delay = 0.3

    def deploy(d):
        try:
            _apply(RayTarget(d.cluster), d)
        finally:
            connection.close()

    threads = [threading.Thread(target=deploy, args=(d,)) for d in (deployment, other)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    statuses = [app["status"] for app in dashboard.details()["applications"].values()]
    assert len(statuses) == 2 and "DELETING" not in statuses, statuses
