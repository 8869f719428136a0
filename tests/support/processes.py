"""Real processes for integration tests: a Celery worker and the gateway on the test database and Redis."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import pytest
from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]


def test_database_url() -> str:
    """A DATABASE_URL naming the test database (TCP or a Unix-socket directory)."""
    db = connection.settings_dict
    host = db["HOST"] or "127.0.0.1"
    host = quote(host, safe="") if host.startswith("/") else host
    auth = db["USER"] + (f":{db['PASSWORD']}" if db.get("PASSWORD") else "")
    port = f":{db['PORT']}" if db.get("PORT") else ""
    return f"postgres://{auth}@{host}{port}/{db['NAME']}"


def worker_environment(tmp_path: Path, **overrides) -> dict:
    """Environment for a process that must see this test's rows and Redis; fast requeues for tests."""
    return {**os.environ,
            "DJANGO_SETTINGS_MODULE": "controlplane.settings.test",
            "DATABASE_URL": test_database_url(),
            "REDIS_URL": settings.REDIS_URL, "CELERY_BROKER_URL": settings.REDIS_URL,
            "TANDEM_RECONCILE_REQUEUE_SECONDS": "0.3",
            # A killed worker's message comes back after this long; production keeps it above the task limit.
            "TANDEM_VISIBILITY_TIMEOUT": "4", "TANDEM_TASK_TIME_LIMIT": "60",
            "PYTHONPATH": str(ROOT), "TANDEM_WORKER_LOG": str(tmp_path / "worker.log"), **overrides}


class Worker:
    """A real `celery worker` subprocess on the test database and Redis."""

    def __init__(self, env: dict, *, concurrency: int = 0):
        """concurrency 0: `--pool=solo` (one task at a time, in the process); N: the prefork pool production runs,
        N child processes."""
        self.env = env
        self.concurrency = concurrency
        self.proc: subprocess.Popen | None = None
        self.log = open(env["TANDEM_WORKER_LOG"], "ab")

    def start(self) -> "Worker":
        pool = ["--pool=prefork", f"--concurrency={self.concurrency}"] if self.concurrency else ["--pool=solo"]
        cmd = [sys.executable, "-m", "celery", "-A", "controlplane", "worker", *pool, "-l", "WARNING",
               "--without-heartbeat", "--without-gossip", "--without-mingle"]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=self.env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        return self

    def children(self) -> list[int]:
        """The prefork pool's child processes (the ones that run tasks)."""
        path = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        return [int(pid) for pid in path.read_text().split()] if path.exists() else []

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
def stop_at_end():
    """Processes a test starts, each stopped at the test's end whatever happened:
    `gw = stop_at_end(start_gateway(tmp_path))`, `w = stop_at_end(Worker(env).start())`. A start that fails raises
    before anything is registered (each start_* kills its own process then), and what was registered before it is
    stopped all the same, so no worker or gateway of a failed test serves the next one. Import it into the test
    module that uses it."""
    started = []

    def keep(proc):
        started.append(proc)
        return proc

    try:
        yield keep
    finally:
        for proc in reversed(started):
            proc.stop()


def wait_for_idle_workers(redis, *, timeout: float = 60.0) -> None:
    """Until no task is queued or running: Celery's Redis transport keeps a delivered message in `unacked` until
    the task acks it, at its end (acks_late). A test whose workers outlive it waits for this before its rows are
    truncated, or a task still reading them deadlocks with the TRUNCATE (seen in CI)."""
    wait_for(lambda: redis.llen("celery") == 0 and redis.hlen("unacked") == 0, timeout=timeout, every=0.2,
             what="the workers to finish their tasks")


def wait_for(predicate, *, timeout: float = 30.0, every: float = 0.1, what: str = "condition"):
    """Poll until predicate() is truthy; fail the test with `what` when it never is."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """A server subprocess with its base URL and log file (and, for a gateway, its internal metrics URL)."""

    def __init__(self, proc: subprocess.Popen, base_url: str, log: Path, metrics_url: str | None = None):
        self.proc, self.base_url, self.log, self.metrics_url = proc, base_url, log, metrics_url

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def rss_kib(self) -> int:
        import re

        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+)", status)[1])


def start_gateway(tmp: Path, **env) -> Proc:
    """`python -m gateway` on a free port (and its metrics on another), on the test database and Redis; returns
    once /readyz answers."""
    import httpx

    port, metrics_port = free_port(), free_port()
    log = tmp / f"gateway-{port}.log"
    full_env = {**worker_environment(tmp), "TANDEM_KEY_HMAC_SECRET": settings.TANDEM_KEY_HMAC_SECRET,
                "TANDEM_GATEWAY_METRICS_PORT": str(metrics_port), **env}
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "--port", str(port)], cwd=ROOT, env=full_env,
                            stdout=log.open("wb"), stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"gateway exited: {log.read_text()[-3000:]}")
        try:
            if httpx.get(base + "/readyz", timeout=1).status_code == 200:
                return Proc(proc, base, log, f"http://127.0.0.1:{full_env['TANDEM_GATEWAY_METRICS_PORT']}/metrics")
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"gateway did not become ready: {log.read_text()[-3000:]}")


class MinuteClock:
    """A gateway clock (gateway/clock.py) that reads half a second into a minute now: gateways started with `env`
    count rate limits in one window, `window`, for the next 59.5 s of real time, so a test that must stay in one
    window needs no wait for a new minute of the wall clock. Time passes as usual; only the offset is chosen."""

    def __init__(self):
        now = time.time()
        # 0.5 s in, not 0: `now - now % 60` can round to just below the boundary, a minute earlier.
        self.offset = 0.5 - now % 60
        self.window = int((now + self.offset) // 60)
        self.env = {"TANDEM_GATEWAY_CLOCK_OFFSET_S": repr(self.offset)}

    def now(self) -> float:
        """What the gateways' clocks read."""
        return time.time() + self.offset

    def seconds_left(self) -> float:
        """Real seconds until the gateways' window ends."""
        return (self.window + 1) * 60 - self.now()


def _wait_ready(proc: subprocess.Popen, base: str, log: Path, what: str, path: str = "/readyz") -> Proc:
    import httpx

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited: {log.read_text()[-3000:]}")
        try:
            if httpx.get(base + path, timeout=1).status_code == 200:
                return Proc(proc, base, log)
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"{what} did not become ready: {log.read_text()[-3000:]}")


def start_web(tmp: Path, *, workers: int = 1, **env) -> Proc:
    """gunicorn serving the portal and API on a free port, as deploy/ runs it; returns once /readyz answers."""
    port = free_port()
    log = tmp / f"web-{port}.log"
    full_env = {**worker_environment(tmp), "TANDEM_KEY_HMAC_SECRET": settings.TANDEM_KEY_HMAC_SECRET, **env}
    proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "controlplane.wsgi", "--bind", f"127.0.0.1:{port}",
                             "--workers", str(workers), "--graceful-timeout", "20"],
                            cwd=ROOT, env=full_env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    return _wait_ready(proc, f"http://127.0.0.1:{port}", log, "gunicorn")


def start_mock_upstream(tmp: Path, *args: str) -> Proc:
    """bench.mock_upstream on a free port (an OpenAI-shaped upstream: options per deployment URL)."""
    import re

    log = tmp / "mock.log"
    proc = subprocess.Popen([sys.executable, "-m", "bench.mock_upstream", "--port", "0", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=log.open("wb"), text=True)
    line = proc.stdout.readline()
    match = re.search(r":(\d+)$", line.strip())
    if not match:
        proc.kill()
        raise RuntimeError(f"mock upstream did not start: {line!r} {log.read_text()[-2000:]}")
    return Proc(proc, f"http://127.0.0.1:{match[1]}", log)


class RedisServer:
    """A private `redis-server` on a free port, with an append-only file under `tmp`, that a test can kill and
    start again on the same port and data (as a crashed and restarted Redis would come back)."""

    BINARY = "/usr/bin/redis-server"

    def __init__(self, tmp: Path, port: int | None = None):
        self.dir, self.port = tmp, port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self) -> "RedisServer":
        import redis

        self.proc = subprocess.Popen(
            [self.BINARY, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir), "--save", "",
             "--appendonly", "yes", "--appendfsync", "everysec", "--logfile", str(self.dir / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        try:
            wait_for(lambda: _pings(client), timeout=10, what=f"redis-server on port {self.port}")
        finally:
            client.close()
        return self

    def kill(self) -> None:
        """SIGKILL: no shutdown, connections dropped by the kernel; what reached the append-only file stays."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def pause(self) -> None:
        """SIGSTOP: the server hangs with every connection open; nothing answers and nothing is refused."""
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.resume()  # a stopped process would not act on SIGTERM
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


def _pings(client) -> bool:
    import redis

    try:
        return client.ping()
    except redis.RedisError:
        return False
