"""Upstream misbehaviour a real deployment shows, against the real gateway and mock upstream processes: a stream
that stalls mid-way, a 429 with Retry-After, and idle keep-alive connections closed between requests.
(A client that gives up on a slow upstream: tests/gateway/test_streams_and_keys.py.)"""
import time

import httpx
import openai
import pytest

from tests.gateway.conftest import drained, start_gateway, upstream_of
from tests.gateway.test_errors import CHAT, assert_openai_error, post
from tests.support.processes import start_mock_upstream, wait_for


def test_a_stream_that_stalls_mid_way_ends_with_an_error_event_not_a_hang(world, gateway, mock_requests,
                                                                           openai_client):
    """Upstream sends 3 chunks, then nothing while keeping the connection open. Past the gateway's read timeout
    (2 s in the tests) the client gets an OpenAI-shaped error event and `[DONE]`; upstream's request is closed."""
    world.deployment("stalls", options="stall=3,chunks=8")
    _, raw = world.key()
    started = time.monotonic()
    r = httpx.post(gateway.base_url + "/v1/chat/completions", headers={"Authorization": f"Bearer {raw}",
                   "X-Request-ID": "rid-stall"}, json={"model": "stalls", "stream": True, **CHAT}, timeout=10)
    waited = time.monotonic() - started
    events = [e for e in r.text.split("\n\n") if e]
    assert r.status_code == 200 and events[-1] == "data: [DONE]"
    assert '"error"' in events[-2] and '"code":"upstream_timeout"' in events[-2] and "mid-stream" in events[-2]
    assert sum('"delta"' in e for e in events) == 4  # role + 3 content chunks, then the stall
    assert 2 <= waited < 5, waited  # the read timeout ended it, not the client's own 10 s
    record = drained("rid-stall")
    assert record.partial and record.error_type == "upstream_timeout" and record.completion_tokens == 3
    wait_for(lambda: upstream_of(mock_requests, "rid-stall").get("cancelled"), timeout=3)
    with pytest.raises(openai.APIError):  # the SDK raises rather than waiting for ever
        list(openai_client(raw, timeout=10).chat.completions.create(model="stalls", stream=True, **CHAT))


@pytest.mark.parametrize("status, retry_after", [(429, "7"), (503, "3")])
def test_upstream_retry_after_reaches_the_client(world, gateway, openai_client, status, retry_after):
    world.deployment("busy", options=f"fail={status},retry_after={retry_after}")
    _, raw = world.key()
    r = post(gateway, raw, {"model": "busy", **CHAT})
    assert_openai_error(r, status)  # upstream's own OpenAI-shaped body, passed on
    assert r.headers["retry-after"] == retry_after
    if status == 429:
        with pytest.raises(openai.RateLimitError) as info:
            openai_client(raw).chat.completions.create(model="busy", **CHAT)
        assert info.value.response.headers["retry-after"] == retry_after


def test_a_retry_after_that_is_not_seconds_is_dropped(world, gateway):
    world.deployment("busy", options="fail=429")
    _, raw = world.key()
    assert "retry-after" not in post(gateway, raw, {"model": "busy", **CHAT}).headers


@pytest.fixture
def impatient_upstream(tmp_path):
    """A mock upstream that closes connections idle for 0.3 s (Ray Serve's proxy does so after 5 s)."""
    proc = start_mock_upstream(tmp_path, "--record", "--chunks", "8", "--keepalive-timeout", "0.3")
    yield proc
    proc.stop()


def test_upstream_closing_idle_connections_between_requests_is_invisible(world, gateway, impatient_upstream):
    world.deployment("m", endpoint=impatient_upstream.base_url)
    _, raw = world.key()

    def ask(i: int) -> bool:
        stream = i % 2 == 1
        r = post(gateway, raw, {"model": "m", "stream": stream, **CHAT})
        return r.status_code == 200 and (r.text.rstrip().endswith("data: [DONE]") if stream else
                                         r.json()["choices"][0]["message"]["content"].count("tok") == 8)

    def peer_ports() -> list[int]:
        seen = httpx.get(impatient_upstream.base_url + "/_mock/requests").json().values()
        return [v["peer_port"] for v in seen]

    assert all(ask(i) for i in range(3))  # back to back: the gateway reuses its pooled connection
    assert len(set(peer_ports())) == 1, peer_ports()
    answers = []
    for i in range(6):  # idle past upstream's keep-alive each time: every pooled connection has been closed
        time.sleep(0.6)
        answers.append(ask(i))
    assert answers == [True] * 6
    assert len(set(peer_ports())) == 7, peer_ports()  # each on a fresh connection, and no user saw an error


def test_the_gateway_lets_idle_upstream_connections_go_before_upstream_does(world, mock_upstream, mock_requests,
                                                                            tmp_path):
    """Reusing a connection at the moment upstream closes it for idleness sends the request into a closing socket
    (a 502 for the user; `python -m bench.keepalive_race`: 3 of 300 requests sent about 0.5 s apart to an upstream
    with a 0.5 s keep-alive). So the gateway lets its idle connections go first: after TANDEM_GATEWAY_UPSTREAM_KEEPALIVE_S (4 s by
    default, under Ray Serve's 5 s; 1 s here, far above two back-to-back requests on a loaded machine) the next
    request opens a new one."""
    world.deployment("idle")
    _, raw = world.key()
    gw = start_gateway(tmp_path, TANDEM_GATEWAY_UPSTREAM_KEEPALIVE_S="1")
    try:
        ports = []
        for pause in (0, 0, 1.6):
            time.sleep(pause)
            r = httpx.post(gw.base_url + "/v1/chat/completions", json={"model": "idle", **CHAT}, timeout=10,
                           headers={"Authorization": f"Bearer {raw}", "X-Request-ID": f"idle-{len(ports)}"})
            assert r.status_code == 200
            ports.append(upstream_of(mock_requests, f"idle-{len(ports)}")["peer_port"])
        assert ports[0] == ports[1] != ports[2], ports  # reused while fresh, dropped once idle past the limit
    finally:
        gw.stop()
