"""Real processes for gateway tests: the mock upstream and `python -m gateway`, on the test database."""
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from deployments.lifecycle import Status
from deployments.models import Cluster, Membership
from deployments.services.api_keys import api_key_create
from tests.factories import ClusterFactory, DeploymentFactory, MembershipFactory, TeamFactory, spec_restore
from tests.support.processes import MinuteClock, Proc, start_mock_upstream, wait_for
from tests.support.processes import start_gateway as support_start_gateway
from usage.models import RequestRecord
from usage.tasks import drain_request_records

RAY_TOKEN = "ray-token-for-tests"


def start_gateway(tmp: Path, **env) -> Proc:
    """A gateway with a short upstream timeout, a 1 MiB body limit and a Ray token in its environment. Every test
    calls from 127.0.0.1, so the limit on failed authentications per address is out of the way unless a test
    sets it."""
    return support_start_gateway(tmp, **{"TANDEM_CLUSTER_TEST_RAY_TOKEN": RAY_TOKEN,
                                         "TANDEM_GATEWAY_MAX_BODY_BYTES": str(1024 * 1024),
                                         "TANDEM_GATEWAY_UPSTREAM_TIMEOUT_S": "2",
                                         "TANDEM_GATEWAY_AUTH_FAILURES_PER_MINUTE": "0", **env})


@pytest.fixture(scope="session")
def mock_upstream(tmp_path_factory):
    proc = start_mock_upstream(tmp_path_factory.mktemp("mock"), "--record", "--chunks", "8")
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def gateway(django_db_setup, django_db_blocker, mock_upstream, tmp_path_factory):
    proc = start_gateway(tmp_path_factory.mktemp("gw"))
    yield proc
    proc.stop()


class MinuteGateways:
    """Two gateways whose clocks read one minute (`clock`, a MinuteClock), for tests of per-minute rate limits."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.clock: MinuteClock | None = None
        self.members: list[Proc] = []

    def renew(self, *, need_s: float) -> None:
        """Start a fresh pair on a new clock unless the current pair's minute has `need_s` left."""
        if self.clock is not None and self.clock.seconds_left() >= need_s:
            return
        self.stop()
        self.clock = MinuteClock()
        with ThreadPoolExecutor(2) as pool:  # a start is mostly waiting for Django's imports: overlap the two
            starting = [pool.submit(start_gateway, self.tmp, **self.clock.env) for _ in range(2)]
            for future in starting:
                try:
                    self.members.append(future.result())
                except Exception:
                    self.stop()
                    raise

    def stop(self) -> None:
        for member in self.members:
            member.stop()
        self.members = []


@pytest.fixture(scope="module")
def _minute_gateway_pair(django_db_setup, django_db_blocker, mock_upstream, tmp_path_factory):
    pair = MinuteGateways(tmp_path_factory.mktemp("minute-gw"))
    try:
        yield pair
    finally:
        pair.stop()


@pytest.fixture
def minute_gateways(_minute_gateway_pair) -> MinuteGateways:
    """Two gateways with at least 30 s left in their clocks' current minute (no test here takes 10 s, so that is
    room for a loaded machine): a test's requests all count in the window `clock.window`. The pair is shared by
    the module's tests and restarted on a new clock when its minute runs short. A test that still outlasted the
    minute fails here rather than as a puzzling count."""
    pair = _minute_gateway_pair
    pair.renew(need_s=30)
    yield pair
    assert pair.clock.seconds_left() > 0, "the test outlasted its gateways' minute: its counts span two windows"


@pytest.fixture
def mock_requests(mock_upstream):
    """What upstream saw, by the X-Request-ID the gateway sent (its own id, the record's `request_id`)."""

    def fetch(request_id: str | None = None):
        data = httpx.get(mock_upstream.base_url + "/_mock/requests", timeout=30).json()
        return data if request_id is None else data.get(request_id)

    return fetch


def drained(client_request_id: str, timeout: float = 5.0) -> RequestRecord:
    """The record of the one request sent with this X-Request-ID, once the drain has moved it to PostgreSQL."""

    def find():
        drain_request_records()
        return RequestRecord.objects.filter(client_request_id=client_request_id).first()

    return wait_for(find, timeout=timeout, what=f"the record of {client_request_id}")


def upstream_of(mock_requests, client_request_id: str) -> dict:
    """What upstream saw of the request a client sent with this X-Request-ID."""
    return mock_requests(drained(client_request_id).request_id)


def upstream_by_model(mock_requests, model: str) -> dict:
    """What upstream saw of the one request for `model` (for a request whose record is not written yet)."""
    seen = [v for v in mock_requests().values() if isinstance(v.get("body"), dict) and v["body"].get("model") == model]
    assert len(seen) == 1, f"{len(seen)} upstream requests for {model}"
    return seen[0]


@pytest.fixture
def world(transactional_db, redis_client, mock_upstream):
    """Builds a team with a member, deployments pointing at the mock, and keys."""

    class World:
        def __init__(self):
            self.team = TeamFactory()
            self.member = MembershipFactory(team=self.team, role=Membership.Role.MEMBER).user
            self.cluster = ClusterFactory()

        def deployment(self, model: str, *, options: str = "", status: str = Status.RUNNING, endpoint: str | None = None,
                       cluster=None, max_model_len: int | None = None, team=None):
            dep = DeploymentFactory(team=team or self.team, cluster=cluster or self.cluster, status=status)
            dep.spec["model_id"] = model
            if max_model_len:
                dep.spec["engine"]["max_model_len"] = max_model_len
            spec_restore(dep)
            dep.endpoint_url = endpoint if endpoint is not None else (
                mock_upstream.base_url + (f"/o/{options}" if options else ""))
            dep.save()
            return dep

        def ray_cluster(self):
            return ClusterFactory(kind=Cluster.Kind.RAY, config={"dashboard_url": "http://127.0.0.1:8265"},
                                  secret_ref="env:TANDEM_CLUSTER_TEST_RAY_TOKEN")

        def key(self, **fields) -> tuple:
            return api_key_create(actor=self.member, team=fields.pop("team", self.team), name="k", **fields)

    return World()


@pytest.fixture
def openai_client(gateway):
    from openai import OpenAI

    def make(api_key: str, **kwargs):
        return OpenAI(base_url=gateway.base_url + "/v1", api_key=api_key, max_retries=0, **kwargs)

    return make

