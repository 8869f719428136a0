"""Shared fixtures. Tests run against real PostgreSQL and Redis (DATABASE_URL, REDIS_URL)."""
import pytest
import redis as redis_lib
from django.conf import settings
from rest_framework.test import APIClient

from controlplane.devservices import redis_db
from deployments.models import Membership
from tests.factories import RUNTIME_IMAGE, ClusterFactory, MembershipFactory, TeamFactory, UserFactory
from tests.support.k8s_emulator import EmulatorThread, KubeRayEmulator, kubeconfig_text

EMULATOR_TOKEN = "emulator-token-not-a-secret"


@pytest.fixture
def redis_client():
    """The suite's Redis database, flushed before and after. Refuses db 0, the one `./tandem up` uses."""
    if redis_db(settings.REDIS_URL) == 0:
        pytest.fail("refusing to flush Redis db 0 (`./tandem up`'s): point REDIS_URL at another database number")
    client = redis_lib.Redis.from_url(settings.REDIS_URL)
    client.flushdb()
    yield client
    client.flushdb()


@pytest.fixture
def team(db):
    return TeamFactory(slug="ml-research", gpu_quota=16)


@pytest.fixture
def member(team):
    return MembershipFactory(team=team, role=Membership.Role.MEMBER).user


@pytest.fixture
def team_admin(team):
    return MembershipFactory(team=team, role=Membership.Role.ADMIN).user


@pytest.fixture
def platform_admin(db):
    return UserFactory(username="root-admin", is_staff=True, is_superuser=True)


@pytest.fixture
def cluster(db):
    return ClusterFactory(name="gpu-prod")


@pytest.fixture
def api():
    """An API client; `api.force_authenticate(user)` signs in."""
    return APIClient()


@pytest.fixture
def emulator():
    """A Kubernetes API with KubeRay's CRD installed, answering on 127.0.0.1, whose nodes pull only the runtime image
    the test clusters register (tests.factories.RUNTIME_IMAGE, pushed as docs/install.md's step 5 says): any other
    image a manifest names waits in ImagePullBackOff, as it would on a real cluster."""
    handler = KubeRayEmulator(token=EMULATOR_TOKEN, ready_after=0.3, registry={RUNTIME_IMAGE})
    handler.install_kuberay()
    with EmulatorThread(handler):
        yield handler


@pytest.fixture
def kubeconfig(emulator, tmp_path):
    """A secret reference (file:) to a kubeconfig for the emulator."""
    path = tmp_path / "kubeconfig"
    path.write_text(kubeconfig_text(url=emulator.base_url, token=EMULATOR_TOKEN))
    path.chmod(0o600)
    return f"file:{path}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Each phase's seconds (setup, call, teardown) as a property of the test in the JUnit files CI keeps
    (test-artifacts/): a test slow in its fixtures shows where, which the file's one `time` does not."""
    outcome = yield
    timed = (f"{call.when}_seconds", f"{call.duration:.3f}")
    # JUnit takes the properties of a test's last report, its teardown's, made from the item's at that moment
    (outcome.get_result().user_properties if call.when == "teardown" else item.user_properties).append(timed)
