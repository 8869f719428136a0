"""Redis fails while the gateway serves traffic: a private redis-server under a real gateway process is killed
(SIGKILL) under load and started again on the same port and data, as a crashed Redis comes back, or stopped
(SIGSTOP) and let go again, as a hung one is."""
import asyncio
import signal
import time

import aiohttp
import httpx
import orjson
import pytest
from django.db import connection

from tests.gateway.conftest import start_gateway
from tests.support.processes import RedisServer, wait_for
from usage.models import RequestRecord
from usage.tasks import drain_request_records

MAX_STALE_S = 2.0  # the gateway's staleness limit in this test (TANDEM_GATEWAY_KEY_MAX_STALE_S)
CHUNKS = 8  # the session's mock upstream sends this many content chunks
HANG_S = 4.0  # how long Redis hangs
# A non-streamed answer while Redis hangs: its usual few ms plus the limiter's one wait for Redis (READ_WAIT_S,
# 0.25 s). A request that waited on the hung Redis instead would take until it answers again: up to HANG_S. On a
# loaded 2-core machine, with 8 clients, the gateway and the mock sharing both cores niced, an answer waits for a
# core a few scheduler periods at most (tens of ms each; the slowest in three runs at load 3-7 was 0.02 s), so
# 2.0 s is far above that and still half of what a request stuck on Redis takes.
HUNG_ANSWER_BOUND_S = 2.0
# The revoked key: the gateway reloads a cached key from PostgreSQL (which is up) in the background once it is
# half MAX_STALE_S old, and never serves it past MAX_STALE_S unconfirmed; so refused within MAX_STALE_S of the
# revocation, plus the reload's one query and the client's next poll (50 ms), each delayed by the wait for a core
# under load (0.01-0.35 s in three runs of each test at load 3-7). A lost revocation is never refused at all.
REFUSED_BOUND_S = MAX_STALE_S + 1.0
GIVE_UP_S = 30.0  # how long the doomed key's client keeps asking after the load stops, before the check fails


@pytest.fixture
def private_redis(tmp_path, settings):
    """A redis-server of this test's own; this process (drain, revocation announcements) uses it too."""
    server = RedisServer(tmp_path).start()
    settings.REDIS_URL = settings.CELERY_BROKER_URL = server.url
    yield server
    server.stop()


async def _one(client: aiohttp.ClientSession, raw: str, model: str, rid: str, stream: bool) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": f"hello {rid}"}], "stream": stream,
            "max_tokens": 50}
    started = time.monotonic()
    async with client.post("/v1/chat/completions", data=orjson.dumps(body), headers={
            "Authorization": f"Bearer {raw}", "Content-Type": "application/json", "X-Request-ID": rid}) as r:
        text = await r.read()
    if stream:
        complete = text.rstrip().endswith(b"data: [DONE]") and text.count(b'"content":"tok') == CHUNKS \
            and b'"error"' not in text
    else:
        complete = r.status == 200 and orjson.loads(text)["choices"][0]["message"]["content"].count("tok") == CHUNKS
    return {"rid": rid, "status": r.status, "complete": complete, "stream": stream, "started": started,
            "ended": time.monotonic()}


class Outage:
    """A gateway on the private Redis, two deployments on the mock (one streaming slowly), a limited key under
    load from 8 clients (half streaming) and a doomed key revoked through the API during the fault."""

    def __init__(self, world, tmp_path, private_redis, api, *, prefix: str):
        self.prefix, self.redis = prefix, private_redis
        world.deployment(f"{prefix}-fast")
        world.deployment(f"{prefix}-slow", options="gap=0.1")  # streams of about 0.7 s: some in flight at the fault
        self.key, self.raw = world.key(requests_per_minute=100_000)  # a limited key: the limiter's Redis path
        self.doomed, self.doomed_raw = world.key()
        self.gw = start_gateway(tmp_path, REDIS_URL=private_redis.url, CELERY_BROKER_URL=private_redis.url,
                                TANDEM_GATEWAY_KEY_MAX_STALE_S=str(MAX_STALE_S))
        self.api = api
        api.force_authenticate(world.member)
        self.marks: dict[str, float] = {}
        self.results: list[dict] = []

    def _revoke(self) -> int:
        try:
            return self.api.delete(f"/api/v1/api-keys/{self.doomed.pk}/").status_code
        finally:
            connection.close()  # this thread's own connection

    async def revoke(self) -> None:
        """Revoke the doomed key through the API (from a thread: the web's view is synchronous)."""
        self.marks["revoke_call"] = time.monotonic()
        self.marks["revoke_status"] = await asyncio.to_thread(self._revoke)
        self.marks["revoked"] = time.monotonic()

    def run(self, fault, *, pause_s: float = 0.0) -> None:
        """Load for 1 s, then `fault(self)` (a coroutine), then 1 s more. Non-streaming clients wait `pause_s`
        between requests (a key's counts go stale, so the limiter reads Redis)."""
        marks, results, prefix = self.marks, self.results, self.prefix

        async def scenario():
            stop = asyncio.Event()
            count = iter(range(10**6))
            async with aiohttp.ClientSession(self.gw.base_url, timeout=aiohttp.ClientTimeout(total=20)) as client:
                async def worker(stream: bool):
                    while not stop.is_set():
                        model = f"{prefix}-slow" if stream else f"{prefix}-fast"
                        results.append(await _one(client, self.raw, model, f"{prefix}-{next(count)}", stream))
                        await asyncio.sleep(0 if stream else pause_s)

                async def doomed_key():
                    """Asks with the doomed key until it is refused (or GIVE_UP_S after the load stops)."""
                    while "revoked_refused" not in marks:
                        if stop.is_set() and time.monotonic() - marks["revoked"] > GIVE_UP_S:
                            return
                        r = await _one(client, self.doomed_raw, f"{prefix}-fast", f"x{prefix}-{next(count)}", False)
                        if r["status"] == 401 and "revoked_refused" not in marks and "revoked" in marks:
                            marks["revoked_refused"] = r["ended"]
                        await asyncio.sleep(0.05)

                tasks = [asyncio.ensure_future(worker(i % 2 == 0)) for i in range(8)]
                tasks.append(asyncio.ensure_future(doomed_key()))
                await asyncio.sleep(1.0)
                await fault(self)
                await asyncio.sleep(1.0)
                stop.set()
                await asyncio.gather(*tasks)

        asyncio.run(scenario())

    def check_requests_and_revocation(self) -> float:
        """Every request complete, the revocation answered 204, and the revoked key refused within the staleness
        limit: how long after the revocation it was refused."""
        assert self.marks["revoke_status"] == 204, self.marks
        failed = [r for r in self.results if not r["complete"]]
        assert not failed, failed[:5]
        assert "revoked_refused" in self.marks, f"the key revoked during the fault was still served {GIVE_UP_S} s on"
        refused_after = self.marks["revoked_refused"] - self.marks["revoked"]
        assert refused_after < REFUSED_BOUND_S, refused_after
        return refused_after

    def check_records(self, mock_requests) -> None:
        """Every completed request reaches PostgreSQL exactly once, with upstream's counts."""
        made = {r["rid"] for r in self.results}
        ours = RequestRecord.objects.filter(client_request_id__startswith=f"{self.prefix}-")

        def drained():
            drain_request_records()
            return ours.count() >= len(made)

        wait_for(drained, timeout=20, every=0.2, what=f"{len(made)} records drained")
        # Anything the gateway would still write twice, it writes by its exit (SIGTERM flushes what it holds):
        # once it is gone, one more drain leaves nothing behind. uvicorn re-raises SIGTERM after its graceful
        # shutdown; -SIGKILL would say `stop` had to kill it, flush unfinished.
        self.gw.stop()
        assert self.gw.proc.returncode == -signal.SIGTERM, self.gw.proc.returncode
        drain_request_records()
        records = list(ours)
        by_client = {r.client_request_id for r in records}
        lost, duplicated = made - by_client, len(records) - len(by_client)
        assert (len(lost), duplicated) == (0, 0), (sorted(lost)[:5], duplicated)
        upstream = mock_requests()
        wrong = [r.client_request_id for r in records if r.status_code != 200 or r.partial
                 or r.api_key_id != self.key.pk
                 or (r.prompt_tokens, r.completion_tokens) != (upstream[r.request_id]["usage"]["prompt_tokens"],
                                                               upstream[r.request_id]["usage"]["completion_tokens"])]
        assert not wrong, wrong[:5]

    def during(self, start: str, end: str, *, stream: bool | None = None) -> list[dict]:
        return [r for r in self.results if self.marks[start] < r["started"] < self.marks[end]
                and (stream is None or r["stream"] == stream)]


def test_redis_killed_under_load_loses_no_request_and_no_record(world, tmp_path, private_redis, api, mock_requests):
    outage = Outage(world, tmp_path, private_redis, api, prefix="ro")

    async def kill_and_restart(o: Outage):
        o.redis.kill()
        o.marks["killed"] = time.monotonic()
        await asyncio.sleep(0.5)
        await o.revoke()  # while Redis is down: the announcement is lost, the revocation is not
        await asyncio.sleep(2.0)
        o.redis.start()
        o.marks["restarted"] = time.monotonic()
        async with httpx.AsyncClient(base_url=o.gw.base_url) as probe:
            while (await probe.get("/readyz")).status_code != 200:
                await asyncio.sleep(0.05)
        o.marks["ready"] = time.monotonic()

    try:
        outage.run(kill_and_restart)
        refused_after = outage.check_requests_and_revocation()
        marks = outage.marks
        in_flight = [r for r in outage.results if r["started"] < marks["killed"] < r["ended"] and r["stream"]]
        during = outage.during("killed", "restarted")
        assert in_flight and len(during) > 20, (len(in_flight), len(during))
        # Refused once Redis is back, too.
        assert httpx.post(outage.gw.base_url + "/v1/chat/completions", json={"model": "ro-fast", "messages": []},
                          headers={"Authorization": f"Bearer {outage.doomed_raw}"}).status_code == 401
        outage.check_records(mock_requests)
        slowest = max(r["ended"] - r["started"] for r in during if not r["stream"])
        print(f"redis outage: {len(outage.results)} requests ({len(in_flight)} streams in flight at the kill, "
              f"{len(during)} started during the outage), 0 failed, 0 lost, 0 duplicated; revoked key refused "
              f"{refused_after:.2f} s after revocation (API call {marks['revoked'] - marks['revoke_call']:.2f} s); "
              f"/readyz back {marks['ready'] - marks['restarted']:.2f} s after Redis; slowest non-streamed answer "
              f"during the outage {slowest:.2f} s")
    finally:
        outage.gw.stop()


def test_redis_that_hangs_under_load_neither_hangs_requests_nor_loses_records(world, tmp_path, private_redis, api,
                                                                              mock_requests):
    """SIGSTOP, not a crash: Redis keeps every connection open and answers nothing, so nothing fails fast. The
    gateway must not wait on it on the request path (rate limits fail open), and what it could not write
    reaches the database once Redis answers again, once each."""
    outage = Outage(world, tmp_path, private_redis, api, prefix="rh")

    async def hang_and_let_go(o: Outage):
        o.redis.pause()
        o.marks["hung"] = time.monotonic()
        await asyncio.sleep(0.5)
        await o.revoke()  # the web's announcement times out (2 s); the revocation holds
        await asyncio.sleep(max(0.0, o.marks["hung"] + HANG_S - time.monotonic()))
        o.redis.resume()
        o.marks["resumed"] = time.monotonic()
        await asyncio.sleep(0.5)

    try:
        outage.run(hang_and_let_go, pause_s=0.6)
        refused_after = outage.check_requests_and_revocation()
        during = outage.during("hung", "resumed", stream=False)
        slowest = max(r["ended"] - r["started"] for r in during)
        assert slowest < HUNG_ANSWER_BOUND_S, slowest  # a request waiting on Redis waits until it answers again
        assert len(during) > 10, len(during)
        outage.check_records(mock_requests)
        print(f"redis hung {outage.marks['resumed'] - outage.marks['hung']:.1f} s: {len(outage.results)} requests "
              f"({len(during)} non-streamed during the hang, slowest {slowest:.2f} s), 0 failed, 0 lost, "
              f"0 duplicated; revoked key refused {refused_after:.2f} s after revocation")
    finally:
        outage.gw.stop()
