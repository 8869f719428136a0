"""Fixtures for the target drivers and the reconciler: emulators over real HTTP, clusters that point at them,
and a real Celery worker subprocess on the test database and Redis."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from deployments.models import Cluster
from deployments.spec import spec_parse
from tests.factories import ClusterFactory, DeploymentFactory, TeamFactory, spec_input
from tests.support.k8s_emulator import EmulatorThread, KubeRayEmulator, kubeconfig_text
from tests.support.moto_server import MotoServer

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "emulator-token-not-a-secret"


@pytest.fixture
def emulator():
    """A Kubernetes API with KubeRay's CRD installed, answering on 127.0.0.1."""
    handler = KubeRayEmulator(token=TOKEN, ready_after=0.3)
    handler.install_kuberay()
    with EmulatorThread(handler):
        yield handler


@pytest.fixture
def kubeconfig(emulator, tmp_path):
    """A secret reference (file:) to a kubeconfig for the emulator."""
    path = tmp_path / "kubeconfig"
    path.write_text(kubeconfig_text(url=emulator.base_url, token=TOKEN))
    path.chmod(0o600)
    return f"file:{path}"


@pytest.fixture
def k8s_cluster(db, kubeconfig):
    return ClusterFactory(name="k8s-emu", kind=Cluster.Kind.KUBERNETES, secret_ref=kubeconfig,
                          config={"namespace_prefix": "tandem-"})


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


class Worker:
    """A real `celery worker` subprocess on the test database and Redis."""

    def __init__(self, env: dict):
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.log = open(env["TANDEM_WORKER_LOG"], "ab")

    def start(self) -> "Worker":
        cmd = [sys.executable, "-m", "celery", "-A", "controlplane", "worker", "--pool=solo", "-l", "WARNING",
               "--without-heartbeat", "--without-gossip", "--without-mingle"]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=self.env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        return self

    def kill(self) -> None:
        """SIGKILL: no cleanup, no ack, connections dropped by the kernel."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def worker_env(transactional_db, redis_client, tmp_path):
    """The environment a worker needs to see this test's rows: the test database's name, Redis db, fast requeue."""
    db = connection.settings_dict
    env = {**os.environ,
           "DJANGO_SETTINGS_MODULE": "controlplane.settings.test",
           "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
           "REDIS_URL": settings.REDIS_URL, "CELERY_BROKER_URL": settings.REDIS_URL,
           "TANDEM_RECONCILE_REQUEUE_SECONDS": "0.3",
           # A killed worker's message comes back after this long; production keeps it above the task limit.
           "TANDEM_VISIBILITY_TIMEOUT": "4", "TANDEM_TASK_TIME_LIMIT": "60",
           "PYTHONPATH": str(ROOT), "TANDEM_WORKER_LOG": str(tmp_path / "worker.log")}
    if db.get("PASSWORD"):
        env["DATABASE_URL"] = env["DATABASE_URL"].replace(f"{db['USER']}@", f"{db['USER']}:{db['PASSWORD']}@")
    return env


@pytest.fixture
def worker(worker_env):
    """One running worker; stopped (or killed) at the end of the test."""
    started = [Worker(worker_env).start()]
    yield started
    for w in started:
        w.stop()


def wait_for(predicate, *, timeout: float = 30.0, every: float = 0.1, what: str = "condition"):
    """Poll until predicate() is truthy; fail the test with `what` when it never is."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")
