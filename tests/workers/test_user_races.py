"""Races a user can cause, through the real REST API (a threaded live server on the real database), requests sent
together from threads: exactly one wins, the others get a 409 that says why, and nothing is left on the
emulated cluster."""
import threading
from pathlib import Path

import httpx
import pytest

from deployments.lifecycle import HOLDS_QUOTA, Status
from deployments.models import Deployment, Membership
from deployments.services.access_tokens import access_token_create
from deployments.services.actions import deployment_request
from tests.factories import DeploymentFactory, MembershipFactory, TeamFactory, spec_input
from tests.support.processes import Worker, wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture
def users(transactional_db, live_server):
    team = TeamFactory(slug="ml-research", gpu_quota=64)
    member = MembershipFactory(team=team, role=Membership.Role.MEMBER).user
    admins = [MembershipFactory(team=team, role=Membership.Role.ADMIN).user for _ in range(2)]

    clients = []

    def client(user) -> httpx.Client:
        _, raw = access_token_create(user=user, name="races")
        clients.append(httpx.Client(base_url=f"{live_server.url}/api/v1/deployments", timeout=30,
                                    headers={"Authorization": f"Bearer {raw}"}))
        return clients[-1]

    yield team, member, client(member), [client(a) for a in admins]
    for c in clients:  # the server's thread for a connection holds a database session until it closes
        c.close()


def at_once(*calls) -> list[httpx.Response]:
    """Run the calls from threads released together; their responses in order."""
    barrier = threading.Barrier(len(calls))
    results: list = [None] * len(calls)

    def run(i, call):
        barrier.wait()
        results[i] = call()

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def _pending(team, member, cluster, name="llama") -> Deployment:
    return deployment_request(actor=member, team=team, cluster=cluster, name=name, spec=spec_input())


def _one_wins(responses, ok: int = 200) -> tuple[httpx.Response, list[httpx.Response]]:
    codes = sorted(r.status_code for r in responses)
    assert codes == sorted([ok] + [409] * (len(responses) - 1)), [(r.status_code, r.text[:200]) for r in responses]
    winner = next(r for r in responses if r.status_code == ok)
    return winner, [r for r in responses if r is not winner]


def test_two_admins_approve_at_once_one_wins(users, k8s_cluster):
    team, member, _, (ada, bob) = users
    d = _pending(team, member, k8s_cluster)
    decision = {"generation": d.generation}
    _, [loser] = _one_wins(at_once(lambda: ada.post(f"/{d.pk}/approve/", json=decision),
                                   lambda: bob.post(f"/{d.pk}/approve/", json=decision)))
    assert loser.json()["detail"] == "Nothing to approve: the deployment is approved."
    assert Deployment.objects.get(pk=d.pk).events.filter(kind="approved").count() == 1


def test_approve_against_withdraw_one_wins(users, k8s_cluster):
    team, member, mine, (ada, _) = users
    d = _pending(team, member, k8s_cluster)
    winner, [loser] = _one_wins(at_once(lambda: ada.post(f"/{d.pk}/approve/", json={"generation": d.generation}),
                                        lambda: mine.post(f"/{d.pk}/withdraw/")))
    status = Deployment.objects.get(pk=d.pk).status
    assert winner.json()["status"] == status and status in (Status.APPROVED, Status.WITHDRAWN)
    assert loser.json()["detail"] in ("Nothing to approve: the deployment is withdrawn.",
                                      "Only a pending request can be withdrawn; this one is approved. Delete it "
                                      "instead.")
    kinds = set(Deployment.objects.get(pk=d.pk).events.values_list("kind", flat=True))
    assert len(kinds & {"approved", "withdrawn"}) == 1


def test_two_updates_at_once_one_wins(users, k8s_cluster):
    team, member, mine, _ = users
    d = DeploymentFactory(team=team, cluster=k8s_cluster, requested_by=member, status=Status.RUNNING)
    specs = [spec_input(engine={"max_model_len": n}) for n in (4096, 2048)]
    winner, [loser] = _one_wins(at_once(*[lambda s=s: mine.patch(f"/{d.pk}/", json={"spec": s}) for s in specs]))
    row = Deployment.objects.get(pk=d.pk)
    assert row.status == Status.UPDATING and row.generation == d.generation + 1
    assert winner.json()["spec"]["engine"]["max_model_len"] == row.spec["engine"]["max_model_len"]
    # The winner's update rolls out (in place: only max_model_len changed); the loser is told to wait for it.
    assert loser.json()["detail"] == (f"Generation {row.generation} is still rolling out (in place). Wait until it "
                                      "is done, or abort it, then update again.")


def test_delete_during_provisioning_with_a_live_worker_leaves_nothing(users, k8s_cluster, emulator, worker_env):
    team, member, mine, (ada, _) = users
    worker = Worker(worker_env, concurrency=2).start()
    try:
        emulator.stall_rayservice_create = 2.0  # the pass is mid-apply when the deletes arrive
        d = _pending(team, member, k8s_cluster)
        assert ada.post(f"/{d.pk}/approve/", json={"generation": d.generation}).status_code == 200
        wait_for(emulator.stalled.is_set, timeout=20, what="the RayService create to arrive")
        responses = at_once(lambda: mine.delete(f"/{d.pk}/"), lambda: mine.delete(f"/{d.pk}/"))
        assert [r.status_code for r in responses] == [202, 202]  # asking twice to delete is one deletion
        wait_for(lambda: Deployment.objects.get(pk=d.pk).status == Status.DELETED, timeout=30, what="deleted")
        assert emulator.live_objects() == []
        assert Deployment.objects.get(pk=d.pk).events.filter(kind="delete_requested").count() == 1
    finally:
        worker.kill()


def test_pause_during_provisioning_with_a_live_worker_ends_paused_not_running(users, k8s_cluster, emulator, worker_env):
    """The pause lands while a pass is mid-apply; that pass then finds the RayService serving (KubeRay reports it
    ready before the create's answer comes back) and would write `running`: it stops instead, and the pausing pass
    removes what it applied."""
    team, member, mine, (ada, _) = users
    worker = Worker(worker_env, concurrency=2).start()
    try:
        emulator.stall_rayservice_create = 3.0  # longer than the emulator's ready_after: serving once it answers
        d = _pending(team, member, k8s_cluster)
        assert ada.post(f"/{d.pk}/approve/", json={"generation": d.generation}).status_code == 200
        wait_for(emulator.stalled.is_set, timeout=20, what="the RayService create to arrive")
        r = mine.post(f"/{d.pk}/pause/")
        assert r.status_code == 202 and r.json()["status"] == "pausing", r.text
        wait_for(lambda: Deployment.objects.get(pk=d.pk).status == Status.PAUSED, timeout=30, what="paused")
        assert emulator.rayservices() == []
        row = Deployment.objects.get(pk=d.pk)
        kinds = list(row.events.order_by("id").values_list("kind", flat=True))
        after_pause = kinds[kinds.index("pause_requested") + 1:]
        # The pass in flight applied and stopped without writing `running` (how far it looked first, at Serve's
        # status and the endpoint, depends on how fast KubeRay reports it ready); the pausing pass removed it.
        assert after_pause[0] == "applied" and after_pause[-2:] == ["pause", "status_paused"], kinds
        assert set(after_pause[1:-2]) <= {"serve_status", "endpoint"}, kinds
        assert row.quota_gpus and row.status not in HOLDS_QUOTA
    finally:
        worker.kill()
    assert "Traceback" not in Path(worker_env["TANDEM_WORKER_LOG"]).read_text()  # the pass stopped, not crashed
