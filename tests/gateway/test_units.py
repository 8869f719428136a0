"""Pure parts of the gateway: SSE usage handling, request checks, upstream error mapping, the cache."""
import asyncio

import orjson
import pytest

from gateway.cache import MISSING, AsyncCache
from gateway.errors import GatewayError, from_upstream
from gateway.keys import AuthFailures, client_address
from gateway.requests import parse_request, upstream_body
from gateway.streaming import _split_complete, take_usage
from gateway.timing import Record

CHUNK = b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":7,"total_tokens":10}}\n\n'
DONE = b"data: [DONE]\n\n"


@pytest.mark.parametrize("keep", [True, False])
def test_take_usage_reads_counts_and_drops_the_chunk_only_when_not_asked(keep):
    rec = Record("r", "chat.completions")
    out = take_usage(CHUNK + USAGE + DONE, rec, keep)
    assert (rec.prompt_tokens, rec.completion_tokens) == (3, 7)
    assert out == (CHUNK + USAGE + DONE if keep else CHUNK + DONE)


def test_take_usage_leaves_null_usage_and_content_chunks_alone():
    rec = Record("r", "chat.completions")
    data = b'data: {"choices":[{"delta":{"content":"usage"}}],"usage":null}\n\n'
    assert take_usage(data, rec, False) is data
    assert rec.completion_tokens == 0


@pytest.mark.parametrize("data, cut", [(b"data: a\n\ndata: b", 9), (b"data: a", 0), (b"data: a\r\n\r\nda", 11)])
def test_split_complete_finds_the_end_of_the_last_whole_event(data, cut):
    assert _split_complete(data) == cut


def test_upstream_body_asks_for_usage_only_when_streaming_without_it():
    raw = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}'
    data = parse_request(raw, "chat.completions")
    body, keep = upstream_body(raw, data, stream=True)
    assert orjson.loads(body)["stream_options"] == {"include_usage": True} and keep is False
    asked = b'{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user"}]}'
    assert upstream_body(asked, parse_request(asked, "chat.completions"), stream=True) == (asked, True)
    once = b'{"model":"m","messages":[{"role":"user","content":"x"}]}'
    assert upstream_body(once, parse_request(once, "chat.completions"), stream=False) == (once, True)


# What a client might send to steer the serving stack: where decode pulls the KV cache from, an encoder cache's
# peer, another request's id, and the same through vLLM's extra arguments, beside an extension's own argument.
HOSTILE = {"kv_transfer_params": {"do_remote_prefill": True, "do_remote_decode": False, "remote_host": "203.0.113.9",
                                  "remote_port": 5600, "remote_engine_id": "not-ours", "remote_block_ids": [1, 2]},
           "ec_transfer_params": {"remote_host": "203.0.113.9"}, "request_id": "someone-elses-request",
           "vllm_xargs": {"kv_transfer_params": "x", "ec_transfer_params": "x", "kv_cache_report_mode": "full",
                          "my_extension": 3}}


@pytest.mark.parametrize("endpoint, fields, stream", [
    ("chat.completions", {"messages": [{"role": "user", "content": "x"}]}, False),
    ("chat.completions", {"messages": [{"role": "user", "content": "x"}]}, True),
    ("completions", {"prompt": "x"}, False), ("completions", {"prompt": "x"}, True),
    ("embeddings", {"input": "x"}, False),
])
def test_upstream_body_drops_what_only_the_serving_stack_may_set(endpoint, fields, stream):
    raw = orjson.dumps({"model": "m", "stream": stream, **fields, **HOSTILE})
    body, _ = upstream_body(raw, parse_request(raw, endpoint), stream=stream)
    assert orjson.loads(body) == {"model": "m", "stream": stream, **fields, "vllm_xargs": {"my_extension": 3},
                                  **({"stream_options": {"include_usage": True}} if stream else {})}


@pytest.mark.parametrize("body, param", [
    (b'{"messages":[{"role":"user"}]}', "model"),
    (b'{"model":"m"}', "messages"),
    (b'{"model":"m","messages":[{}],"n":0}', "n"),
    (b'{"model":"m","messages":[{}],"max_tokens":true}', "max_tokens"),
])
def test_parse_request_names_the_bad_parameter(body, param):
    with pytest.raises(GatewayError) as info:
        parse_request(body, "chat.completions")
    assert info.value.status == 400 and info.value.param == param


@pytest.mark.parametrize("status, body, expected", [
    (400, b'{"error":{"message":"bad n","type":"BadRequestError","param":null,"code":400}}', 400),
    (422, b'{"detail":"nope"}', 400),
    (404, b'{"detail":"model not found"}', 502),
    (500, b"<html>oops</html>", 502),
    (503, b"", 503),
    (504, b"", 504),
])
def test_upstream_errors_map_to_openai_shaped_statuses(status, body, expected):
    err = from_upstream(status, body)
    assert err.status == expected
    assert set(orjson.loads(err.body())["error"]) >= {"message", "type"}


def test_cache_does_not_keep_a_value_loaded_across_an_invalidation():
    async def scenario():
        release = asyncio.Event()
        calls = []

        async def loader(key):
            calls.append(key)
            await release.wait()
            return f"row-{len(calls)}"

        cache = AsyncCache(loader, ttl=60, max_stale=60, negative_ttl=5, max_entries=100)
        first = asyncio.ensure_future(cache.get("k"))
        await asyncio.sleep(0)
        cache.invalidate("k")  # the key was revoked while its row was being read
        release.set()
        assert await first == "row-1"
        assert await cache.get("k") == "row-2", "the stale row must not have been cached"
        assert len(cache) == 1

    asyncio.run(scenario())


def test_cache_loads_once_for_concurrent_misses():
    async def scenario():
        calls = []

        async def loader(key):
            calls.append(key)
            await asyncio.sleep(0.01)
            return key

        cache = AsyncCache(loader, ttl=60, max_stale=60, negative_ttl=5, max_entries=100)
        assert await asyncio.gather(*(cache.get("k") for _ in range(50))) == ["k"] * 50
        assert calls == ["k"]

    asyncio.run(scenario())


def test_cache_keeps_at_most_max_entries_dropping_the_least_recently_used():
    async def scenario():
        async def loader(key):
            return None if key.startswith("junk") else key

        cache = AsyncCache(loader, ttl=60, max_stale=60, negative_ttl=60, max_entries=100)
        assert await cache.get("hot") == "hot"
        for i in range(10_000):  # a flood of misses, each cached as "no such key"
            await cache.get(f"junk-{i}")
            if i % 50 == 0:
                assert await cache.get("hot") == "hot"  # in use: kept
        assert len(cache) == 100
        assert cache.peek("hot") == "hot" and cache.peek("junk-0") is MISSING

    asyncio.run(scenario())


def test_cache_refuses_a_value_past_max_stale_when_the_loader_fails():
    """Served while a refresh fails within the limit; past it, the loader's error reaches the caller."""

    async def scenario():
        down = False

        async def loader(key):
            if down:
                raise RuntimeError("database away")
            return "row"

        cache = AsyncCache(loader, ttl=0.05, max_stale=0.3, negative_ttl=5, max_entries=10)
        assert await cache.get("k") == "row"
        down = True
        await asyncio.sleep(0.1)
        assert await cache.get("k") == "row"  # stale: served, a refresh starts behind it and fails
        await asyncio.sleep(0.01)
        assert await cache.get("k") == "row"
        await asyncio.sleep(0.3)
        with pytest.raises(RuntimeError):
            await cache.get("k")
        down = False
        assert await cache.get("k") == "row"

    asyncio.run(scenario())


def test_invalidating_one_key_does_not_pin_another_keys_load():
    """A revocation announced while another key is loading (and failing) must not leave that key's failed load
    in place for ever: the next request loads it again."""

    async def scenario():
        release = asyncio.Event()
        fail = True

        async def loader(key):
            await release.wait()
            if fail:
                raise RuntimeError("database away")
            return key

        cache = AsyncCache(loader, ttl=60, max_stale=60, negative_ttl=5, max_entries=10)
        first = asyncio.ensure_future(cache.get("b"))
        await asyncio.sleep(0)
        cache.invalidate("a")
        release.set()
        with pytest.raises(RuntimeError):
            await first
        fail = False
        assert await cache.get("b") == "b"

    asyncio.run(scenario())


@pytest.mark.parametrize("usage, counts", [
    (b'{"prompt_tokens":-5,"completion_tokens":"7"}', (0, 0)),
    (b'{"prompt_tokens":1e400,"completion_tokens":[1]}', None),  # not JSON orjson reads: left alone
    (b'{"prompt_tokens":99999999999,"completion_tokens":true}', (2 ** 31 - 1, 0)),
    (b'{"prompt_tokens":3.0,"completion_tokens":4}', (3, 4)),
])
def test_usage_from_a_strange_upstream_never_makes_a_record_the_database_refuses(usage, counts):
    rec = Record("r", "chat.completions")
    take_usage(b'data: {"choices":[],"usage":' + usage + b"}\n\n", rec, True)
    assert (rec.prompt_tokens, rec.completion_tokens) == (counts or (0, 0))


def test_failure_counts_are_kept_for_a_bounded_number_of_addresses():
    failures = AuthFailures(limit=3, max_addresses=100)
    for _ in range(3):
        failures.failed("10.0.0.0")
    with pytest.raises(GatewayError):
        failures.check("10.0.0.0")
    for i in range(1, 10_000):
        failures.failed(f"10.0.{i // 256}.{i % 256}")
    assert len(failures) == 100
    for _ in range(3):
        failures.failed("192.0.2.1")
    with pytest.raises(GatewayError) as info:
        failures.check("192.0.2.1")
    assert info.value.status == 429 and info.value.code == "too_many_auth_failures"
    failures.check("10.0.0.0")  # forgotten: the oldest went first


def test_an_ipv6_client_is_counted_by_its_slash_64():
    assert client_address(("2001:db8:1:2:aaaa::1", 5000)) == client_address(("2001:db8:1:2:bbbb::9", 1)) \
        == "2001:db8:1:2::/64"
    assert client_address(("192.0.2.7", 1)) == "192.0.2.7" and client_address(None) is None
