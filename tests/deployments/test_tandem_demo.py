"""`manage.py tandem_demo` (what `./tandem up` runs last) after a restart: the Ray cluster comes back empty while
the database still says the demo deployment runs. The command must not report success until a reconcile pass has
seen it serve on the new cluster. The cluster is the stand-in Ray dashboard (Serve's REST API over HTTP); the
pass runs in a real Celery worker."""
import io
import json

import pytest
from django.core.management import CommandError, call_command

from deployments.conditions import condition_get
from deployments.lifecycle import Status
from deployments.models import Cluster, Deployment, Membership
from deployments.services.pause import deployment_pause
from deployments.spec import spec_parse
from observability.models import ConformanceRun
from tests.factories import (ClusterFactory, DeploymentFactory, MembershipFactory, TeamFactory, UserFactory,
                             local_spec_input)
from tests.support.processes import Worker, free_port, wait_for, worker_environment
from tests.support.ray_dashboard import RayDashboard
from workers.pipeline import reconcile_pass
from workers.targets.ray import RayTarget

RAY_TOKEN = "ray-token-not-a-secret"
TOKEN_ENV = "TANDEM_CLUSTER_TEST_DEMO_RAY_TOKEN"
SUCCESS = "The deployment is running on this Ray cluster and checked. An API key, shown only now:"


@pytest.fixture
def dashboard():
    # Serve takes a few seconds to deploy here, longer than the command's 2 s poll: it sees the re-deploy.
    server = RayDashboard(token=RAY_TOKEN, ready_after=4.0).serve()
    yield server
    server.close()


@pytest.fixture
def demo(transactional_db, redis_client, dashboard, tmp_path, monkeypatch):
    """What the first `./tandem up` left: the demo deployment running and checked on the local Ray cluster."""
    monkeypatch.setenv(TOKEN_ENV, RAY_TOKEN)
    model = tmp_path / "models" / "tiny-llama"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 2048}))
    admin = UserFactory(username="admin", is_staff=True, is_superuser=True)
    team = TeamFactory(slug="demo", name="Demo team", gpu_quota=8, allow_self_approval=True)
    MembershipFactory(team=team, user=admin, role=Membership.Role.ADMIN)
    cluster = ClusterFactory(name="local", kind=Cluster.Kind.RAY, secret_ref=f"env:{TOKEN_ENV}", config={
        "dashboard_url": dashboard.url, "serve_url": dashboard.url,
        "model_sources": {"paths": [str(tmp_path / "models")]}})
    spec = spec_parse(local_spec_input(model={"id": "tiny-llama", "source": str(model)}), target_kind="ray").to_dict()
    d = DeploymentFactory(team=team, cluster=cluster, name="tiny-llama", spec=spec, status=Status.APPROVED,
                          requested_by=admin)
    wait_for(lambda: reconcile_pass(d.pk) is None and Deployment.objects.get(pk=d.pk).status == Status.RUNNING,
             timeout=30, what="the first run")
    ConformanceRun.objects.create(deployment=d, generation=d.generation, passed=True, started_at=d.updated_at,
                                  base_url="http://gw/v1", model="tiny-llama")
    reconcile_pass(d.pk)
    d = Deployment.objects.get(pk=d.pk)
    assert condition_get(d.conditions, "EndpointReady")["reason"] == "Answering"
    redis_client.flushdb()  # the first up's queued work went with it
    dashboard.apps.clear()  # Ctrl-C, then `./tandem up` again: the new Ray cluster starts with no application
    return d


def test_after_a_restart_up_waits_until_a_pass_sees_it_serve_on_the_new_cluster(demo, dashboard, tmp_path):
    app = RayTarget.app_name(demo)
    env = worker_environment(tmp_path, **{TOKEN_ENV: RAY_TOKEN,
                                          "TANDEM_GATEWAY_BASE_URL": f"http://127.0.0.1:{free_port()}/v1"})
    worker = Worker(env).start()  # as `./tandem up` starts it: nothing asks it for a pass but the command
    out = io.StringIO()
    try:
        call_command("tandem_demo", "--wait", "60", stdout=out)
        served_when_done = dashboard.status_of(app)
    finally:
        worker.kill()
    lines = out.getvalue().splitlines()
    assert served_when_done == "RUNNING"  # success was printed with the application back on the cluster
    assert "  It was running before this Ray cluster started; checking that it runs on it" in lines
    assert ("  It is not on this Ray cluster: it is coming back (re-deploying; a few minutes on CPU)"
            in lines[:lines.index(SUCCESS)])
    assert "api_key=\"tdm_" in out.getvalue().split(SUCCESS, 1)[1]  # the key comes after, and only then
    d = Deployment.objects.get(pk=demo.pk)
    kinds = list(d.events.order_by("id").values_list("kind", "message"))
    gone = kinds.index(("status_provisioning", "The application disappeared from the cluster; re-deploying."))
    assert ("status_running", "Serving.") in kinds[gone:]
    assert d.status == Status.RUNNING and d.serving_seen_at > demo.serving_seen_at


def test_with_no_pass_to_look_the_stored_running_status_is_not_reported_as_running(demo):
    """No worker: nothing has seen the new cluster, so the command gives up saying so rather than succeed."""
    out = io.StringIO()
    with pytest.raises(CommandError, match=r"still running \(not yet seen serving on the Ray cluster just started\) "
                                           r"after 3 s"):
        call_command("tandem_demo", "--wait", "3", stdout=out)
    assert SUCCESS not in out.getvalue()


def test_a_paused_demo_is_resumed_rather_than_waited_on(demo):
    deployment_pause(actor=demo.requested_by, deployment=demo)
    wait_for(lambda: reconcile_pass(demo.pk) is None and Deployment.objects.get(pk=demo.pk).status == Status.PAUSED,
             timeout=30, what="paused")
    with pytest.raises(CommandError, match="still provisioning after 2 s"):  # no worker here to bring it up
        call_command("tandem_demo", "--wait", "2", stdout=io.StringIO())
    d = Deployment.objects.get(pk=demo.pk)
    assert d.events.order_by("-id").values_list("kind", "message").first() == ("resumed", "Resumed by ./tandem up.")


def test_a_reading_that_it_serves_is_no_change_to_the_deployment(db):
    """The pass's `serving_seen_at` reading leaves `updated_at` (the API's ordering, the gateway's `created`)."""
    from django.utils import timezone

    from deployments.services.status import deployment_observe

    d = DeploymentFactory(status=Status.RUNNING)
    assert deployment_observe(deployment_id=d.pk, serving_seen_at=timezone.now())
    after = Deployment.objects.get(pk=d.pk)
    assert after.serving_seen_at is not None and after.updated_at == d.updated_at
