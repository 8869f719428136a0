"""Generation-aware routing through the real gateway and mock upstream: during a side-by-side rollout the gateway
sends `next_weight` percent of requests to the next generation's endpoint, each request wholly to one generation,
and every answer (and the request's record) names the generation that served it."""
import random

import httpx
import pytest

from deployments.lifecycle import Status
from gateway.routing import Route
from tests.gateway.conftest import drained
from tests.gateway.test_errors import CHAT, assert_openai_error, post
from tests.support.processes import free_port

HEADER = "x-tandem-generation"
# The two generations answer differently (3 tokens, 5 tokens), so each answer shows which endpoint produced it.
OLD, NEW = 4, 5
TOKENS = {OLD: 3, NEW: 5}


def _in_rollout(world, mock_upstream, model: str, *, weight: int):
    dep = world.deployment(model, options=f"chunks={TOKENS[OLD]}")
    dep.endpoint_generation = OLD
    dep.next_endpoint_url = f"{mock_upstream.base_url}/o/chunks={TOKENS[NEW]}"
    dep.next_generation, dep.next_weight = NEW, weight
    dep.save()
    return dep


def _row(**fields) -> dict:
    return {"id": 1, "name": "d", "model_id": "m", "status": Status.RUNNING, "endpoint_url": "http://old:8000",
            "max_model_len": None, "endpoint_generation": OLD, "next_endpoint_url": "http://new:8000",
            "next_generation": NEW, "next_weight": 0, **fields}


@pytest.mark.parametrize("weight", [1, 10, 50, 99])
def test_the_next_generation_gets_its_weight_of_requests(weight):
    """100,000 draws from a seeded generator (the same every run): the next generation's share is within 0.5
    points of its weight (five standard deviations at 50%)."""
    route = Route.from_row(_row(next_weight=weight))
    draw = random.Random(20261206).random
    chosen = [route.upstream(draw=draw).generation for _ in range(100_000)]
    assert abs(chosen.count(NEW) / len(chosen) - weight / 100) < 0.005
    assert set(chosen) == {OLD, NEW}


def test_weight_0_and_100_and_no_next_endpoint_leave_no_choice():
    draw = random.Random(1).random
    for row, only in ((_row(next_weight=0), OLD), (_row(next_weight=100), NEW),
                      (_row(next_weight=50, next_endpoint_url=""), OLD)):
        route = Route.from_row(row)
        assert {route.upstream(draw=draw).generation for _ in range(1000)} == {only}
    assert str(Route.from_row(_row(next_weight=100)).upstream().urls["chat.completions"]) == \
        "http://new:8000/v1/chat/completions"


def test_tandems_service_keys_reach_the_next_generation_before_any_user_does():
    """A rollout's conformance run (a service key) checks the next generation at weight 0, when no user's request
    goes there yet; with no next generation it checks the current one."""
    draw = random.Random(2).random
    route = Route.from_row(_row(next_weight=0))
    assert {route.upstream(service=True, draw=draw).generation for _ in range(100)} == {NEW}
    assert {route.upstream(draw=draw).generation for _ in range(1000)} == {OLD}
    alone = Route.from_row(_row(next_weight=0, next_endpoint_url=""))
    assert alone.upstream(service=True).generation == OLD


def test_requests_split_between_generations_and_each_is_served_by_the_one_it_names(world, gateway, mock_upstream):
    """300 answers at weight 30: the next generation's count is within six standard deviations of 90 (a bound
    a fair split misses once in about 10^9 runs), and every answer, streamed or not, came whole from the
    endpoint of the generation its header names."""
    _in_rollout(world, mock_upstream, "split", weight=30)
    _, raw = world.key()
    seen = []
    with httpx.Client(base_url=gateway.base_url, headers={"Authorization": f"Bearer {raw}"}, timeout=20) as client:
        for i in range(300):
            stream = i % 5 == 0
            r = client.post("/v1/chat/completions", json={"model": "split", "stream": stream, **CHAT})
            assert r.status_code == 200, r.text
            generation = int(r.headers[HEADER])
            content = r.text if stream else r.json()["choices"][0]["message"]["content"]
            assert content.count("tok") == TOKENS[generation], (generation, content)
            if stream:
                assert r.text.rstrip().endswith("data: [DONE]") and '"error"' not in r.text
            seen.append(generation)
    assert set(seen) == {OLD, NEW}
    assert 90 - 48 <= seen.count(NEW) <= 90 + 48, seen.count(NEW)


def test_every_answer_names_its_generation_and_its_record_keeps_it(world, gateway, mock_upstream, tmp_path):
    """Successes, streamed or not, upstream's errors and an upstream that cannot be reached all carry the header;
    the record of each stores the generation. An answer the gateway gives before choosing a deployment (a bad key)
    names none."""
    _in_rollout(world, mock_upstream, "all-new", weight=100)
    for model, where in (("broken", {"options": "fail=500"}), ("refuses", {"options": "fail=400"}),
                         ("gone", {"endpoint": f"http://127.0.0.1:{free_port()}"})):
        dep = world.deployment(model, **where)
        dep.endpoint_generation = 2
        dep.save()
    _, raw = world.key()

    def ask(rid: str, body: dict) -> httpx.Response:
        return httpx.post(gateway.base_url + "/v1/chat/completions", json={**CHAT, **body}, timeout=20,
                          headers={"Authorization": f"Bearer {raw}", "X-Request-ID": rid})

    streamed = ask("gen-stream", {"model": "all-new", "stream": True})
    assert streamed.status_code == 200 and streamed.headers[HEADER] == str(NEW)
    assert streamed.text.count("tok") == TOKENS[NEW]
    whole = ask("gen-whole", {"model": "all-new"})
    assert whole.status_code == 200 and whole.headers[HEADER] == str(NEW)
    assert drained("gen-stream").generation == NEW and drained("gen-whole").generation == NEW
    for rid, model, status in (("gen-500", "broken", 502), ("gen-400", "refuses", 400), ("gen-gone", "gone", 502)):
        r = ask(rid, {"model": model, "stream": rid == "gen-500"})
        assert_openai_error(r, status)
        assert r.headers[HEADER] == "2"
        record = drained(rid)
        assert (record.generation, record.status_code) == (2, status)
    refused = post(gateway, "tdm_not-a-key", {"model": "all-new", **CHAT})
    assert refused.status_code == 401 and HEADER not in refused.headers
