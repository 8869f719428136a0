"""Reconcile requests coalesce: while a pass of a deployment waits on the queue, more requests for it send no more
messages (that pass reads the row when it starts); once a pass has started, a request queues exactly one more, since
the running pass may have read the row before the change. Real Redis (the broker's queue read back) and a real
Celery worker."""
import pytest

from deployments.lifecycle import Status
from deployments.models import Deployment
from deployments.services.status import deployment_reconcile_request
from tests.factories import DeploymentFactory
from tests.support.broker import queued
from tests.support.processes import Worker, wait_for

TASK = "workers.tasks.reconcile_deployment"


def _request(django_capture_on_commit_callbacks, deployment_id: int, times: int) -> None:
    for _ in range(times):
        with django_capture_on_commit_callbacks(execute=True):  # as each request's transaction commits
            deployment_reconcile_request(deployment_id=deployment_id)


@pytest.mark.django_db
def test_requests_for_a_deployment_already_queued_send_one_message(redis_client, cluster,
                                                                   django_capture_on_commit_callbacks):
    one, other = DeploymentFactory(cluster=cluster), DeploymentFactory(cluster=cluster)
    _request(django_capture_on_commit_callbacks, one.pk, 5)
    _request(django_capture_on_commit_callbacks, other.pk, 2)
    assert queued(redis_client, task=TASK) == [[one.pk], [other.pk]]


@pytest.mark.e2e
def test_a_request_during_a_running_pass_queues_exactly_one_more(k8s_deployment, emulator, worker_env, redis_client,
                                                                 django_capture_on_commit_callbacks):
    d = k8s_deployment
    Deployment.objects.filter(pk=d.pk).update(status=Status.RUNNING)  # a pass looks at the cluster first
    held = emulator.hold("GET", r"^/api/v1/namespaces/tandem-ml-research$", seconds=4)  # and waits there
    worker = Worker(worker_env, concurrency=1).start()
    try:
        _request(django_capture_on_commit_callbacks, d.pk, 1)
        wait_for(held.started.is_set, timeout=30, what="the pass to read the cluster")
        assert queued(redis_client, task=TASK) == []  # the worker took the one message
        _request(django_capture_on_commit_callbacks, d.pk, 3)
        assert not held.done.is_set(), "the pass finished before the requests were made"
        assert queued(redis_client, task=TASK) == [[d.pk]]
    finally:
        worker.stop()
