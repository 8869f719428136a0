"""PostgreSQL restarts (`pg_ctl restart -m fast`) while web, gateway, a prefork worker and beat run on it, and a
reconcile pass is mid-apply: each recovers without a restart of its own, and the interrupted deployment converges
to one RayService. The server is the test's own (tests/support/private_pg.py), loaded with a
copy of the test database; the shared server is never restarted."""
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import psycopg
import pytest

from deployments.lifecycle import Status
from deployments.models import Membership
from deployments.services.access_tokens import access_token_create
from deployments.services.actions import deployment_request
from deployments.services.api_keys import api_key_create
from tests.factories import DeploymentFactory, MembershipFactory, TeamFactory, spec_input, spec_restore
from tests.support.private_pg import PrivatePostgres
from tests.support import processes
from tests.support.processes import (ROOT, Worker, start_gateway, start_mock_upstream, start_web, stop_at_end,
                                     wait_for, worker_environment)

pytestmark = pytest.mark.e2e
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def private_pg():
    server = PrivatePostgres().start()
    yield server
    server.stop()


def _beat(env: dict, tmp) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "celery", "-A", "controlplane", "beat", "-l", "WARNING",
                             "-s", str(tmp / "beat-schedule")], cwd=ROOT, env=env,
                            stdout=(tmp / "beat.log").open("wb"), stderr=subprocess.STDOUT)


def test_web_gateway_worker_and_beat_recover_from_a_postgresql_restart(
        transactional_db, redis_client, tmp_path, emulator, k8s_cluster, private_pg, stop_at_end):
    team = TeamFactory(slug="ml-research", gpu_quota=64)
    member = MembershipFactory(team=team, role=Membership.Role.MEMBER).user
    admin = MembershipFactory(team=team, role=Membership.Role.ADMIN).user
    mock = stop_at_end(start_mock_upstream(tmp_path))
    served = DeploymentFactory(team=team, status=Status.RUNNING, endpoint_url=mock.base_url)
    served.spec["model_id"] = "m"
    spec_restore(served)
    served.save()
    pending = deployment_request(actor=member, team=team, cluster=k8s_cluster, name="llama", spec=spec_input())
    in_flight = deployment_request(actor=member, team=team, cluster=k8s_cluster, name="mistral", spec=spec_input())
    _, key = api_key_create(actor=member, team=team, name="before")
    _, member_token = access_token_create(user=member, name="t")
    _, admin_token = access_token_create(user=admin, name="t")
    url = private_pg.copy_of(processes.test_database_url(), "tandem")

    env = worker_environment(tmp_path, DATABASE_URL=url)
    worker = stop_at_end(Worker(env, concurrency=2).start())
    beat = _beat(env, tmp_path)
    try:
        # Started side by side, named by what started them (this test's tmp_path holds "gateway" too); each that
        # started is stopped even when the other failed to.
        with ThreadPoolExecutor(2) as pool:
            starting = [pool.submit(start, tmp_path, DATABASE_URL=url) for start in (start_web, start_gateway)]
        started = [stop_at_end(f.result()) for f in starting if f.exception() is None]
        for f in starting:
            f.result()  # a failed start's error, once the other is in `stop_at_end`
        web, gateway = started
        api = httpx.Client(base_url=web.base_url + "/api/v1", timeout=10,
                           headers={"Authorization": f"Bearer {member_token}"})
        chat = httpx.Client(base_url=gateway.base_url + "/v1", timeout=10)

        def approve(d) -> None:
            r = httpx.post(f"{web.base_url}/api/v1/deployments/{d.pk}/approve/", json={"generation": d.generation},
                           headers={"Authorization": f"Bearer {admin_token}"})
            assert r.status_code == 200, r.text

        def completions(raw_key: str) -> int:
            return chat.post("/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {raw_key}"}).status_code

        assert api.get("/deployments/").status_code == 200 and completions(key) == 200
        # A pass mid-apply when the server goes: its create reached the cluster, the answer is held back.
        emulator.stall_rayservice_create = 3.0
        approve(in_flight)
        wait_for(emulator.stalled.is_set, timeout=20, what="the RayService create to arrive")

        private_pg.restart()  # every connection of every process ends; the server is back when this returns
        restarted = time.monotonic()
        emulator.stall_rayservice_create = 0.0

        web_codes = [api.get("/deployments/").status_code for _ in range(3)]
        chat_codes = [completions(key) for _ in range(3)]  # a key the gateway has seen: its cache answers
        # A key made after the restart: the gateway must read PostgreSQL to know it.
        r = api.post("/api-keys/", json={"team": team.slug, "name": "after"})
        assert r.status_code == 201, r.text
        new_key = r.json()["secret"]
        first_new = completions(new_key)
        wait_for(lambda: completions(new_key) == 200, timeout=10, what="the gateway to answer a new key")
        recovered_s = time.monotonic() - restarted

        approve(pending)
        for d in (in_flight, pending):
            wait_for(lambda: api.get(f"/deployments/{d.pk}/").json()["status"] == Status.RUNNING, timeout=30,
                     every=0.3, what=f"{d.name} to run")
        creates = [p for m, p in emulator.hits if m == "POST" and p.endswith("/rayservices")]
        assert len(emulator.rayservices()) == 2 and len(creates) == 2  # the interrupted apply was not repeated

        # Beat's drain (every 5 s) runs on the worker and writes the gateway's records: every answered request
        # has its one record in the restarted database.
        answered = 1 + chat_codes.count(200) + (first_new == 200) + 1

        def records() -> int:
            with psycopg.connect(url) as conn:
                return conn.execute("SELECT count(*) FROM gateway_requestrecord").fetchone()[0]

        wait_for(lambda: records() >= answered, timeout=15, every=0.5, what="the records to be drained")
        print(f"after the restart: web {web_codes}, gateway (cached key) {chat_codes}, gateway (new key, first) "
              f"{first_new}; new key answered {recovered_s:.1f} s after the restart; records {records()} "
              f"for {answered} answered requests")
        assert web_codes == [200, 200, 200], "web lost requests to the restart"
        assert chat_codes == [200, 200, 200] and first_new == 200, "the gateway lost requests to the restart"
        assert records() == answered
        assert worker.proc.poll() is None and beat.poll() is None
    finally:
        worker.kill()
        beat.terminate()
        beat.wait(10)
