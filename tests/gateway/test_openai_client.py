"""The official `openai` client through a real gateway process against the mock upstream."""
import re

import httpx
import pytest

from tests.gateway.conftest import RAY_TOKEN, upstream_of
from tests.gateway.test_units import HOSTILE


def test_chat_non_streaming_is_answered_and_routed_with_request_id(world, openai_client, mock_requests):
    world.deployment("chat-a")
    _, raw = world.key()
    raw_response = openai_client(raw).chat.completions.with_raw_response.create(
        model="chat-a", messages=[{"role": "user", "content": "one two three"}], extra_headers={"X-Request-ID": "rid-1"})
    completion = raw_response.parse()
    assert raw_response.headers["x-request-id"] == "rid-1"
    assert completion.choices[0].message.content == "tok0 tok1 tok2 tok3 tok4 tok5 tok6 tok7 "
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (3, 8)
    seen = upstream_of(mock_requests, "rid-1")
    assert seen["body"]["model"] == "chat-a"
    assert seen["auth"] is None  # the client's Tandem key never goes upstream


def test_gateway_creates_a_request_id_when_none_is_given(world, gateway):
    world.deployment("chat-a")
    _, raw = world.key()
    r = httpx.post(gateway.base_url + "/v1/chat/completions", headers={"Authorization": f"Bearer {raw}"},
                   json={"model": "chat-a", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 200
    assert re.fullmatch(r"[0-9a-f]{32}", r.headers["x-request-id"])


def test_streaming_without_usage_hides_the_usage_chunk_but_bills_it(world, openai_client, mock_requests):
    world.deployment("chat-s")
    _, raw = world.key()
    stream = openai_client(raw).chat.completions.create(
        model="chat-s", messages=[{"role": "user", "content": "a b"}], stream=True,
        extra_headers={"X-Request-ID": "rid-nousage"})
    chunks = list(stream)
    assert all(c.choices for c in chunks), "the usage-only chunk must not reach a client that did not ask"
    assert all(c.usage is None for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "".join(f"tok{i} " for i in range(8))
    assert chunks[-1].choices[0].finish_reason == "stop"
    # The gateway asked upstream for usage itself (that is how it bills the stream).
    assert upstream_of(mock_requests, "rid-nousage")["body"]["stream_options"] == {"include_usage": True}


def test_streaming_with_usage_passes_the_usage_chunk(world, openai_client, mock_requests):
    world.deployment("chat-u")
    _, raw = world.key()
    chunks = list(openai_client(raw).chat.completions.create(
        model="chat-u", messages=[{"role": "user", "content": "a b c d"}], stream=True,
        stream_options={"include_usage": True}, extra_headers={"X-Request-ID": "rid-usage"}))
    assert chunks[-1].choices == []
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (4, 8)
    assert upstream_of(mock_requests, "rid-usage")["usage"]["completion_tokens"] == 8


def test_stream_bytes_are_the_upstream_bytes(world, gateway, mock_upstream):
    """Same bytes as talking to upstream directly (apart from the `created` clock), `[DONE]` kept."""
    world.deployment("chat-b")
    _, raw = world.key()
    body = {"model": "chat-b", "messages": [{"role": "user", "content": "x"}], "stream": True,
            "stream_options": {"include_usage": True}}
    through = httpx.post(gateway.base_url + "/v1/chat/completions", json=body,
                         headers={"Authorization": f"Bearer {raw}"}).content
    direct = httpx.post(mock_upstream.base_url + "/v1/chat/completions", json=body).content

    def norm(b):
        return re.sub(rb'"created":\d+', b'"created":0', b)

    assert norm(through) == norm(direct)
    assert through.endswith(b"data: [DONE]\n\n")


def test_stop_sequences_are_passed_through(world, openai_client, mock_requests):
    world.deployment("chat-stop")
    _, raw = world.key()
    completion = openai_client(raw).chat.completions.create(
        model="chat-stop", messages=[{"role": "user", "content": "x"}], stop=["tok3"],
        extra_headers={"X-Request-ID": "rid-stop"})
    assert completion.choices[0].message.content == "tok0 tok1 tok2 "
    assert completion.choices[0].finish_reason == "stop"
    assert upstream_of(mock_requests, "rid-stop")["body"]["stop"] == ["tok3"]


def test_completions_streamed_and_not_and_embeddings(world, openai_client):
    world.deployment("base-m")
    _, raw = world.key()
    client = openai_client(raw)
    once = client.completions.create(model="base-m", prompt="hello world", max_tokens=3)
    assert once.choices[0].text == "tok0 tok1 tok2 " and once.choices[0].finish_reason == "length"
    streamed = list(client.completions.create(model="base-m", prompt="hello", stream=True))
    assert "".join(c.choices[0].text for c in streamed if c.choices) == "".join(f"tok{i} " for i in range(8))
    emb = client.embeddings.create(model="base-m", input=["a b", "c"])
    assert len(emb.data) == 2 and emb.usage.prompt_tokens == 3


def test_models_lists_only_what_the_key_may_call(world, openai_client):
    allowed = world.deployment("m-allowed")
    world.deployment("m-other")
    world.deployment("m-starting", status="provisioning")
    _, all_key = world.key()
    _, scoped = world.key(all_deployments=False, deployments=[allowed])
    assert sorted(m.id for m in openai_client(all_key).models.list()) == ["m-allowed", "m-other"]
    assert [m.id for m in openai_client(scoped).models.list()] == ["m-allowed"]


def test_ray_cluster_token_is_sent_upstream(world, openai_client, mock_requests):
    world.deployment("on-ray", cluster=world.ray_cluster())
    _, raw = world.key()
    openai_client(raw).chat.completions.create(model="on-ray", messages=[{"role": "user", "content": "x"}],
                                               extra_headers={"X-Request-ID": "rid-ray"})
    assert upstream_of(mock_requests, "rid-ray")["auth"] == f"Bearer {RAY_TOKEN}"


def test_fields_only_the_serving_stack_may_set_never_reach_upstream(world, openai_client, mock_requests):
    """A client's kv_transfer_params would tell a decode engine where to pull its KV cache from (and make Ray Serve's
    prefill/decode orchestrator fail); the gateway removes it, its kin and a chosen request id, streamed or not."""
    world.deployment("pd")
    _, raw = world.key()
    client = openai_client(raw)
    client.chat.completions.create(model="pd", messages=[{"role": "user", "content": "x"}], extra_body=HOSTILE,
                                   extra_headers={"X-Request-ID": "rid-hostile"})
    list(client.completions.create(model="pd", prompt="x", stream=True, extra_body=HOSTILE,
                                   extra_headers={"X-Request-ID": "rid-hostile-stream"}))
    for rid in ("rid-hostile", "rid-hostile-stream"):
        seen = upstream_of(mock_requests, rid)["body"]
        assert not {"kv_transfer_params", "ec_transfer_params", "request_id"} & set(seen), seen
        assert seen["vllm_xargs"] == {"my_extension": 3}


@pytest.mark.parametrize("path", ["/v1/nothing", "/"])
def test_unknown_paths_are_openai_shaped_404(gateway, path):
    r = httpx.get(gateway.base_url + path)
    assert r.status_code == 404
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
