"""Fixtures for the target drivers and the reconciler: emulators over real HTTP, clusters that point at them,
and a real Celery worker subprocess on the test database and Redis."""

import pytest

from deployments.models import Cluster
from deployments.spec import spec_parse
from tests.factories import MODEL_SOURCES, RUNTIME_IMAGES, ClusterFactory, DeploymentFactory, TeamFactory, spec_input
from tests.conftest import EMULATOR_TOKEN as TOKEN  # noqa: F401 - the driver tests use it
from tests.support.moto_server import MotoServer
from tests.support.ray_dashboard import TEST_TOKEN, RayDashboard
from tests.support.processes import Worker, wait_for, worker_environment  # noqa: F401 - fixtures and tests use them



@pytest.fixture
def k8s_cluster(db, kubeconfig):
    return ClusterFactory(name="k8s-emu", kind=Cluster.Kind.KUBERNETES, secret_ref=kubeconfig,
                          config={"namespace_prefix": "tandem-", "model_sources": MODEL_SOURCES,
                                  "runtime_images": RUNTIME_IMAGES})


@pytest.fixture
def k8s_deployment(k8s_cluster):
    """An approved-shape deployment (status untouched) on the emulated cluster."""
    team = TeamFactory(slug="ml-research", gpu_quota=64)
    return DeploymentFactory(team=team, cluster=k8s_cluster, name="llama")


@pytest.fixture(scope="session")
def moto():
    server = MotoServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def aws(moto, monkeypatch):
    """moto, reset, with fake credentials in the environment (boto3 signs requests with them)."""
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-west-2"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    moto.reset()
    return moto


def gpu_spec(**overrides) -> dict:
    """A stored GPU spec (the factory's g6e.12xlarge pools unless overridden)."""
    return spec_parse(spec_input(**overrides), target_kind="kubernetes").to_dict()


@pytest.fixture
def worker_env(transactional_db, redis_client, tmp_path):
    """The environment a worker needs to see this test's rows: the test database's name, Redis db, fast requeue."""
    return worker_environment(tmp_path)


@pytest.fixture
def worker(worker_env):
    """One running worker; stopped (or killed) at the end of the test."""
    started = [Worker(worker_env).start()]
    yield started
    for w in started:
        w.stop()


@pytest.fixture
def dashboard():
    """A stand-in Ray dashboard (the Serve REST API over real HTTP, token TEST_TOKEN) whose applications run 0.2 s
    after each change."""
    server = RayDashboard(token=TEST_TOKEN, ready_after=0.2).serve()
    yield server
    server.close()
