"""A replica that dies costs the user nothing it can avoid, against the real gateway and mock upstream processes:
an upstream that fails before the client got a byte is asked again (twice when the replica is gone) and the client
gets the whole answer; one
that fails after the first event is never asked again (the client gets an error event and `[DONE]`); and a stream
whose first event never comes is bounded (TANDEM_GATEWAY_FIRST_BYTE_TIMEOUT_S)."""
import time

import httpx
import pytest

from tests.gateway.conftest import drained, start_gateway, upstream_of
from tests.gateway.test_errors import CHAT, assert_openai_error
from tests.gateway.test_hostile import _metric

RETRIES = "tandem_gateway_upstream_retries_total"


def ask(gw, raw: str, rid: str, body: dict) -> httpx.Response:
    return httpx.post(gw.base_url + "/v1/chat/completions", json={**CHAT, **body}, timeout=20,
                      headers={"Authorization": f"Bearer {raw}", "X-Request-ID": rid})


def token_events(r: httpx.Response) -> list[str]:
    """The events of a streamed answer that carry a token (the mock's tokens are `tok0 `, `tok1 `...)."""
    return [e for e in r.text.split("\n\n") if '"content":"tok' in e]


def assert_whole_answer(r: httpx.Response, stream: bool, tokens: int) -> None:
    assert r.status_code == 200, r.text
    if stream:
        assert r.text.rstrip().endswith("data: [DONE]") and '"error"' not in r.text
        assert len(token_events(r)) == tokens
    else:
        assert r.json()["choices"][0]["message"]["content"].count("tok") == tokens


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("dies", [1, 2])
def test_an_upstream_that_dies_before_the_first_byte_is_asked_again(world, gateway, mock_requests, stream, dies):
    """The first try's connection closes before any event (a whole answer: before its headers; a stream: after
    them), and with `dies=2` the second's too: a replica that is gone. The next try is served. The client sees
    one clean answer, upstream saw the request once more than it died, and each retry is counted by reason."""
    dep = world.deployment(f"dies-{dies}-{stream}", options=f"die_first={dies},chunks=8")
    _, raw = world.key()
    rid = f"rid-dies-{dies}-{stream}"
    r = ask(gateway, raw, rid, {"model": dep.spec["model_id"], "stream": stream})
    assert_whole_answer(r, stream, 8)
    assert upstream_of(mock_requests, rid)["calls"] == dies + 1
    record = drained(rid)
    assert (record.status_code, record.partial, record.error_type) == (200, False, "")
    reason = "stream_not_started" if stream else "disconnected"  # a stream's headers came, then nothing
    assert _metric(gateway, RETRIES, deployment=str(dep.pk), reason=reason) == dies


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_request_whose_replica_died_under_it_is_asked_until_serve_routes_around_the_dead_one(world, gateway,
                                                                                              mock_requests, stream):
    """What Ray Serve LLM answered on the local PD stack when its decode replica was SIGKILLed: a 500 quoting
    Ray's ActorDiedError (the recorded body), to the request and to the gateway's first retry 0.1 s later (Serve
    had not dropped the dead replica yet). A dead replica is not the request's fault: the gateway asks a third
    time, about 2 s later, and the client gets the whole answer."""
    dep = world.deployment(f"died-twice-{stream}", options="died_first=2,chunks=4")
    _, raw = world.key()
    rid = f"rid-died-twice-{stream}"
    started = time.monotonic()
    r = ask(gateway, raw, rid, {"model": dep.spec["model_id"], "stream": stream})
    assert_whole_answer(r, stream, 4)
    assert upstream_of(mock_requests, rid)["calls"] == 3
    assert time.monotonic() - started >= 1.0  # the second retry waited for Serve (2 s, jittered over 1-3 s)
    assert (drained(rid).status_code, drained(rid).error_type) == (200, "")
    assert _metric(gateway, RETRIES, deployment=str(dep.pk), reason="replica_died") == 2


def test_a_request_whose_ingress_replica_died_under_it_is_asked_again(world, gateway, mock_requests):
    """Serve's HTTP proxy answered a bare `Internal Server Error` to two requests whose ingress replica Serve
    stopped while Tandem restarted the deployment's replicas (recorded on the local PD stack); the application's
    own errors are JSON, which a plain 500 is not. Asked again, the new ingress answers."""
    dep = world.deployment("ingress-died", options="ingress_died_first=1,chunks=4")
    _, raw = world.key()
    r = ask(gateway, raw, "rid-ingress-died", {"model": dep.spec["model_id"], "stream": True})
    assert_whole_answer(r, True, 4)
    assert upstream_of(mock_requests, "rid-ingress-died")["calls"] == 2
    assert _metric(gateway, RETRIES, deployment=str(dep.pk), reason="replica_died") == 1


def test_a_replica_that_stays_dead_is_asked_three_times_and_the_client_gets_a_502_without_its_address(
        world, gateway, mock_requests):
    world.deployment("died-for-good", options="died_first=9")
    _, raw = world.key()
    error = assert_openai_error(ask(gateway, raw, "rid-died-for-good", {"model": "died-for-good"}), 502)
    assert error["message"].startswith("The deployment answered 500: ") and "The actor died" in error["message"]
    assert "192.0.2.2" not in error["message"], error["message"]  # the Ray node's address, in Serve's body
    assert upstream_of(mock_requests, "rid-died-for-good")["calls"] == 3


def test_a_stream_whose_prefill_died_before_its_first_token_is_asked_again(world, gateway, mock_requests):
    """What Serve streamed on the local PD stack to a request whose prefill was SIGKILLed under it (recorded):
    vLLM's empty first chunk (role only), then its error event. The client had no token yet, so the gateway held
    the empty chunk back, and asks again; the client gets one whole answer, its TTFT that of the answer's first
    token."""
    dep = world.deployment("kv-lost-once", options="kv_lost_first=1,chunks=4")
    _, raw = world.key()
    r = ask(gateway, raw, "rid-kv-lost-once", {"model": dep.spec["model_id"], "stream": True})
    assert_whole_answer(r, True, 4)
    assert r.text.count('"role":"assistant"') == 1  # the answer's own first chunk, not the failed try's
    assert upstream_of(mock_requests, "rid-kv-lost-once")["calls"] == 2
    record = drained("rid-kv-lost-once")
    assert (record.status_code, record.partial, record.error_type) == (200, False, "")
    assert _metric(gateway, RETRIES, deployment=str(dep.pk), reason="stream_not_started") == 1


def test_a_stream_that_keeps_failing_before_its_first_token_gets_a_502_naming_the_failure(world, gateway,
                                                                                         mock_requests):
    world.deployment("kv-lost", options="kv_lost_first=9")
    _, raw = world.key()
    error = assert_openai_error(ask(gateway, raw, "rid-kv-lost", {"model": "kv-lost", "stream": True}), 502)
    assert error["message"] == "The deployment failed before its first token: Internal server error"
    assert upstream_of(mock_requests, "rid-kv-lost")["calls"] == 3
    assert (drained("rid-kv-lost").status_code, drained("rid-kv-lost").error_type) == (502, "upstream_error")


def test_an_upstream_that_dies_after_the_first_token_is_not_asked_again(world, gateway, mock_requests):
    dep = world.deployment("dies-late", options="drop=1,chunks=8")
    _, raw = world.key()
    r = ask(gateway, raw, "rid-dies-late", {"model": "dies-late", "stream": True})
    events = [e for e in r.text.split("\n\n") if e]
    assert r.status_code == 200 and events[-1] == "data: [DONE]"
    assert '"error"' in events[-2] and "upstream_disconnected" in events[-2]
    assert len(token_events(r)) == 1
    assert upstream_of(mock_requests, "rid-dies-late")["calls"] == 1
    record = drained("rid-dies-late")
    assert record.partial and record.error_type == "upstream_disconnected"
    assert _metric(gateway, RETRIES, deployment=str(dep.pk)) == 0


@pytest.mark.parametrize("status, expected, calls", [(503, 503, 2), (502, 502, 2), (500, 502, 1), (429, 429, 1)])
def test_only_answers_that_another_replica_may_not_give_are_asked_again(world, gateway, mock_requests, status,
                                                                        expected, calls):
    """502/503/504 say the replica could not take the request: asked once more (and the second answer is the
    client's: asking a busy deployment a third time only adds to its load). Any other error, a 500 that is not
    Serve's word for a dead replica among them, is the answer."""
    world.deployment(f"fails-{status}", options=f"fail={status}")
    _, raw = world.key()
    assert_openai_error(ask(gateway, raw, f"rid-fails-{status}", {"model": f"fails-{status}"}), expected)
    assert upstream_of(mock_requests, f"rid-fails-{status}")["calls"] == calls


@pytest.fixture(scope="module")
def bounded_gateway(django_db_setup, django_db_blocker, mock_upstream, tmp_path_factory):
    """A gateway that waits 0.5 s for a stream's first event, and 10 s for any other read: a test that ends well
    within 10 s was ended by the first-byte bound."""
    proc = start_gateway(tmp_path_factory.mktemp("bounded"), TANDEM_GATEWAY_FIRST_BYTE_TIMEOUT_S="0.5",
                         TANDEM_GATEWAY_UPSTREAM_TIMEOUT_S="10")
    yield proc
    proc.stop()


def test_a_stream_whose_first_event_does_not_come_in_time_is_asked_again(world, bounded_gateway, mock_requests):
    """The first try sends its headers and then nothing (a decode waiting for KV that never comes): past 0.5 s the
    gateway closes it and asks again, long before the read timeout would have ended it."""
    world.deployment("hangs-once", options="hang_first=1,chunks=4")
    _, raw = world.key()
    started = time.monotonic()
    r = ask(bounded_gateway, raw, "rid-hangs-once", {"model": "hangs-once", "stream": True})
    took = time.monotonic() - started
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]") and '"error"' not in r.text
    assert len(token_events(r)) == 4
    assert 0.5 <= took < 5, took
    assert upstream_of(mock_requests, "rid-hangs-once")["calls"] == 2
    assert drained("rid-hangs-once").ttft_ms >= 500  # the client waited for the first try's bound


def test_a_stream_whose_first_event_never_comes_ends_with_a_504(world, bounded_gateway, mock_requests):
    world.deployment("hangs", options="hang_first=2")
    _, raw = world.key()
    started = time.monotonic()
    r = ask(bounded_gateway, raw, "rid-hangs", {"model": "hangs", "stream": True})
    took = time.monotonic() - started
    error = assert_openai_error(r, 504, "first_byte_timeout")
    assert "0.5s" in error["message"]
    assert 1.0 <= took < 5, took  # two tries of 0.5 s and the wait between them, not the 10 s read timeout
    assert upstream_of(mock_requests, "rid-hangs")["calls"] == 2
    record = drained("rid-hangs")
    assert (record.status_code, record.error_type) == (504, "first_byte_timeout")


def test_a_client_that_leaves_at_done_while_upstream_holds_the_stream_open_made_a_complete_request(world, gateway):
    """The OpenAI SDKs close the connection at `[DONE]`; Ray Serve keeps a stream open a while after it (seen on
    the local PD stack, where most streams were recorded as 499 partial). The gateway relays `[DONE]` and ends the
    answer there, so the request is recorded as the complete 200 it was, and the judge of a rollout counts its
    time to first token."""
    dep = world.deployment("lingers", options="chunks=4,linger=3")
    _, raw = world.key()
    with httpx.stream("POST", gateway.base_url + "/v1/chat/completions", timeout=20,
                      json={**CHAT, "model": dep.spec["model_id"], "stream": True},
                      headers={"Authorization": f"Bearer {raw}", "X-Request-ID": "rid-lingers"}) as r:
        for line in r.iter_lines():
            if line == "data: [DONE]":
                break  # and close, as the SDKs do
    started = time.monotonic()
    record = drained("rid-lingers")
    assert (record.status_code, record.partial, record.error_type) == (200, False, "")
    assert record.ttft_ms is not None and record.completion_tokens == 4
    assert time.monotonic() - started < 3  # recorded before upstream's stream would have ended
