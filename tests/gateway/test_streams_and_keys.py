"""Revocation across replicas, client disconnects, upstream drops and slow readers, with real processes."""
import socket
import time

import httpx
import openai
import pytest

from deployments.services.api_keys import api_key_revoke
from tests.gateway.conftest import drained, start_gateway, upstream_by_model
from tests.support.revocation import assert_key_refused_within
from tests.support.processes import wait_for

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def test_revocation_reaches_every_replica_within_a_second(world, gateway, tmp_path):
    world.deployment("m")
    key, raw = world.key()
    second = start_gateway(tmp_path)
    try:
        assert_key_refused_within([gateway.base_url, second.base_url], raw,
                                  lambda: api_key_revoke(actor=world.member, key=key))
    finally:
        second.stop()


def test_client_disconnect_cancels_upstream_and_is_recorded_partial(world, gateway, mock_requests):
    dep = world.deployment("slow", options="gap=0.2,chunks=50")
    _, raw = world.key()
    with httpx.Client(timeout=10) as client:
        with client.stream("POST", gateway.base_url + "/v1/chat/completions",
                           headers={"Authorization": f"Bearer {raw}", "X-Request-ID": "rid-leave"},
                           json={"model": "slow", "stream": True, **CHAT}) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            left_at = time.time()
    # The stream is closed here; upstream must see its request cancelled well before it would have finished.
    seen = wait_for(lambda: upstream_by_model(mock_requests, "slow").get("cancelled"), timeout=2.0)
    assert seen, upstream_by_model(mock_requests, "slow")
    assert upstream_by_model(mock_requests, "slow")["cancelled_at"] - left_at < 1.0
    record = drained("rid-leave")
    assert record.partial and record.error_type == "client_disconnected"
    assert record.deployment_id == dep.pk and record.status_code == 499


def test_a_client_that_gives_up_on_a_long_answer_cancels_it_upstream(world, gateway, mock_requests):
    """Not streamed: the client times out while the deployment still generates; the gateway closes upstream."""
    world.deployment("long", options="ttft=1.5")
    _, raw = world.key()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(gateway.base_url + "/v1/chat/completions", headers={"Authorization": f"Bearer {raw}",
                   "X-Request-ID": "rid-gave-up"}, json={"model": "long", **CHAT}, timeout=0.5)
    left_at = time.time()
    wait_for(lambda: upstream_by_model(mock_requests, "long").get("cancelled"), timeout=2.0)
    assert upstream_by_model(mock_requests, "long")["cancelled_at"] - left_at < 0.5
    record = drained("rid-gave-up")
    assert record.status_code == 499 and record.error_type == "client_disconnected"


def test_upstream_drop_mid_stream_gives_an_error_event_and_done(world, gateway, openai_client):
    world.deployment("flaky", options="drop=3,chunks=8")
    _, raw = world.key()
    r = httpx.post(gateway.base_url + "/v1/chat/completions", headers={"Authorization": f"Bearer {raw}",
                   "X-Request-ID": "rid-drop"}, json={"model": "flaky", "stream": True, **CHAT}, timeout=10)
    events = [e for e in r.text.split("\n\n") if e]
    assert r.status_code == 200
    assert events[-1] == "data: [DONE]"
    assert '"error"' in events[-2] and "upstream_disconnected" in events[-2]
    assert sum('"delta"' in e for e in events) == 4  # role + 3 content chunks, then the break
    record = drained("rid-drop")
    assert record.partial and record.error_type == "upstream_disconnected"
    with pytest.raises(openai.APIError):
        list(openai_client(raw).chat.completions.create(model="flaky", stream=True, **CHAT))


def test_slow_reader_keeps_gateway_memory_bounded(world, gateway, mock_requests):
    """A client that stops reading makes the gateway stop reading upstream: backpressure, not buffering."""
    world.deployment("big", options="pad=65536,chunks=3000")  # ~200 MB if it were all buffered
    _, raw = world.key()
    before = gateway.rss_kib()
    body = b'{"model":"big","stream":true,"messages":[{"role":"user","content":"x"}]}'
    sock = socket.create_connection(("127.0.0.1", int(gateway.base_url.rsplit(":", 1)[1])))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"X-Request-ID: rid-slow\r\nAuthorization: Bearer " + raw.encode() +
                 b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    try:
        time.sleep(3)  # read nothing
        sent = upstream_by_model(mock_requests, "big").get("sent", 0)
        growth_mib = (gateway.rss_kib() - before) / 1024
        assert sent < 300, f"upstream sent {sent} chunks of 64 KiB to a client that reads nothing"
        assert growth_mib < 40, f"gateway grew by {growth_mib:.0f} MiB"
        sock.recv(65536)  # reading a little lets it move on a little
    finally:
        sock.close()
    wait_for(lambda: upstream_by_model(mock_requests, "big").get("cancelled"), timeout=3)
