"""Redis stops while the gateway serves traffic: a private redis-server under a real gateway process is killed
(SIGKILL) under load and started again on the same port and data, as a crashed Redis comes back."""
import asyncio
import time

import aiohttp
import httpx
import orjson
import pytest
from django.db import connection

from gateway.models import RequestRecord
from gateway.tasks import drain_request_records
from tests.gateway.conftest import start_gateway, wait_until
from tests.support.processes import RedisServer

MAX_STALE_S = 2.0  # the gateway's staleness limit in this test (TANDEM_GATEWAY_KEY_MAX_STALE_S)
CHUNKS = 8  # the session's mock upstream sends this many content chunks


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


def test_redis_killed_under_load_loses_no_request_and_no_record(world, tmp_path, private_redis, api, mock_requests):
    world.deployment("ro-fast")
    world.deployment("ro-slow", options="gap=0.1")  # streams of about 0.7 s: some are in flight when Redis dies
    key, raw = world.key(requests_per_minute=100_000)  # a limited key: the limiter's Redis path is exercised
    doomed, doomed_raw = world.key()
    gw = start_gateway(tmp_path, REDIS_URL=private_redis.url, CELERY_BROKER_URL=private_redis.url,
                       TANDEM_GATEWAY_KEY_MAX_STALE_S=str(MAX_STALE_S))
    api.force_authenticate(world.member)
    marks: dict[str, float] = {}

    def revoke_through_the_api() -> int:
        try:
            return api.delete(f"/api/v1/api-keys/{doomed.pk}/").status_code
        finally:
            connection.close()  # this thread's own connection
    results: list[dict] = []

    async def scenario():
        stop = asyncio.Event()
        count = iter(range(10**6))
        async with aiohttp.ClientSession(gw.base_url, timeout=aiohttp.ClientTimeout(total=20)) as client:
            async def worker(stream: bool):
                while not stop.is_set():
                    n = next(count)
                    results.append(await _one(client, raw, "ro-slow" if stream else "ro-fast", f"ro-{n}", stream))

            async def doomed_key():
                while not stop.is_set():
                    r = await _one(client, doomed_raw, "ro-fast", f"rb-{next(count)}", False)
                    if r["status"] == 401 and "revoked_refused" not in marks and "revoked" in marks:
                        marks["revoked_refused"] = r["ended"]
                    await asyncio.sleep(0.05)

            tasks = [asyncio.ensure_future(worker(i % 2 == 0)) for i in range(8)]
            tasks.append(asyncio.ensure_future(doomed_key()))
            await asyncio.sleep(1.0)
            private_redis.kill()
            marks["killed"] = time.monotonic()
            await asyncio.sleep(0.5)
            # Revoked through the API while Redis is down: the announcement is lost, the revocation is not.
            marks["revoke_call"] = time.monotonic()
            marks["revoke_status"] = await asyncio.to_thread(revoke_through_the_api)
            marks["revoked"] = time.monotonic()
            await asyncio.sleep(2.0)
            private_redis.start()
            marks["restarted"] = time.monotonic()
            async with httpx.AsyncClient(base_url=gw.base_url) as probe:
                while (await probe.get("/readyz")).status_code != 200:
                    await asyncio.sleep(0.05)
            marks["ready"] = time.monotonic()
            await asyncio.sleep(1.0)
            stop.set()
            await asyncio.gather(*tasks)

    try:
        asyncio.run(scenario())
        assert marks["revoke_status"] == 204  # the user's revocation succeeded with Redis down
        failed = [r for r in results if not r["complete"]]
        assert not failed, failed[:5]
        in_flight = [r for r in results if r["started"] < marks["killed"] < r["ended"] and r["stream"]]
        during = [r for r in results if marks["killed"] < r["started"] < marks["restarted"]]
        assert in_flight and len(during) > 20, (len(in_flight), len(during))
        # Revoked during the outage: refused within the staleness limit (PostgreSQL confirms every key), and
        # still refused once Redis is back.
        assert "revoked_refused" in marks, "the key revoked during the outage was never refused"
        refused_after = marks["revoked_refused"] - marks["revoked"]
        assert refused_after < MAX_STALE_S + 0.5, refused_after
        assert httpx.post(gw.base_url + "/v1/chat/completions", json={"model": "ro-fast", "messages": []},
                          headers={"Authorization": f"Bearer {doomed_raw}"}).status_code == 401

        # Every completed request reaches PostgreSQL exactly once, with upstream's counts.
        made = {r["rid"] for r in results}

        def drained():
            drain_request_records()
            return RequestRecord.objects.filter(client_request_id__startswith="ro-").count() >= len(made)

        assert wait_until(drained, timeout=20, interval=0.2)
        records = list(RequestRecord.objects.filter(client_request_id__startswith="ro-"))
        by_client = {r.client_request_id for r in records}
        lost, duplicated = made - by_client, len(records) - len(by_client)
        assert (len(lost), duplicated) == (0, 0), (sorted(lost)[:5], duplicated)
        upstream = mock_requests()
        wrong = [r.client_request_id for r in records if r.status_code != 200 or r.partial or r.api_key_id != key.pk
                 or (r.prompt_tokens, r.completion_tokens) != (upstream[r.request_id]["usage"]["prompt_tokens"],
                                                               upstream[r.request_id]["usage"]["completion_tokens"])]
        assert not wrong, wrong[:5]
        slowest = max(r["ended"] - r["started"] for r in during if not r["stream"])
        print(f"redis outage: {len(made)} requests ({len(in_flight)} streams in flight at the kill, {len(during)} "
              f"started during the outage), 0 failed, lost {len(lost)}, duplicated {duplicated}; revoked key refused "
              f"{refused_after:.2f} s after revocation (API call {marks['revoked'] - marks['revoke_call']:.2f} s); "
              f"/readyz back {marks['ready'] - marks['restarted']:.2f} s after Redis; slowest non-streamed answer "
              f"during the outage {slowest:.2f} s")
    finally:
        gw.stop()


HUNG_ANSWER_BOUND_S = 1.5  # a non-streamed answer while Redis hangs: its usual few ms plus the gateway's wait


def test_redis_that_hangs_under_load_neither_hangs_requests_nor_loses_records(world, tmp_path, private_redis, api,
                                                                              mock_requests):
    """SIGSTOP, not a crash: Redis keeps every connection open and answers nothing, so nothing fails fast. The
    gateway must not wait on it on the request path (rate limits fail open), and what it could not write
    reaches the database once Redis answers again, once each."""
    world.deployment("rh-fast")
    world.deployment("rh-slow", options="gap=0.1")
    key, raw = world.key(requests_per_minute=100_000)  # a limited key: the limiter reads Redis when it is stale
    doomed, doomed_raw = world.key()
    gw = start_gateway(tmp_path, REDIS_URL=private_redis.url, CELERY_BROKER_URL=private_redis.url,
                       TANDEM_GATEWAY_KEY_MAX_STALE_S=str(MAX_STALE_S))
    api.force_authenticate(world.member)
    marks: dict[str, float] = {}
    results: list[dict] = []

    def revoke_through_the_api() -> int:
        try:
            return api.delete(f"/api/v1/api-keys/{doomed.pk}/").status_code
        finally:
            connection.close()

    async def scenario():
        stop = asyncio.Event()
        count = iter(range(10**6))
        async with aiohttp.ClientSession(gw.base_url, timeout=aiohttp.ClientTimeout(total=20)) as client:
            async def worker(stream: bool):
                while not stop.is_set():
                    n = next(count)
                    results.append(await _one(client, raw, "rh-slow" if stream else "rh-fast", f"rh-{n}", stream))
                    await asyncio.sleep(0.6 if not stream else 0)  # some keys' counts go stale: Redis is read

            async def doomed_key():
                while not stop.is_set():
                    r = await _one(client, doomed_raw, "rh-fast", f"rd-{next(count)}", False)
                    if r["status"] == 401 and "revoked_refused" not in marks and "revoked" in marks:
                        marks["revoked_refused"] = r["ended"]
                    await asyncio.sleep(0.05)

            tasks = [asyncio.ensure_future(worker(i % 2 == 0)) for i in range(8)]
            tasks.append(asyncio.ensure_future(doomed_key()))
            await asyncio.sleep(1.0)
            private_redis.pause()
            marks["hung"] = time.monotonic()
            await asyncio.sleep(0.5)
            marks["revoke_status"] = await asyncio.to_thread(revoke_through_the_api)
            marks["revoked"] = time.monotonic()
            await asyncio.sleep(max(0.0, marks["hung"] + 4.0 - time.monotonic()))
            private_redis.resume()
            marks["resumed"] = time.monotonic()
            await asyncio.sleep(1.5)
            stop.set()
            await asyncio.gather(*tasks)

    try:
        asyncio.run(scenario())
        assert marks["revoke_status"] == 204, marks
        failed = [r for r in results if not r["complete"]]
        assert not failed, failed[:5]
        during = [r for r in results if marks["hung"] < r["started"] < marks["resumed"] and not r["stream"]]
        slowest = max(r["ended"] - r["started"] for r in during)
        assert slowest < HUNG_ANSWER_BOUND_S, slowest  # a request waiting on Redis waits until it answers again
        assert len(during) > 10, len(during)
        assert "revoked_refused" in marks, "the key revoked while Redis hung was never refused"
        refused_after = marks["revoked_refused"] - marks["revoked"]
        assert refused_after < MAX_STALE_S + 0.5, refused_after

        made = {r["rid"] for r in results}

        def drained():
            drain_request_records()
            return RequestRecord.objects.filter(client_request_id__startswith="rh-").count() >= len(made)

        assert wait_until(drained, timeout=20, interval=0.2)
        time.sleep(0.5)  # anything written twice would have reached the database by now
        drain_request_records()
        records = list(RequestRecord.objects.filter(client_request_id__startswith="rh-"))
        by_client = {r.client_request_id for r in records}
        lost, duplicated = made - by_client, len(records) - len(by_client)
        assert (len(lost), duplicated) == (0, 0), (sorted(lost)[:5], duplicated)
        upstream = mock_requests()
        wrong = [r.client_request_id for r in records if r.status_code != 200 or r.api_key_id != key.pk
                 or r.completion_tokens != upstream[r.request_id]["usage"]["completion_tokens"]]
        assert not wrong, wrong[:5]
        print(f"redis hung {marks['resumed'] - marks['hung']:.1f} s: {len(made)} requests ({len(during)} non-streamed "
              f"during the hang, slowest {slowest:.2f} s), 0 failed, lost {len(lost)}, duplicated {duplicated}; "
              f"revoked key refused {refused_after:.2f} s after revocation")
    finally:
        gw.stop()
