"""Soak: mixed traffic through the real gateway for a long time, with Redis and PostgreSQL each restarted once.

    .venv/bin/python -m bench.soak [--minutes 60] [--concurrency 12] [--logs DIR]

Everything runs privately: a redis-server and a PostgreSQL cluster (initdb + pg_ctl) on free ports under a temp
directory (the shared servers are never touched), the mock upstream, the gateway (`python -m gateway`) and the
record drain (`python -m usage drain`). Traffic: streamed and non-streamed requests to two deployments, keys
created and revoked, a deployment's endpoint updated. Redis is killed (SIGKILL) and started again at 30% of the
run, PostgreSQL restarted (`pg_ctl restart -m fast`) at 45%. From 55% on, the RSS and open file descriptors of
every process it started are sampled; the run passes when they are flat (last third vs first third of the
samples) and every request that got an answer with a valid key has exactly one usage record. Exit status 1
otherwise. Not part of the suite.
"""
import argparse
import asyncio
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = {"fast": "", "paced": "chunks=16,gap=0.02"}
MAX_STALE_S = 6.0  # the gateway's TANDEM_GATEWAY_KEY_MAX_STALE_S here: longer than a PostgreSQL restart


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sample(pid: int) -> tuple[int, int]:
    """RSS (KiB) and open file descriptors of one process."""
    rss = int(re.search(r"VmRSS:\s+(\d+)", Path(f"/proc/{pid}/status").read_text())[1])
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def spawn(args: list[str], log: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=log.open("wb"),
                            stderr=subprocess.STDOUT)


def setup_world(mock_url: str) -> dict:
    from bench.bench_setup import bench_world

    return bench_world(SCENARIOS, int(mock_url.rsplit(":", 1)[1]))


class Soak:
    def __init__(self, args, gw_url: str, world: dict, redis_server, pg, procs: dict):
        self.args, self.gw, self.world, self.redis, self.pg, self.procs = args, gw_url, world, redis_server, pg, procs
        self.answered: dict[str, int] = {}  # request id -> HTTP status, for answers to a valid key
        self.refused_revoked = self.failed_closed = self.unconfirmed = 0
        self.failures: list[str] = []
        self.events: list[str] = []
        self.samples: dict[str, list[tuple[int, int]]] = {}
        self.count = 0
        self.keys = [world["raw_key"], world["limited_key"]]

    async def one(self, client, raw: str, stream: bool, scenario: str, *, expect_refusal: bool = False,
                  fresh_key: bool = False):
        import orjson

        self.count += 1
        rid = f"soak-{self.count}"
        body = {"model": self.world["models"][scenario], "stream": stream,
                "messages": [{"role": "user", "content": f"soak {rid}"}]}
        try:
            async with client.post("/v1/chat/completions", data=orjson.dumps(body), headers={
                    "Authorization": f"Bearer {raw}", "Content-Type": "application/json", "X-Request-ID": rid}) as r:
                text = await r.read()
        except Exception as e:  # noqa: BLE001 - a request that got no answer at all is a failure to report
            self.failures.append(f"{rid}: {type(e).__name__}")
            return None
        if r.status == 401 or (expect_refusal and r.status == 503):
            # A revoked key's cache entry is dropped, so while PostgreSQL restarts its next request is a lookup
            # that fails closed (503 store_unavailable): refused either way, and no valid key, so no record.
            if expect_refusal:
                self.refused_revoked += r.status == 401
                self.failed_closed += r.status == 503
            else:
                self.failures.append(f"{rid}: 401 for a live key")
            return r.status
        if fresh_key and r.status == 503 and b"store_unavailable" in text:
            # A key the gateway has never seen, while PostgreSQL restarts: it cannot confirm it, so it refuses
            # (documented); the key was never authenticated, so there is no usage record either.
            self.unconfirmed += 1
            return r.status
        self.answered[rid] = r.status
        ok = r.status == 200 and (not stream or text.rstrip().endswith(b"data: [DONE]")) and b'"error"' not in text
        if not ok:
            self.failures.append(f"{rid}: {r.status} {text[:160]!r}")
        return r.status

    async def traffic(self, client, stop: asyncio.Event, i: int):
        while not stop.is_set():
            n = self.count
            await self.one(client, self.keys[n % len(self.keys)], n % 2 == 0, "paced" if n % 3 else "fast")

    async def churn(self, client, stop: asyncio.Event):
        """Every few seconds: a new key is made and used; the previous one is revoked and must be refused."""
        from django.db import close_old_connections

        from deployments.models import ApiKey, Deployment, Team
        from deployments.services.api_keys import api_key_create, api_key_revoke

        def make():
            close_old_connections()
            team = Team.objects.get(slug=self.world["team"])
            return api_key_create(actor=team.memberships.first().user, team=team, name="soak-churn")

        def revoke(key):
            close_old_connections()
            api_key_revoke(actor=None, key=ApiKey.objects.get(pk=key.pk))

        def update_deployment(gap: float):
            close_old_connections()
            d = Deployment.objects.get(model_id=self.world["models"]["paced"])
            d.endpoint_url = re.sub(r"gap=[0-9.]+", f"gap={gap}", d.endpoint_url)
            d.save(update_fields=["endpoint_url", "updated_at"])

        previous = None
        turn = 0
        while not stop.is_set():
            await asyncio.sleep(3)
            turn += 1
            try:
                key, raw = await asyncio.to_thread(make)
                for _ in range(3):
                    await self.one(client, raw, turn % 2 == 0, "fast", fresh_key=True)
                if previous is not None:
                    await asyncio.to_thread(revoke, previous[0])
                    revoked_at = time.monotonic()
                    # Pub/sub makes it at once; with Redis away, PostgreSQL's word within the staleness limit.
                    while await self.one(client, previous[1], False, "fast", expect_refusal=True) != 401:
                        if time.monotonic() - revoked_at > MAX_STALE_S + 2:
                            self.failures.append(f"a key revoked {MAX_STALE_S + 2:.0f} s ago is still served")
                            break
                        await asyncio.sleep(0.5)
                previous = (key, raw)
                await asyncio.to_thread(update_deployment, 0.02 if turn % 2 else 0.01)
            except Exception as e:  # noqa: BLE001 - PostgreSQL restarting: this turn is skipped, and said so
                self.events.append(f"churn turn {turn} skipped: {type(e).__name__}")

    async def faults_and_samples(self, stop: asyncio.Event, seconds: float):
        import httpx

        start = time.monotonic()
        redis_at, pg_at, measure_from = 0.30 * seconds, 0.45 * seconds, 0.55 * seconds
        done_redis = done_pg = False
        async with httpx.AsyncClient(base_url=self.gw) as probe:
            while (elapsed := time.monotonic() - start) < seconds:
                if not done_redis and elapsed >= redis_at:
                    done_redis = True
                    self.redis.kill()
                    await asyncio.sleep(3)
                    self.redis.start()
                    t0 = time.monotonic()
                    while (await probe.get("/readyz")).status_code != 200:
                        await asyncio.sleep(0.05)
                    self.events.append(f"redis killed for 3 s; gateway ready {time.monotonic() - t0:.2f} s after "
                                       "it was back")
                if not done_pg and elapsed >= pg_at:
                    done_pg = True
                    t0 = time.monotonic()
                    await asyncio.to_thread(self.pg.restart)
                    self.events.append(f"postgres restarted (pg_ctl restart -m fast, {time.monotonic() - t0:.2f} s)")
                if elapsed >= measure_from:
                    for name, pid in self.pids().items():
                        self.samples.setdefault(name, []).append(sample(pid))
                await asyncio.sleep(5)
        stop.set()

    def pids(self) -> dict[str, int]:
        return {**{name: p.pid for name, p in self.procs.items()}, "redis-server": self.redis.proc.pid,
                "postgres (postmaster)": int((self.pg.data / "postmaster.pid").read_text().split()[0])}

    async def run(self):
        import aiohttp

        stop = asyncio.Event()
        async with aiohttp.ClientSession(self.gw, timeout=aiohttp.ClientTimeout(total=60)) as client:
            tasks = [asyncio.ensure_future(self.traffic(client, stop, i)) for i in range(self.args.concurrency)]
            tasks.append(asyncio.ensure_future(self.churn(client, stop)))
            await self.faults_and_samples(stop, self.args.minutes * 60)
            await asyncio.gather(*tasks)

    def flatness(self) -> tuple[bool, list[str]]:
        lines, flat = [], True
        for name, values in self.samples.items():
            third = max(1, len(values) // 3)
            rss0, rss1 = (statistics.median(v[0] for v in part) for part in (values[:third], values[-third:]))
            fd0, fd1 = (statistics.median(v[1] for v in part) for part in (values[:third], values[-third:]))
            ok = rss1 - rss0 <= max(0.05 * rss0, 4096) and fd1 - fd0 <= 5
            flat &= ok
            lines.append(f"  {name:24} RSS {rss0 / 1024:7.1f} -> {rss1 / 1024:7.1f} MiB   fds {fd0:5.0f} -> "
                         f"{fd1:5.0f}   {'flat' if ok else 'GROWING'}   ({len(values)} samples)")
        return flat, lines


def accounting(answered: dict[str, int], timeout: float = 60) -> tuple[int, int, int]:
    """(lost, duplicated, records) once the drain has caught up: every answered request id against its records."""
    from django.db import close_old_connections
    from django.db.models import Count

    from usage.models import RequestRecord

    deadline = time.monotonic() + timeout
    while True:
        close_old_connections()
        rows = dict(RequestRecord.objects.filter(client_request_id__startswith="soak-")
                    .values_list("client_request_id").annotate(n=Count("id")))
        lost = [rid for rid in answered if rid not in rows]
        if not lost or time.monotonic() > deadline:
            duplicated = sum(n - 1 for n in rows.values())
            return len(lost), duplicated, sum(rows.values())
        time.sleep(1)


def main():
    parser = argparse.ArgumentParser(prog="python -m bench.soak")
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--concurrency", type=int, default=12)
    parser.add_argument("--logs", help="where the processes' logs go (default: a temp directory, kept)")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="tandem-soak-"))
    logs = Path(args.logs) if args.logs else base
    logs.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT))
    import psycopg

    from tests.support.private_pg import PrivatePostgres
    from tests.support.processes import RedisServer

    pg = PrivatePostgres().start()
    with psycopg.connect(pg.url(), autocommit=True) as conn:
        conn.execute("CREATE DATABASE soak")

    (base / "redis").mkdir()
    redis_server = RedisServer(base / "redis").start()
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "controlplane.settings.test", "DATABASE_URL": pg.url("soak"),
           "REDIS_URL": redis_server.url, "CELERY_BROKER_URL": redis_server.url, "PYTHONPATH": str(ROOT)}
    os.environ.update({k: env[k] for k in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "REDIS_URL",
                                           "CELERY_BROKER_URL")})
    import django

    django.setup()
    from django.conf import settings

    procs: dict[str, subprocess.Popen] = {}
    try:
        mock = subprocess.Popen([sys.executable, "-m", "bench.mock_upstream", "--port", "0"], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=(logs / "mock.log").open("wb"), text=True)
        procs["mock upstream"] = mock
        mock_url = "http://127.0.0.1:" + mock.stdout.readline().strip().rsplit(":", 1)[1]
        world = setup_world(mock_url)
        from deployments.models import Team

        world["team"] = Team.objects.order_by("-pk").first().slug
        port = free_port()
        gw_env = {**env, "TANDEM_KEY_HMAC_SECRET": settings.TANDEM_KEY_HMAC_SECRET,
                  "TANDEM_GATEWAY_METRICS_PORT": str(free_port()), "TANDEM_GATEWAY_ACCESS_LOG": "0",
                  "TANDEM_GATEWAY_KEY_MAX_STALE_S": str(MAX_STALE_S)}
        procs["gateway"] = spawn(["-m", "gateway", "--port", str(port)], logs / "gateway.log", gw_env)
        procs["drain"] = spawn(["-m", "usage", "drain", "--interval", "0.5"], logs / "drain.log", gw_env)
        import httpx

        gw_url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(gw_url + "/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                sys.exit(f"the gateway did not start; see {logs / 'gateway.log'}")
            time.sleep(0.2)
        soak = Soak(args, gw_url, world, redis_server, pg, procs)
        started = time.monotonic()
        import uvloop

        uvloop.run(soak.run())
        took = time.monotonic() - started
        lost, duplicated, records = accounting(soak.answered)
        flat, lines = soak.flatness()
        print(f"soak: {took / 60:.1f} min, {len(soak.answered)} requests answered for a valid key "
              f"({sum(s == 200 for s in soak.answered.values())} 200s), {soak.refused_revoked} refused after "
              f"revocation ({soak.failed_closed} more got 503 while PostgreSQL restarted), {soak.unconfirmed} 503s "
              f"for a new key PostgreSQL could not confirm yet, {len(soak.failures)} failures")
        for event in soak.events:
            print(f"  {event}")
        for failure in soak.failures[:10]:
            print(f"  failure: {failure}")
        print(f"usage records: {records} for {len(soak.answered)} answered requests; lost {lost}, duplicated "
              f"{duplicated}")
        print("RSS and open fds after warm-up (median of the first third of samples -> of the last third):")
        print("\n".join(lines))
        print(f"logs: {logs}")
        ok = flat and lost == 0 and duplicated == 0 and not soak.failures
        print("PASS" if ok else "FAIL")
        sys.exit(0 if ok else 1)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
        redis_server.stop()
        pg.stop()


if __name__ == "__main__":
    main()
