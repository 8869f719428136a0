"""Beat's resync at scale: one tick enqueues at most the configured batch (less what still waits on the queue),
unsettled deployments first, and a rotating slice of the running ones covers them all within ceil(N / batch)
ticks. Messages are read back from the Redis queue a worker would consume."""
import math

import pytest
from celery import current_app

from deployments.lifecycle import Status
from tests.factories import ClusterFactory, DeploymentFactory, TeamFactory
from tests.support.broker import queued
from workers.tasks import resync_deployments

TASK = "workers.tasks.reconcile_deployment"
BATCH = 10


@pytest.fixture
def tick(settings, redis_client):
    """One beat tick (the task's body, as a worker runs it); returns the ids it enqueued and lets the workers
    drain the queue, unless told the workers are behind."""
    settings.TANDEM_RESYNC_BATCH = BATCH

    def run(*, drained: bool = True) -> list[int]:
        before = len(queued(redis_client, task=TASK))
        resync_deployments()
        ids = [args[0] for args in queued(redis_client, task=TASK)[before:]]
        if drained:  # as the workers take them: the queue empties and each started pass clears its flag
            redis_client.delete(current_app.conf.task_default_queue, *redis_client.keys("tandem:reconcile:queued:*"))
        return ids
    return run


def _deployments(n: int, status: str) -> list[int]:
    team, cluster = TeamFactory(), ClusterFactory()
    return [DeploymentFactory(team=team, cluster=cluster, status=status).pk for _ in range(n)]


@pytest.mark.django_db
def test_each_tick_enqueues_at_most_the_batch_and_every_running_deployment_within_n_over_batch_ticks(tick):
    running = _deployments(25, Status.RUNNING)
    _deployments(3, Status.PAUSED)  # settled: never enqueued
    ticks = [tick() for _ in range(math.ceil(len(running) / BATCH))]
    assert [len(t) for t in ticks] == [10, 10, 10]  # the last tick wraps around to the first ones
    assert set().union(*ticks) == set(running)
    assert len(set(ticks[0]) & set(ticks[1])) == 0  # no deployment twice before all were looked at once


@pytest.mark.django_db
def test_unsettled_deployments_come_first_in_every_tick(tick):
    provisioning = _deployments(3, Status.PROVISIONING)
    _deployments(25, Status.RUNNING)
    for _ in range(3):
        ids = tick()
        assert len(ids) == BATCH and ids[:3] == provisioning


@pytest.mark.django_db
def test_a_tick_while_the_workers_are_behind_enqueues_only_what_they_can_catch_up_with(tick):
    _deployments(25, Status.RUNNING)
    assert len(tick(drained=False)) == BATCH
    assert tick(drained=False) == []  # the whole batch still waits: nothing more
    assert len(tick()) == 0
    assert len(tick()) == BATCH
