"""The reconciler end to end: a real Celery worker subprocess on real Redis and PostgreSQL drives approved
deployments onto the emulated Kubernetes cluster (with its stand-in KubeRay), through faults and a SIGKILL."""
import time
from datetime import datetime

import pytest

from deployments.conditions import condition_get, condition_set, condition_true
from deployments.lifecycle import Status
from deployments.models import Deployment, Membership
from deployments.services.actions import deployment_approve, deployment_delete, deployment_request, deployment_update
from deployments.services.quota import team_gpus_held
from deployments.services.status import deployment_observe
from tests.factories import MembershipFactory, TeamFactory, spec_input
from tests.support.processes import Worker, wait_for

pytestmark = pytest.mark.e2e
RS_WRITES = ("POST", "PUT", "PATCH", "DELETE")


@pytest.fixture
def people(transactional_db):
    team = TeamFactory(slug="ml-research", gpu_quota=16)
    member = MembershipFactory(team=team, role=Membership.Role.MEMBER).user
    admin = MembershipFactory(team=team, role=Membership.Role.ADMIN).user
    return team, member, admin


def _request_and_approve(people, cluster, name="llama", spec=None):
    team, member, admin = people
    d = deployment_request(actor=member, team=team, cluster=cluster, name=name, spec=spec or spec_input())
    return deployment_approve(actor=admin, deployment=d, generation=d.generation, comment="go")


def _status(d) -> str:
    return Deployment.objects.get(pk=d.pk).status


def _ready(d):
    d = Deployment.objects.get(pk=d.pk)
    return d if condition_true(d.conditions, "EndpointReady") else None


def _kinds(d) -> list[str]:
    return list(Deployment.objects.get(pk=d.pk).events.order_by("created_at", "id").values_list("kind", flat=True))


def _rs_writes(emulator):
    return [(m, p) for m, p in emulator.hits if m in RS_WRITES and "/rayservices" in p]


def test_approval_drives_the_deployment_to_running_with_step_events(people, k8s_cluster, emulator, worker):
    d = _request_and_approve(people, k8s_cluster)
    wait_for(lambda: _status(d) == Status.RUNNING, timeout=60, what="running")
    d.refresh_from_db()
    kinds = _kinds(d)
    for step in ("approved", "node_pools", "applied", "serve_status", "endpoint"):
        assert step in kinds, kinds
    assert kinds.index("applied") < kinds.index("endpoint")
    serve_events = list(d.events.filter(kind="serve_status").order_by("id").values_list("message", flat=True))
    assert serve_events[0].startswith("DEPLOYING") and serve_events[-1] == "RUNNING"
    assert d.endpoint_url == "http://llama-endpoint.tandem-ml-research.svc.cluster.local:8000"
    assert d.observed_generation == d.generation
    assert {c["type"] for c in d.conditions if c["status"] == "True"} >= {
        "Approved", "NodePoolsReady", "Applied", "ServeRunning"}
    # The endpoint opens to users only once the conformance suite has run (here through no gateway at all, so
    # every check fails: open, with the warning on it). The run records its result and asks for a pass; the
    # pipeline writes both conditions, within moments of the run finishing.
    d = wait_for(lambda: _ready(d), timeout=60, what="EndpointReady")
    assert d.conformance_runs.count() == 1 and not condition_true(d.conditions, "ConformancePassed")
    ready = condition_get(d.conditions, "EndpointReady")
    assert ready["reason"] == "AnsweringWithWarnings"
    run = d.conformance_runs.get()
    assert run.generation == d.generation
    opened_after = datetime.fromisoformat(ready["last_transition_time"]) - run.finished_at
    assert opened_after.total_seconds() < 2.0, opened_after
    applied = d.events.get(kind="applied")
    assert applied.duration_ms is not None and "created RayService" in applied.message
    assert len(emulator.rayservices()) == 1


def test_a_lost_conformance_run_is_started_again_so_users_are_not_held_back_for_ever(
        people, k8s_cluster, emulator, worker_env):
    from django.utils import timezone

    from workers.tasks import resync_deployments

    worker = Worker({**worker_env, "TANDEM_CONFORMANCE_OVERDUE_SECONDS": "3"}).start()
    try:
        d = _request_and_approve(people, k8s_cluster)
        d = wait_for(lambda: _ready(d), timeout=60, what="EndpointReady")
        # As if the first run's task had died before recording anything: no run, no result, users held back.
        d.conformance_runs.all().delete()
        deployment_observe(deployment_id=d.pk, conditions=condition_set(
            [c for c in d.conditions if c["type"] != "ConformancePassed"], type="EndpointReady", status=False,
            reason="ConformancePending", generation=d.generation, now=timezone.now()))
        time.sleep(4)  # past the limit since the run was asked for
        d.events.all().delete()  # history only: the pipeline decides from the row
        resync_deployments.delay()  # what beat does every 30 s
        d = wait_for(lambda: _ready(d), timeout=60, what="EndpointReady after the retry")
        assert d.events.filter(kind="conformance_requeued").count() == 1 and d.conformance_runs.count() == 1
    finally:
        worker.stop()


def test_a_worker_killed_mid_provision_leaves_one_rayservice_and_the_next_worker_converges(
        people, k8s_cluster, emulator, worker, worker_env):
    emulator.stall_rayservice_create = 30.0  # stored, but the answer never reaches the worker
    d = _request_and_approve(people, k8s_cluster)
    wait_for(emulator.stalled.is_set, timeout=60, what="the RayService create to arrive")
    worker[0].kill()
    emulator.stall_rayservice_create = 0.0
    assert _status(d) == Status.PROVISIONING
    worker.append(Worker(worker_env).start())  # the broker redelivers the unacked message to it
    wait_for(lambda: _status(d) == Status.RUNNING, timeout=60, what="running after the kill")
    assert len(emulator.rayservices()) == 1
    creates = [h for h in _rs_writes(emulator) if h[0] == "POST"]
    assert len(creates) == 1


@pytest.mark.parametrize(("method", "status", "headers"), [
    ("POST", 409, {}), ("POST", 429, {"Retry-After": "1"}), ("POST", 500, {}), ("GET", 410, {}),
])
def test_injected_api_faults_converge(people, k8s_cluster, emulator, worker, method, status, headers):
    emulator.inject(method, r"/apis/ray\.io/v1/namespaces/[^/]+/rayservices", status, count=2, headers=headers)
    d = _request_and_approve(people, k8s_cluster)
    wait_for(lambda: _status(d) == Status.RUNNING, timeout=60, what=f"running through {status}s")
    assert "transient_error" in _kinds(d)
    assert len(emulator.rayservices()) == 1


def test_missing_kuberay_fails_with_a_reason_the_user_can_act_on(people, k8s_cluster, emulator, worker):
    del emulator.resources["ray.io/v1/rayservices"]
    d = _request_and_approve(people, k8s_cluster)
    wait_for(lambda: _status(d) == Status.FAILED, timeout=60, what="failed")
    d.refresh_from_db()
    assert "KubeRay is not installed" in d.status_reason and "Install KubeRay 1.5.1" in d.status_reason


def test_a_serve_deploy_failure_fails_the_deployment(people, k8s_cluster, emulator, worker):
    emulator.fail_apps = True
    d = _request_and_approve(people, k8s_cluster)
    wait_for(lambda: _status(d) == Status.FAILED, timeout=60, what="failed")
    reason = Deployment.objects.get(pk=d.pk).status_reason
    # KubeRay's copy of what Serve said (recorded): the stages and vLLM's reason, then what to do
    assert reason.startswith("Ray Serve could not deploy the application: Decode:llama and Prefill:llama: "
                             "RuntimeError: Failed to create vLLM engine config"), reason
    assert "User-specified max_model_len (65536)" in reason and reason.endswith("fix the spec, then retry.")


def test_update_reapplies_only_what_changed_and_delete_cleans_up_and_frees_quota(people, k8s_cluster, emulator,
                                                                                worker):
    team, member, _ = people
    d = _request_and_approve(people, k8s_cluster)
    wait_for(lambda: _status(d) == Status.RUNNING, timeout=60, what="running")
    before = len([h for h in emulator.hits if h[0] in RS_WRITES])
    d = deployment_update(actor=member, deployment=d, spec=spec_input(engine={"max_model_len": 4096})).deployment
    assert d.status == Status.UPDATING
    wait_for(lambda: _status(d) == Status.RUNNING, timeout=60, what="running after the update")
    writes = [h for h in emulator.hits if h[0] in RS_WRITES][before:]
    assert writes == [("PUT", "/apis/ray.io/v1/namespaces/tandem-ml-research/rayservices/llama")]
    assert emulator.rayservices()[0]["metadata"]["generation"] == 2
    assert team_gpus_held(team=team) == 8

    deployment_delete(actor=member, deployment=d)
    wait_for(lambda: _status(d) == Status.DELETED, timeout=60, what="deleted")
    assert emulator.live_objects() == []
    assert team_gpus_held(team=team) == 0
    assert "teardown" in _kinds(d)
