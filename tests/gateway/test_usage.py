"""Usage accounting: one record per request matching upstream's counts, the drain, the usage API, metrics."""
import asyncio
import time

import httpx
import orjson
from openai import AsyncOpenAI

from controlplane.record_stream import RECORD_STREAM
from deployments.models import ApiKey
from tests.factories import MembershipFactory, UserFactory
from tests.gateway.conftest import drained
from tests.support.processes import wait_for
from usage.models import RequestRecord
from usage.tasks import drain_request_records

TOTAL = 10_000
CONCURRENCY = 48


async def _run_many(base_url: str, raw: str) -> set[str]:
    """TOTAL requests (half streamed, some with usage asked) with our own request ids; returns completed ids."""
    client = AsyncOpenAI(base_url=base_url + "/v1", api_key=raw, max_retries=0, timeout=30)
    queue = iter(range(TOTAL))
    done: set[str] = set()

    async def worker():
        for i in queue:
            rid = f"bulk-{i}"
            words = " ".join(["w"] * (1 + i % 7))
            messages = [{"role": "user", "content": words}]
            if i % 2:
                stream = await client.chat.completions.create(
                    model="bulk", messages=messages, stream=True, max_tokens=1 + i % 5,
                    stream_options={"include_usage": True} if i % 4 == 1 else None,
                    extra_headers={"X-Request-ID": rid})
                async for _ in stream:
                    pass
            else:
                await client.chat.completions.create(model="bulk", messages=messages, max_tokens=1 + i % 5,
                                                     extra_headers={"X-Request-ID": rid})
            done.add(rid)

    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    await client.close()
    return done


def test_ten_thousand_requests_each_have_exactly_one_matching_record(world, gateway, mock_requests, redis_client):
    world.deployment("bulk")
    key, raw = world.key()
    started = time.monotonic()
    completed = asyncio.run(_run_many(gateway.base_url, raw))
    assert len(completed) == TOTAL
    upstream = mock_requests()

    def all_drained():
        drain_request_records()
        return RequestRecord.objects.filter(client_request_id__startswith="bulk-").count() >= TOTAL

    wait_for(all_drained, timeout=60, every=0.2)
    records = {r.client_request_id: r for r in RequestRecord.objects.filter(client_request_id__startswith="bulk-")}
    assert set(records) == completed
    assert len({r.request_id for r in records.values()}) == TOTAL and all(r.request_id in upstream
                                                                          for r in records.values())
    mismatched = [rid for rid, r in records.items()
                  if (r.prompt_tokens, r.completion_tokens) != (upstream[r.request_id]["usage"]["prompt_tokens"],
                                                                upstream[r.request_id]["usage"]["completion_tokens"])
                  or r.partial or r.status_code != 200 or r.api_key_id != key.pk]
    assert not mismatched, mismatched[:5]
    streamed = [r for r in records.values() if r.stream]
    assert len(streamed) == TOTAL // 2 and all(r.ttft_ms is not None and r.e2e_ms >= r.ttft_ms for r in streamed)
    key.refresh_from_db()
    assert key.last_used_at is not None
    assert redis_client.xlen(RECORD_STREAM) == 0
    print(f"{TOTAL} requests through the gateway and drained in {time.monotonic() - started:.1f}s")


def _record(request_id: str, key_pk: int, dep_pk: int, **fields) -> bytes:
    base = {"request_id": request_id, "created_at": time.time(), "endpoint": "chat.completions", "stream": False,
            "model": "m", "api_key_id": key_pk, "key_id": "x", "deployment_id": dep_pk, "status_code": 200,
            "error_type": "", "prompt_tokens": 3, "completion_tokens": 5, "partial": False, "ttft_ms": None,
            "e2e_ms": 1.0, "mean_itl_ms": None, "max_itl_ms": None, "bytes_out": 10}
    return orjson.dumps({**base, **fields})


def test_drain_is_idempotent_for_redelivered_records(world, redis_client):
    dep = world.deployment("m")
    key, _ = world.key()
    for _ in range(2):  # as if a drainer inserted, died before acknowledging, and the entry came back
        redis_client.xadd(RECORD_STREAM, {"r": _record("dup-1", key.pk, dep.pk)})
    redis_client.xadd(RECORD_STREAM, {"r": _record("gone-key", 10**9, dep.pk)})
    assert drain_request_records() == 3
    assert RequestRecord.objects.filter(request_id="dup-1").count() == 1
    assert RequestRecord.objects.get(request_id="gone-key").api_key_id is None
    assert drain_request_records() == 0


def test_usage_api_totals_per_key_for_team_members_only(world, gateway, api):
    dep = world.deployment("m")
    key_a, raw_a = world.key()
    _, raw_b = world.key()
    for raw, n in ((raw_a, 3), (raw_b, 1)):
        for _ in range(n):
            httpx.post(gateway.base_url + "/v1/chat/completions", headers={"Authorization": f"Bearer {raw}"},
                       json={"model": "m", "messages": [{"role": "user", "content": "a b"}]}).raise_for_status()
    def all_four():
        drain_request_records()
        return RequestRecord.objects.count() >= 4

    wait_for(all_four, timeout=5)
    api.force_authenticate(world.member)
    r = api.get(f"/api/v1/usage/?deployment={dep.pk}&window=24h")
    assert r.status_code == 200
    assert r.json()[0] == {"api_key": key_a.key_id, "name": "k", "requests": 3, "prompt_tokens": 6,
                           "completion_tokens": 24, "partial": 0}
    assert r.json()[1]["requests"] == 1
    assert api.get(f"/api/v1/usage/?deployment={dep.pk}&window=1y").status_code == 400
    assert api.get("/api/v1/usage/?deployment=abc").status_code == 400
    api.force_authenticate(UserFactory())
    assert api.get(f"/api/v1/usage/?deployment={dep.pk}&window=24h").status_code == 404
    other = MembershipFactory().user
    api.force_authenticate(other)
    assert api.get(f"/api/v1/usage/?deployment={dep.pk}").status_code == 404


def test_metrics_by_deployment(world, gateway):
    dep = world.deployment("m")
    _, raw = world.key()
    httpx.post(gateway.base_url + "/v1/chat/completions", headers={"Authorization": f"Bearer {raw}"},
               json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "a"}]}).raise_for_status()

    def scraped():
        text = httpx.get(gateway.metrics_url).text
        # The recorder thread creates a deployment's series before it counts into them, so a scrape can land
        # between the two: wait for the TTFT count, which is observed last, to reach one.
        return text if f'tandem_gateway_ttft_seconds_count{{deployment="{dep.pk}"}} 1.0' in text else None

    text = wait_for(scraped, timeout=3)
    assert text, "no TTFT series for the deployment"
    assert f'tandem_gateway_requests_total{{deployment="{dep.pk}",endpoint="chat.completions",status="200"}}' in text
    assert f'tandem_gateway_tokens_total{{deployment="{dep.pk}",kind="completion"}}' in text


def test_last_used_at_is_updated(world, gateway):
    world.deployment("m")
    key, raw = world.key()
    assert key.last_used_at is None
    httpx.post(gateway.base_url + "/v1/chat/completions", headers={"Authorization": f"Bearer {raw}"},
               json={"model": "m", "messages": [{"role": "user", "content": "a"}]}).raise_for_status()
    def used():
        drain_request_records()
        return ApiKey.objects.get(pk=key.pk).last_used_at

    wait_for(used, timeout=5)


def test_access_log_has_one_json_line_per_request_matching_its_record(world, gateway, mock_requests):
    """The gateway's access log (its stderr, which production ships as container logs) carries one JSON line per
    request, with the counts its usage record has, and never the key."""
    dep = world.deployment("logged")
    key, raw = world.key()
    for i, stream in enumerate((False, True, False)):
        httpx.post(gateway.base_url + "/v1/chat/completions",
                   headers={"Authorization": f"Bearer {raw}", "X-Request-ID": f"logged-{i}"},
                   json={"model": "logged", "stream": stream, "max_tokens": 3 + i,
                         "messages": [{"role": "user", "content": "a b c"}]}).raise_for_status()
    records = [drained(f"logged-{i}") for i in range(3)]

    def logged():
        lines = {}
        for line in gateway.log.read_bytes().splitlines():
            if line.startswith(b"{") and b'"logger":"gateway.access"' in line:
                entry = orjson.loads(line)
                if entry["client_request_id"] in {r.client_request_id for r in records}:
                    lines[entry["client_request_id"]] = entry
        return lines if len(lines) == 3 else None

    lines = wait_for(logged, timeout=5)
    assert lines, "the access log has no line for some of the requests"
    for record in records:
        entry = lines[record.client_request_id]
        upstream = mock_requests(record.request_id)["usage"]
        assert (entry["request_id"], entry["status"], entry["deployment"], entry["key_id"], entry["stream"]) == (
            record.request_id, 200, dep.pk, key.key_id, record.stream)
        assert (entry["prompt_tokens"], entry["completion_tokens"]) == (
            upstream["prompt_tokens"], upstream["completion_tokens"]) == (record.prompt_tokens,
                                                                          record.completion_tokens)
        assert entry["completion_tokens"] > 0 and (entry["ttft_ms"] is not None) == record.stream
    assert raw.encode() not in gateway.log.read_bytes()
