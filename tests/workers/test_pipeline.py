"""Reconcile passes run in-process against the emulated Kubernetes cluster: the pipeline is the one writer of the
conformance conditions, and what it decides (backoff, re-running a lost conformance run) comes from the
deployment row, not from the event log."""
import time

import psycopg
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from deployments.conditions import condition_get
from deployments.lifecycle import Status
from deployments.models import Deployment
from deployments.services.status import RECONCILE_TASK
from observability.conformance.runner import conformance_run_for_deployment
from observability.models import ConformanceRun
from tests.factories import DeploymentFactory, MembershipFactory, TeamFactory
from tests.observability.mock_openai import MODEL, MockUpstream
from tests.support import processes
from tests.support.broker import queued
from tests.support.processes import wait_for
from tests.workers.conftest import gpu_spec
from workers.pipeline import reconcile_pass
from workers.reconcile import LOCK_BUSY_RETRY_SECONDS, LOCK_CLASS, reconcile
from workers.tasks import reconcile_deployment

RAYSERVICES = r"/apis/ray\.io/v1/namespaces/[^/]+/rayservices"
RUN_TASK = "observability.tasks.run_conformance"


def _row(d) -> Deployment:
    return Deployment.objects.get(pk=d.pk)


def _ready(d) -> dict:
    return condition_get(_row(d).conditions, "EndpointReady") or {}


@pytest.fixture
def approved(k8s_cluster, redis_client):
    """An approved deployment of the mock upstream's model, on the emulated cluster."""
    team = TeamFactory(slug="ml-research", gpu_quota=64)
    spec = gpu_spec(model={"id": MODEL, "source": f"s3://models/{MODEL}"})
    return DeploymentFactory(team=team, cluster=k8s_cluster, name="llama", spec=spec, status=Status.APPROVED)


@pytest.fixture
def serving(approved, redis_client):
    """Passes until Serve answers: running, its first conformance run asked for, users waiting on it."""
    wait_for(lambda: reconcile_pass(approved.pk) is None and _row(approved).status == Status.RUNNING,
             timeout=30, what="running")
    assert _ready(approved)["reason"] == "ConformancePending"
    assert queued(redis_client, task=RUN_TASK) == [[approved.pk]]
    return _row(approved)


@pytest.mark.parametrize(("faults", "reason"), [((), "Answering"), (["unknown_model_detail"], "AnsweringWithWarnings")])
def test_the_pass_a_recorded_run_asks_for_opens_the_endpoint(serving, redis_client, faults, reason, api,
                                                            django_capture_on_commit_callbacks):
    d = serving
    with MockUpstream(faults) as m, django_capture_on_commit_callbacks(execute=True):
        conformance_run_for_deployment(deployment_id=d.pk, gateway_base_url=m.base_url)
    assert _ready(d)["reason"] == "ConformancePending"  # recorded, not written: users still wait
    [args] = queued(redis_client, task=RECONCILE_TASK)
    reconcile_deployment(*args)  # what the worker does with that message

    d = _row(d)
    ready, checked = condition_get(d.conditions, "EndpointReady"), condition_get(d.conditions, "ConformancePassed")
    assert (ready["status"], ready["reason"]) == ("True", reason)
    assert checked["observed_generation"] == d.generation
    assert checked["status"] == ("True" if not faults else "False")
    if faults:
        assert "error_unknown_model" in ready["message"] and "error_unknown_model" in checked["message"]
    api.force_authenticate(MembershipFactory(team=d.team).user)
    assert api.get(f"/api/v1/deployments/{d.pk}/conformance/").json()["condition"]["status"] == checked["status"]


def test_a_run_of_an_earlier_generation_does_not_open_the_endpoint(serving):
    ConformanceRun.objects.create(deployment=serving, generation=serving.generation - 1, passed=True,
                                  started_at=serving.updated_at, base_url="http://gw/v1", model=MODEL)
    reconcile_pass(serving.pk)
    assert _ready(serving)["reason"] == "ConformancePending"
    assert condition_get(_row(serving).conditions, "ConformancePassed") is None


def test_backoff_grows_with_transient_errors_in_a_row_and_resets_after_a_clean_pass(approved, emulator):
    def bounds(attempt):  # jittered between half and all of 2^attempt seconds
        return 2.0 ** attempt / 2, 2.0 ** attempt

    emulator.inject("POST", RAYSERVICES, 500, count=3)
    for attempt in range(3):
        low, high = bounds(attempt)
        assert low <= reconcile_pass(approved.pk) <= high
        assert _row(approved).transient_errors == attempt + 1
    # The count is kept on the row: the event log is history, and deleting it changes nothing.
    Deployment.objects.filter(pk=approved.pk).update(transient_errors=5)
    approved.events.all().delete()
    emulator.inject("POST", RAYSERVICES, 500, count=1)
    assert 16.0 <= reconcile_pass(approved.pk) <= 32.0
    assert _row(approved).transient_errors == 6

    reconcile_pass(approved.pk)  # the create goes through
    assert _row(approved).transient_errors == 0
    emulator.inject("GET", RAYSERVICES, 500, count=1)
    assert 0.5 <= reconcile_pass(approved.pk) <= 1.0


def test_a_lost_first_run_is_asked_for_again_once_per_overdue_period_decided_from_the_row(
        serving, redis_client, settings):
    settings.TANDEM_CONFORMANCE_OVERDUE_SECONDS = 1
    reconcile_pass(serving.pk)
    assert len(queued(redis_client, task=RUN_TASK)) == 1  # asked for just now: not overdue

    time.sleep(1.2)
    serving.events.all().delete()  # history only: the decision must not depend on it
    reconcile_pass(serving.pk)
    assert queued(redis_client, task=RUN_TASK) == [[serving.pk]] * 2
    assert serving.events.filter(kind="conformance_requeued").count() == 1

    serving.events.all().delete()
    reconcile_pass(serving.pk)  # within the new period
    assert len(queued(redis_client, task=RUN_TASK)) == 2
    time.sleep(1.2)
    reconcile_pass(serving.pk)
    assert len(queued(redis_client, task=RUN_TASK)) == 3
    assert _ready(serving)["reason"] == "ConformancePending"


def test_a_pass_asked_for_while_another_holds_the_lock_comes_back_shortly(approved, emulator, redis_client):
    # The holder's chain has its next pass a minute away (the cluster asked to retry after 60 s).
    emulator.inject("POST", RAYSERVICES, 429, count=1, headers={"Retry-After": "60"})
    assert reconcile(approved.pk) >= 60
    with psycopg.connect(processes.test_database_url(), autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s, %s)", [LOCK_CLASS, approved.pk])
        # e.g. the pass a finished conformance run asks for: not dropped in favour of the holder's chain.
        assert reconcile(approved.pk) == LOCK_BUSY_RETRY_SECONDS
        assert reconcile(approved.pk) is None  # a second message in the same window rides on that retry


def test_the_domain_asks_for_passes_by_the_name_the_reconcile_task_registers_under():
    assert reconcile_deployment.name == RECONCILE_TASK


@pytest.fixture
def answering(serving):
    """Running, its conformance run passed and the endpoint open: a steady deployment."""
    ConformanceRun.objects.create(deployment=serving, generation=serving.generation, passed=True,
                                  started_at=serving.updated_at, base_url="http://gw/v1", model=MODEL)
    reconcile_pass(serving.pk)
    assert _ready(serving)["reason"] == "Answering"
    return _row(serving)


def _writes(queries) -> list[str]:
    return [q["sql"] for q in queries if q["sql"].split(None, 1)[0].upper() in ("INSERT", "UPDATE", "DELETE")]


def test_a_pass_over_an_unchanged_running_deployment_writes_nothing(answering):
    with CaptureQueriesContext(connection) as queries:
        assert reconcile_pass(answering.pk) is None
    assert _writes(queries.captured_queries) == []
    assert _row(answering).updated_at == answering.updated_at


def test_what_a_step_last_said_is_kept_on_the_row_so_a_pruned_event_log_brings_no_repeats(answering):
    answering.events.all().delete()  # history only: pruning it must not make passes say it all again
    reconcile_pass(answering.pk)
    assert list(answering.events.values_list("kind", flat=True)) == []
