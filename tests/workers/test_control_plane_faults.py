"""Faults of the control plane itself, injected for real against real Celery workers (prefork, as production runs
them), real PostgreSQL and Redis and the emulated Kubernetes cluster: a reconcile lock lost with its connection,
a hung worker, two workers on the same deployments, a pool child killed mid-task."""
import os
import signal
from collections import Counter

import pytest
from django.db import connection

from deployments.lifecycle import Status
from deployments.models import Deployment, Membership
from deployments.services.actions import deployment_approve, deployment_delete, deployment_request, deployment_retry
from tests.factories import MembershipFactory, TeamFactory, spec_input
from tests.support.processes import Worker, wait_for, wait_for_idle_workers
from workers.reconcile import LOCK_CLASS

pytestmark = pytest.mark.e2e
NAMESPACE_READ = r"^/api/v1/namespaces/tandem-ml-research$"


@pytest.fixture
def people(transactional_db):
    team = TeamFactory(slug="ml-research", gpu_quota=400)
    member = MembershipFactory(team=team, role=Membership.Role.MEMBER).user
    admin = MembershipFactory(team=team, role=Membership.Role.ADMIN).user
    return team, member, admin


@pytest.fixture
def workers(worker_env):
    """Start workers with `start(concurrency=..., **env)`; each is killed at the end of the test."""
    started = []

    def start(concurrency: int = 2, **env) -> Worker:
        started.append(Worker({**worker_env, **env}, concurrency=concurrency))
        return started[-1].start()

    try:
        yield start
    finally:
        for w in started:
            w.kill()


def _approved(people, cluster, name="llama"):
    team, member, admin = people
    d = deployment_request(actor=member, team=team, cluster=cluster, name=name, spec=spec_input())
    return deployment_approve(actor=admin, deployment=d, generation=d.generation)


def _row(d) -> Deployment:
    return Deployment.objects.get(pk=d.pk)


def _lock_holder(d) -> int | None:
    """The PostgreSQL backend that holds the deployment's reconcile lock."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = %s AND objid = %s "
                       "AND objsubid = 2 AND granted", [LOCK_CLASS, d.pk])
        row = cursor.fetchone()
    return row[0] if row else None


def _rayservice_writes(emulator) -> list[tuple[str, str]]:
    return [(m, p) for m, p in emulator.hits if m in ("POST", "PUT", "PATCH") and "/rayservices" in p]


def test_a_pass_that_lost_its_lock_stops_before_touching_the_cluster(people, k8s_cluster, emulator, workers,
                                                                    worker_env, redis_client):
    """The lock dies with its connection (as in a PostgreSQL restart) while a pass waits on the cluster; the user
    deletes the deployment and another pass tears it down. The old pass wakes up with a stale view (provisioning,
    nothing applied): without the fence it would create the RayService after the teardown, left behind for ever."""
    _, member, _ = people
    workers(concurrency=2)
    held = emulator.hold("GET", NAMESPACE_READ, seconds=3)  # the first pass's observe waits on the cluster
    d = _approved(people, k8s_cluster)
    wait_for(held.started.is_set, timeout=20, what="the first pass to read the cluster")
    holder = wait_for(lambda: _lock_holder(d), what="the pass to hold the lock")
    with connection.cursor() as cursor:  # what a restart does to every connection
        cursor.execute("SELECT pg_terminate_backend(%s)", [holder])
    deployment_delete(actor=member, deployment=d)
    wait_for(lambda: _row(d).status == Status.DELETED, timeout=20, what="deleted")
    wait_for(held.done.is_set, timeout=10, what="the old pass to get its answer")
    stopped = lambda: "was lost" in open(worker_env["TANDEM_WORKER_LOG"]).read()  # noqa: E731
    wait_for(lambda: stopped() or emulator.live_objects(), timeout=10, what="the old pass to stop or apply")
    wait_for_idle_workers(redis_client)  # every pass has ended: what the old pass would send, it has sent
    assert emulator.live_objects() == [], "a pass without its lock created objects after the teardown"
    assert stopped()


def test_a_hung_worker_holding_a_deployment_does_not_hold_it_for_ever(people, k8s_cluster, emulator, workers):
    """SIGSTOP the worker whose pass holds the deployment: its connection, so its lock, stays. Another worker's
    passes find it busy; once the holder has sent no query, and the status has not changed, for the stuck limit,
    the deployment fails saying so.
    Once the hung worker is gone, a retry converges to one RayService."""
    _, member, _ = people
    hung = workers(concurrency=1, TANDEM_STUCK_AFTER_SECONDS="2")
    held = emulator.hold("GET", NAMESPACE_READ, seconds=8)
    d = _approved(people, k8s_cluster)
    wait_for(held.started.is_set, timeout=20, what="the pass to read the cluster")
    os.killpg(hung.proc.pid, signal.SIGSTOP)
    workers(concurrency=1, TANDEM_STUCK_AFTER_SECONDS="2")
    failed = wait_for(lambda: (r := _row(d)).status == Status.FAILED and r, timeout=20, what="failed as stuck")
    assert "Stuck for" in failed.status_reason and "hung worker" in failed.status_reason, failed.status_reason
    started = failed.events.get(kind="status_provisioning").created_at
    print(f"hung worker reported after {(failed.status_changed_at - started).total_seconds():.1f} s "
          "(stuck limit 2 s)")
    hung.kill()  # its connection closes, and the lock with it
    deployment_retry(actor=member, deployment=d)
    wait_for(lambda: _row(d).status == Status.RUNNING, timeout=30, what="running after the retry")
    assert len(emulator.rayservices()) == 1


def test_a_pass_whose_lock_died_mid_apply_converges_to_one_rayservice(people, k8s_cluster, emulator, workers):
    """The create reaches the cluster, then the pass's connection dies before the answer comes back; another pass
    takes the lock, finds what was created and finishes: one RayService, one create. (The `applied` event is the
    interrupted pass's to write, and it cannot: the next pass finds nothing to apply. History misses that step.)"""
    workers(concurrency=2)
    emulator.stall_rayservice_create = 3.0  # stored, the answer held back
    d = _approved(people, k8s_cluster)
    wait_for(emulator.stalled.is_set, timeout=20, what="the RayService create to arrive")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [wait_for(lambda: _lock_holder(d), what="the holder")])
    emulator.stall_rayservice_create = 0.0
    wait_for(lambda: _row(d).status == Status.RUNNING, timeout=30, what="running")
    assert len(emulator.rayservices()) == 1
    assert [m for m, _ in _rayservice_writes(emulator)] == ["POST"]
    assert _row(d).events.filter(kind="applied").count() <= 1


def test_twenty_approvals_at_once_on_two_prefork_workers_apply_each_once(people, k8s_cluster, emulator, workers):
    """Two workers of two pool processes each take the passes of 20 deployments approved together (and a resync
    on top, as beat sends): every one runs, with one create each and no step recorded twice."""
    from workers.tasks import resync_deployments

    workers(concurrency=2)
    workers(concurrency=2)
    team, member, admin = people
    pending = [deployment_request(actor=member, team=team, cluster=k8s_cluster, name=f"llama-{i}", spec=spec_input())
               for i in range(20)]
    for d in pending:
        deployment_approve(actor=admin, deployment=d, generation=d.generation)
    resync_deployments.delay()
    ids = [d.pk for d in pending]
    wait_for(lambda: Deployment.objects.filter(pk__in=ids, status=Status.RUNNING).count() == 20, timeout=90,
             every=0.5, what="all 20 running")
    assert [m for m, _ in _rayservice_writes(emulator)] == ["POST"] * 20  # one create each, nothing replaced
    assert len(emulator.rayservices()) == 20
    for d in pending:
        kinds = Counter(_row(d).events.values_list("kind", flat=True))
        once = {k: kinds[k] for k in ("approved", "status_provisioning", "applied", "status_running")}
        assert once == dict.fromkeys(once, 1), (d.name, kinds)


def test_a_pool_child_killed_mid_task_is_replaced_and_its_task_reruns(people, k8s_cluster, emulator, workers):
    """SIGKILL the prefork child running a pass (task_reject_on_worker_lost): the pool starts another child, the
    message comes back, and the deployment converges to one RayService."""
    worker = workers(concurrency=1)
    emulator.stall_rayservice_create = 30.0
    d = _approved(people, k8s_cluster)
    wait_for(emulator.stalled.is_set, timeout=20, what="the RayService create to arrive")
    [child] = worker.children()
    os.kill(child, signal.SIGKILL)
    emulator.stall_rayservice_create = 0.0
    wait_for(lambda: _row(d).status == Status.RUNNING, timeout=30, what="running after the child was killed")
    assert worker.proc.poll() is None and child not in worker.children()
    assert len(emulator.rayservices()) == 1
    assert [m for m, _ in _rayservice_writes(emulator)] == ["POST"]
