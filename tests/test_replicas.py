"""More than one of everything, as deploy/ runs Tandem: two web processes (gunicorn), two gateways and two Celery
workers on this machine, sharing PostgreSQL and Redis, with the Kubernetes API emulator as the target.

What must hold across replicas: a session and its CSRF token from one web process work on the other; a key revoked
through one is refused by both gateways within a second; rate limits are counted once for all gateways; two
workers apply a deployment exactly once per generation. Beat's singleness is the manifests' (one replica,
Recreate; tests/deploy/test_manifests.py): here two resyncs at once, as two beats would send, change nothing.

Rolling restarts while traffic flows, the way a Deployment rolls a pod: it leaves the Service's endpoints, the
preStop pause lets that settle, then SIGTERM. No request fails: streams in flight on a stopping gateway finish
(it drains up to TANDEM_GATEWAY_DRAIN_SECONDS, and cuts what is left after that), and no reconcile is lost.
"""
import itertools
import re
import signal
import threading
import time

import httpx
import pytest

from deployments.lifecycle import Status
from deployments.models import Cluster, Deployment, Membership
from gateway.ratelimit import SYNC_S
from deployments.services.access_tokens import access_token_create
from deployments.services.actions import deployment_approve, deployment_request, deployment_update
from deployments.services.api_keys import api_key_create
from tests.conftest import EMULATOR_TOKEN
from tests.factories import MODEL_SOURCES, ClusterFactory, DeploymentFactory, MembershipFactory, TeamFactory, spec_input
from tests.support.k8s_emulator import EmulatorThread, KubeRayEmulator, kubeconfig_text
from tests.support.processes import (Worker, start_gateway, start_mock_upstream, start_web, wait_for,
                                     wait_for_idle_workers, worker_environment)
from tests.support.revocation import assert_key_refused_within
from workers.tasks import reconcile_deployment, resync_deployments

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

PRESTOP_PAUSE_S = 0.3  # the endpoint controller's turn: new requests stop coming before SIGTERM
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


class Service:
    """A Kubernetes Service over replicas: round-robin over the endpoints that are ready (in rotation)."""

    def __init__(self, members):
        self.members = list(members)
        self._lock = threading.Lock()
        self._turn = itertools.count()

    def pick(self):
        with self._lock:
            return self.members[next(self._turn) % len(self.members)]

    def roll(self, old, start, *, before_leave=None, stop_timeout: float = 30.0):
        """Replace `old` as a rolling update does: surge a new one, take the old out of rotation, SIGTERM it."""
        new = start()
        if before_leave:
            before_leave(old)
        with self._lock:
            self.members.append(new)
            self.members.remove(old)
        time.sleep(PRESTOP_PAUSE_S)
        old.proc.send_signal(signal.SIGTERM)
        old.proc.wait(stop_timeout)
        return new


class Fleet:
    def __init__(self, tmp, emulator, mock):
        self.tmp, self.emulator, self.mock = tmp, emulator, mock
        self.web = Service(start_web(tmp) for _ in range(2))
        self.gateways = Service(start_gateway(tmp) for _ in range(2))
        self.workers = [Worker(worker_environment(tmp)).start() for _ in range(2)]

    def stop(self):
        for proc in self.web.members + self.gateways.members:
            proc.stop()
        for worker in self.workers:
            worker.stop()


@pytest.fixture(scope="module")
def fleet(django_db_setup, django_db_blocker, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fleet")
    emulator = KubeRayEmulator(token=EMULATOR_TOKEN, ready_after=1.0)
    emulator.install_kuberay()
    with EmulatorThread(emulator):
        mock = start_mock_upstream(tmp)
        fleet = Fleet(tmp, emulator, mock)
        try:
            yield fleet
        finally:
            fleet.stop()
            mock.stop()


@pytest.fixture
def people(fleet, redis_client):
    team = TeamFactory(slug="ml-research", gpu_quota=64)
    member = MembershipFactory(team=team, role=Membership.Role.MEMBER).user
    admin = MembershipFactory(team=team, role=Membership.Role.ADMIN).user
    yield team, member, admin
    wait_for_idle_workers(redis_client)  # the fleet's workers outlive the test; its rows go next


@pytest.fixture
def k8s_cluster(fleet, tmp_path):
    path = tmp_path / "kubeconfig"
    path.write_text(kubeconfig_text(url=fleet.emulator.base_url, token=EMULATOR_TOKEN))
    return ClusterFactory(name="emulated", kind=Cluster.Kind.KUBERNETES, secret_ref=f"file:{path}",
                          config={"namespace_prefix": "tandem-", "model_sources": MODEL_SOURCES})


def served(fleet, team, *, options: str = "", model: str = "m") -> Deployment:
    """A running deployment whose endpoint is the mock upstream (streams paced by `options`)."""
    d = DeploymentFactory(team=team, status=Status.RUNNING)
    d.spec["model_id"] = model
    d.endpoint_url = fleet.mock.base_url + (f"/o/{options}" if options else "")
    d.save()
    return d


def rayservice_writes(emulator, method: str, *, since: int) -> int:
    """RayService creates (POST to the collection) or replaces (PUT) the emulator saw after hit number `since`."""
    return sum(1 for m, p in emulator.hits[since:] if m == method and re.search(r"/rayservices(/[^/]+)?$", p))


def csrf_from(html: str) -> str:
    return re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)[1]


def test_a_session_from_one_web_replica_posts_on_the_other_and_both_gateways_refuse_the_key(fleet, people):
    team, member, _ = people
    served(fleet, team)
    key, raw = api_key_create(actor=member, team=team, name="shared")
    first, second = fleet.web.members
    with httpx.Client(timeout=10) as browser:  # one cookie jar: cookies ignore the port, as browsers' do
        page = browser.get(first.base_url + "/accounts/login/").text
        signed_in = browser.post(first.base_url + "/accounts/login/", data={
            "username": member.username, "password": "pw", "csrfmiddlewaretoken": csrf_from(page)})
        assert signed_in.status_code == 302
        assert browser.get(second.base_url + "/keys/").status_code == 200  # the session is known on the other
        form = browser.get(first.base_url + f"/keys/{key.pk}/revoke/").text
        refused = browser.post(second.base_url + f"/keys/{key.pk}/revoke/")  # no token: CSRF is enforced...
        assert refused.status_code == 403

        def revoke_on_the_other_replica():  # ...and the token one replica gave is good on the other
            response = browser.post(second.base_url + f"/keys/{key.pk}/revoke/",
                                    data={"csrfmiddlewaretoken": csrf_from(form)})
            assert response.status_code == 302 and response.headers["location"] == "/keys/"

        assert_key_refused_within([g.base_url for g in fleet.gateways.members], raw, revoke_on_the_other_replica,
                                  seconds=1.0)


def test_rate_limits_are_counted_once_for_all_gateways(fleet, people):
    team, member, _ = people
    served(fleet, team)
    _, raw = api_key_create(actor=member, team=team, name="limited", requests_per_minute=4)
    if 60 - time.time() % 60 < 10:  # the limit counts per minute: do not straddle two
        time.sleep(60 - time.time() % 60 + 0.1)
    codes = []
    for i in range(6):
        gateway = fleet.gateways.members[i % 2]
        codes.append(httpx.post(gateway.base_url + "/v1/chat/completions", json=CHAT, timeout=10,
                                headers={"Authorization": f"Bearer {raw}"}).status_code)
        # A replica sees the others' counts within SYNC_S (gateway/ratelimit.py: no Redis round trip per request,
        # so requests spread over replicas faster than that may overshoot by what the others admitted meanwhile).
        time.sleep(SYNC_S + 0.1)
    assert codes == [200, 200, 200, 200, 429, 429]


def test_two_workers_apply_each_generation_exactly_once(fleet, people, k8s_cluster):
    team, member, admin = people
    since = len(fleet.emulator.hits)
    d = deployment_request(actor=member, team=team, cluster=k8s_cluster, name="llama", spec=spec_input())
    deployment_approve(actor=admin, deployment=d, generation=d.generation)
    for _ in range(6):  # every worker gets some: what a burst of messages, or two beats, would send
        reconcile_deployment.delay(d.pk)
        resync_deployments.delay()
    wait_for(lambda: Deployment.objects.get(pk=d.pk).status == Status.RUNNING, timeout=40, what="running")
    assert rayservice_writes(fleet.emulator, "POST", since=since) == 1

    spec = spec_input()
    spec["engine"]["max_model_len"] = 4096
    deployment_update(actor=member, deployment=Deployment.objects.get(pk=d.pk), spec=spec)
    for _ in range(6):
        reconcile_deployment.delay(d.pk)
        resync_deployments.delay()

    def settled():
        row = Deployment.objects.get(pk=d.pk)
        return row.status == Status.RUNNING and row.observed_generation == row.generation == 2

    wait_for(settled, timeout=40, what="the update applied")
    assert rayservice_writes(fleet.emulator, "PUT", since=since) == 1
    assert rayservice_writes(fleet.emulator, "POST", since=since) == 1


class Traffic:
    """Clients calling through a Service until stopped; every failure is kept with where it happened."""

    def __init__(self, service: Service, call, *, threads: int):
        self.service, self.call = service, call
        self.ok, self.failures = 0, []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def _run(self):
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                target = self.service.pick()
                try:
                    error = self.call(client, target.base_url)
                except httpx.HTTPError as e:
                    error = f"{type(e).__name__}: {e}"
                with self._lock:
                    if error:
                        self.failures.append((target.base_url, error))
                    else:
                        self.ok += 1

    def __enter__(self):
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        for t in self._threads:
            t.join(60)


def stream_completes(raw_key: str):
    def call(client: httpx.Client, base_url: str) -> str | None:
        with client.stream("POST", base_url + "/v1/chat/completions", json={**CHAT, "stream": True},
                           headers={"Authorization": f"Bearer {raw_key}"}) as r:
            if r.status_code != 200:
                return f"HTTP {r.status_code}"
            events = [line for line in r.iter_lines() if line]
        return None if events and events[-1] == "data: [DONE]" else f"stream ended with {events[-1:]}"
    return call


def api_answers(raw_token: str):
    def call(client: httpx.Client, base_url: str) -> str | None:
        r = client.get(base_url + "/api/v1/deployments/", headers={"Authorization": f"Bearer {raw_token}"})
        return None if r.status_code == 200 else f"HTTP {r.status_code}"
    return call


def test_rolling_restarts_lose_no_request_and_no_reconcile(fleet, people, k8s_cluster):
    team, member, admin = people
    served(fleet, team, options="gap=0.05,chunks=16")  # ~0.8 s streams: several are always in flight
    served(fleet, team, options="gap=0.1,chunks=25", model="slow")  # 2.5 s: still streaming at SIGTERM
    _, raw_key = api_key_create(actor=member, team=team, name="traffic")
    _, raw_token = access_token_create(user=member, name="traffic")
    drained = []

    def stream_in_flight(old):
        """A long stream on the gateway about to stop, already answering: it must finish, [DONE] included."""
        started = threading.Event()

        def run():
            with httpx.Client(timeout=30) as client, client.stream(
                    "POST", old.base_url + "/v1/chat/completions", json={**CHAT, "model": "slow", "stream": True},
                    headers={"Authorization": f"Bearer {raw_key}"}) as r:
                events = []
                for line in r.iter_lines():
                    started.set()
                    if line:
                        events.append(line)
                drained.append("finished" if events[-1] == "data: [DONE]" else f"cut after {len(events)}")

        probe = threading.Thread(target=run)
        probe.start()
        assert started.wait(10)
        probes.append(probe)

    probes = []

    with Traffic(fleet.gateways, stream_completes(raw_key), threads=4) as streams, \
            Traffic(fleet.web, api_answers(raw_token), threads=2) as api:
        time.sleep(1)
        for old in list(fleet.gateways.members):
            fleet.gateways.roll(old, lambda: start_gateway(fleet.tmp), before_leave=stream_in_flight)
        for old in list(fleet.web.members):
            fleet.web.roll(old, lambda: start_web(fleet.tmp))
        time.sleep(0.5)
    assert streams.failures == [] and api.failures == []
    assert streams.ok > 20 and api.ok > 20
    for probe in probes:
        probe.join(10)
    assert drained == ["finished", "finished"]

    # Workers: each is stopped (warm shutdown) and replaced while a deployment is being driven.
    since = len(fleet.emulator.hits)
    d = deployment_request(actor=member, team=team, cluster=k8s_cluster, name="rolled", spec=spec_input())
    deployment_approve(actor=admin, deployment=d, generation=d.generation)
    for i, old in enumerate(list(fleet.workers)):
        wait_for(lambda: Deployment.objects.get(pk=d.pk).status != Status.APPROVED, timeout=20, what="pickup")
        replacement = Worker(worker_environment(fleet.tmp)).start()
        old.stop()
        fleet.workers[i] = replacement
    wait_for(lambda: Deployment.objects.get(pk=d.pk).status == Status.RUNNING, timeout=40, what="running")
    assert rayservice_writes(fleet.emulator, "POST", since=since) == 1


def test_a_stopping_gateway_drains_streams_up_to_its_limit_then_cuts_them(fleet, people):
    team, member, _ = people
    served(fleet, team, options="gap=0.2,chunks=100")  # a 20 s stream
    _, raw = api_key_create(actor=member, team=team, name="long")
    gateway = start_gateway(fleet.tmp, TANDEM_GATEWAY_DRAIN_SECONDS="1.5")
    outcome = {}

    def read():
        with httpx.Client(timeout=30) as client:
            try:
                with client.stream("POST", gateway.base_url + "/v1/chat/completions", json={**CHAT, "stream": True},
                                   headers={"Authorization": f"Bearer {raw}"}) as r:
                    outcome["lines"] = sum(1 for line in r.iter_lines() if line)
            except httpx.HTTPError as e:
                outcome["error"] = type(e).__name__

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(0.8)
    stopped_at = time.monotonic()
    gateway.proc.send_signal(signal.SIGTERM)
    gateway.proc.wait(15)
    took = time.monotonic() - stopped_at
    reader.join(10)
    assert 1.5 <= took < 5, f"the gateway exited {took:.1f} s after SIGTERM"
    assert "error" in outcome or outcome.get("lines", 0) < 100, outcome  # cut, not finished
    with pytest.raises(httpx.ConnectError):  # and it no longer takes new requests
        httpx.get(gateway.base_url + "/healthz", timeout=1)
