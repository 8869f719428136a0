"""Every error the gateway answers is OpenAI-shaped with the right status; none is a 500 page."""
import datetime as dt
import math
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from django.utils import timezone
from openai import OpenAI

from deployments.models import ApiKey
from deployments.services.api_keys import api_key_create
from deployments.services.status import deployment_observe
from gateway.ratelimit import SYNC_S
from tests.gateway.conftest import start_gateway
from tests.support.processes import free_port, wait_for


def assert_openai_error(response: httpx.Response, status: int, code: str | None = None):
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    if code:
        assert error["code"] == code
    return error


def post(gateway, raw, body, path="/v1/chat/completions", **kwargs):
    headers = {"Authorization": f"Bearer {raw}"} if raw else {}
    return httpx.post(gateway.base_url + path, headers=headers, json=body, timeout=20, **kwargs)


CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def test_401_for_missing_malformed_wrong_expired_and_revoked_keys(world, gateway, openai_client):
    world.deployment("m")
    key, raw = world.key()
    assert_openai_error(post(gateway, None, {"model": "m", **CHAT}), 401, "invalid_api_key")
    assert_openai_error(post(gateway, "sk-not-ours", {"model": "m", **CHAT}), 401)
    wrong_secret = raw[:-4] + ("aaaa" if not raw.endswith("aaaa") else "bbbb")
    assert_openai_error(post(gateway, wrong_secret, {"model": "m", **CHAT}), 401)
    assert_openai_error(post(gateway, f"tdm_{'0' * 12}_{'x' * 40}", {"model": "m", **CHAT}), 401)
    old, expired = world.key(expires_at=timezone.now() + dt.timedelta(days=1))
    ApiKey.objects.filter(pk=old.pk).update(expires_at=timezone.now() - dt.timedelta(seconds=1))  # a day later
    assert_openai_error(post(gateway, expired, {"model": "m", **CHAT}), 401)
    with pytest.raises(openai.AuthenticationError):
        openai_client("tdm_abc_" + "y" * 40).models.list()


def test_403_when_the_key_may_not_call_the_model(world, gateway):
    allowed = world.deployment("m-yes")
    world.deployment("m-no")
    _, raw = world.key(all_deployments=False, deployments=[allowed])
    assert post(gateway, raw, {"model": "m-yes", **CHAT}).status_code == 200
    assert_openai_error(post(gateway, raw, {"model": "m-no", **CHAT}), 403, "model_not_allowed")


def test_404_unknown_model_including_another_teams(world, gateway):
    from tests.factories import TeamFactory

    world.deployment("theirs", team=TeamFactory())
    _, raw = world.key()
    assert_openai_error(post(gateway, raw, {"model": "nope", **CHAT}), 404, "model_not_found")
    assert_openai_error(post(gateway, raw, {"model": "theirs", **CHAT}), 404, "model_not_found")


def test_429_requests_per_minute_with_retry_after(world, minute_gateways):
    world.deployment("m")
    _, raw = world.key(requests_per_minute=2)
    gateway, clock = minute_gateways.members[0], minute_gateways.clock
    for _ in range(2):
        assert post(gateway, raw, {"model": "m", **CHAT}).status_code == 200
    before = clock.now()
    r = post(gateway, raw, {"model": "m", **CHAT})
    after = clock.now()
    assert_openai_error(r, 429, "rate_limit_exceeded")
    # Retry-After: the whole seconds left in the gateway's minute when it refused, which lay between these two.
    end = (clock.window + 1) * 60
    assert math.ceil(end - after) <= int(r.headers["retry-after"]) <= math.ceil(end - before), (
        r.headers["retry-after"], end - after, end - before)
    with pytest.raises(openai.RateLimitError):
        OpenAI(base_url=gateway.base_url + "/v1", api_key=raw, max_retries=0).chat.completions.create(
            model="m", **CHAT)


def test_request_limits_are_shared_by_replicas(world, minute_gateways, redis_client):
    """Each replica counts its own requests and syncs with Redis every 50 ms, or before answering when its counts
    are older than half a second: what one admitted, the other knows."""
    world.deployment("m")
    key, raw = world.key(requests_per_minute=10)
    first, second = minute_gateways.members
    counter = f"tandem:rl:{key.key_id}:{minute_gateways.clock.window}:r"
    assert [post(first, raw, {"model": "m", **CHAT}).status_code for _ in range(6)] == [200] * 6
    wait_for(lambda: int(redis_client.get(counter) or 0) == 6, timeout=5, what="the first replica's 6 in Redis")
    # The second replica has not used this key: it reads the totals before its first answer.
    assert [post(second, raw, {"model": "m", **CHAT}).status_code for _ in range(6)] == [200] * 4 + [429] * 2
    wait_for(lambda: int(redis_client.get(counter) or 0) == 12, timeout=5, what="the second replica's 6 in Redis")
    # The first replica's counts are then older than SYNC_S (its last flush read 6): it reads the totals before
    # answering. Waiting here is the condition itself (a quiet spell), not a stand-in for one.
    time.sleep(SYNC_S + 0.1)
    assert post(first, raw, {"model": "m", **CHAT}).status_code == 429


def test_429_tokens_per_minute(world, minute_gateways, redis_client):
    world.deployment("m")
    key, raw = world.key(tokens_per_minute=5)  # one answer is 8 completion tokens
    gateway = minute_gateways.members[0]
    answer = post(gateway, raw, {"model": "m", **CHAT})
    assert answer.status_code == 200
    # Tokens are counted by the recorder, off the hot path: once its flush has put them in Redis, the next
    # flush (every 50 ms) brings the total back to the replica that serves the next request.
    counter = f"tandem:rl:{key.key_id}:{minute_gateways.clock.window}:t"
    used = answer.json()["usage"]["total_tokens"]
    wait_for(lambda: int(redis_client.get(counter) or 0) == used, timeout=5, what=f"{used} tokens in {counter}")
    r = wait_for(lambda: (lambda r: r if r.status_code != 200 else None)(post(gateway, raw, {"model": "m", **CHAT})),
                 timeout=5, what="a refusal once the tokens are counted")
    assert_openai_error(r, 429, "rate_limit_exceeded")
    assert "tokens" in r.json()["error"]["message"]


def test_the_tokens_of_requests_flushed_together_all_count(world, minute_gateways, redis_client):
    """A flush sums each key's tokens before it sends them: the minute's counter holds every answer's usage."""
    world.deployment("m")
    key, raw = world.key(tokens_per_minute=1_000_000)
    gateway = minute_gateways.members[0]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: post(gateway, raw, {"model": "m", **CHAT}), range(16)))
    assert [a.status_code for a in answers] == [200] * 16
    used = sum(a.json()["usage"]["total_tokens"] for a in answers)
    counter = f"tandem:rl:{key.key_id}:{minute_gateways.clock.window}:t"
    wait_for(lambda: int(redis_client.get(counter) or 0) == used, timeout=5, what=f"{used} tokens in {counter}")


def test_413_body_too_large(world, gateway):
    world.deployment("m")
    _, raw = world.key()
    big = {"model": "m", "messages": [{"role": "user", "content": "x" * (2 * 1024 * 1024)}]}
    assert_openai_error(post(gateway, raw, big), 413, "request_too_large")


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]", b'{"messages": []}'])
def test_400_malformed_json_or_body(world, gateway, content):
    world.deployment("m")
    _, raw = world.key()
    r = httpx.post(gateway.base_url + "/v1/chat/completions", content=content,
                   headers={"Authorization": f"Bearer {raw}", "Content-Type": "application/json"})
    assert_openai_error(r, 400)


@pytest.mark.parametrize("extra, param", [
    ({"max_tokens": 100_000}, "max_tokens"),
    ({"max_completion_tokens": 5000}, "max_completion_tokens"),
    ({"max_tokens": -1}, "max_tokens"),
    ({"stream": "yes"}, "stream"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
])
def test_400_bad_parameters(world, gateway, openai_client, extra, param):
    world.deployment("m", max_model_len=4096)
    _, raw = world.key()
    error = assert_openai_error(post(gateway, raw, {"model": "m", **CHAT, **extra}), 400)
    assert error["param"] == param


def test_400_through_the_openai_client(world, openai_client):
    world.deployment("m", max_model_len=4096)
    _, raw = world.key()
    with pytest.raises(openai.BadRequestError) as info:
        openai_client(raw).chat.completions.create(model="m", max_tokens=10_000, **CHAT)
    assert "4096" in info.value.message


def test_502_when_upstream_fails_before_the_first_byte(world, gateway, openai_client):
    world.deployment("m", options="fail=500")
    _, raw = world.key()
    assert_openai_error(post(gateway, raw, {"model": "m", **CHAT}), 502, "upstream_error")
    assert_openai_error(post(gateway, raw, {"model": "m", "stream": True, **CHAT}), 502, "upstream_error")
    with pytest.raises(openai.InternalServerError):
        openai_client(raw).chat.completions.create(model="m", stream=True, **CHAT)


def test_502_when_upstream_closes_without_answering(world, gateway):
    world.deployment("m", options="drop=1")
    _, raw = world.key()
    assert_openai_error(post(gateway, raw, {"model": "m", **CHAT}), 502)


def test_upstream_client_errors_keep_their_status(world, gateway):
    world.deployment("m", options="fail=400")
    _, raw = world.key()
    assert_openai_error(post(gateway, raw, {"model": "m", **CHAT}), 400)


def test_502_when_upstream_is_unreachable(world, gateway):
    world.deployment("m", endpoint=f"http://127.0.0.1:{free_port()}")
    _, raw = world.key()
    assert_openai_error(post(gateway, raw, {"model": "m", **CHAT}), 502, "upstream_unreachable")


@pytest.mark.parametrize("status, endpoint", [("provisioning", None), ("failed", None), ("running", "")])
def test_503_when_the_deployment_is_not_running(world, gateway, status, endpoint):
    world.deployment("m", status=status, endpoint=endpoint)
    _, raw = world.key()
    assert_openai_error(post(gateway, raw, {"model": "m", **CHAT}), 503, "deployment_not_running")


def test_users_wait_for_the_first_conformance_run_while_tandem_checks_the_endpoint(world, gateway):
    """Serve answers, but the endpoint is not the users' until the suite has checked it; the suite's own
    service key gets through, and the run's result opens it for everyone."""
    from deployments.conditions import condition_set
    from observability.conformance.runner import service_key_mint

    d = world.deployment("m")
    d.conditions = condition_set([], type="EndpointReady", status=False, reason="ConformancePending",
                                 generation=d.generation, now=timezone.now())
    deployment_observe(deployment_id=d.pk, conditions=d.conditions)  # through their one writer
    _, raw = world.key()
    error = assert_openai_error(post(gateway, raw, {"model": "m", **CHAT}), 503, "endpoint_checking")
    assert "checking its OpenAI behaviour" in error["message"]
    assert httpx.get(gateway.base_url + "/v1/models", headers={"Authorization": f"Bearer {raw}"}).json()["data"] == []
    _, service_raw = service_key_mint(deployment=d)
    assert post(gateway, service_raw, {"model": "m", **CHAT}).status_code == 200

    # The run finished (a failed check opens it too, with a warning on the deployment).
    d.conditions = condition_set(d.conditions, type="ConformancePassed", status=False, reason="ChecksFailed",
                                 generation=d.generation, now=timezone.now())
    deployment_observe(deployment_id=d.pk, conditions=d.conditions)  # through their one writer
    wait_for(lambda: post(gateway, raw, {"model": "m", **CHAT}).status_code == 200, timeout=6)


def test_a_key_named_like_tandems_service_key_gets_nothing_special(world, gateway):
    """Only Tandem marks a key as its own (`is_service`): a team key named `tandem-conformance` whose creator has
    since been deleted (so it has no creator and no owner, as Tandem's keys have none) still waits like
    everyone's."""
    from django.contrib.auth import get_user_model

    from deployments.conditions import condition_set

    d = world.deployment("m")
    d.conditions = condition_set([], type="EndpointReady", status=False, reason="ConformancePending",
                                 generation=d.generation, now=timezone.now())
    deployment_observe(deployment_id=d.pk, conditions=d.conditions)  # through their one writer
    leaver = get_user_model().objects.create_user("leaver")
    world.team.memberships.create(user=leaver, role="admin")
    key, raw = api_key_create(actor=leaver, team=world.team, name="tandem-conformance", team_key=True)
    leaver.delete()
    key.refresh_from_db()
    assert key.created_by is None and key.owner is None and not key.is_service
    assert_openai_error(post(gateway, raw, {"model": "m", **CHAT}), 503, "endpoint_checking")


def test_503_when_the_ray_token_cannot_be_resolved(world, gateway):
    cluster = world.ray_cluster()
    cluster.secret_ref = "env:TANDEM_CLUSTER_TEST_UNSET_VARIABLE"
    cluster.save()
    world.deployment("m", cluster=cluster)
    _, raw = world.key()
    error = assert_openai_error(post(gateway, raw, {"model": "m", **CHAT}), 503)
    # Key holders learn which cluster is broken, not where its secret lives.
    assert f"cluster {cluster.name}" in error["message"]
    assert "TANDEM_CLUSTER_TEST_UNSET_VARIABLE" not in error["message"]


def test_504_when_upstream_is_too_slow(world, gateway, openai_client):
    world.deployment("m", options="ttft=3")  # the test gateway waits 2s
    _, raw = world.key()
    started = time.monotonic()
    assert_openai_error(post(gateway, raw, {"model": "m", **CHAT}), 504, "upstream_timeout")
    assert time.monotonic() - started < 2.9


def test_405_for_a_wrong_method(gateway):
    assert_openai_error(httpx.get(gateway.base_url + "/v1/chat/completions"), 405)


def test_store_outage_is_a_503_not_a_500(world, tmp_path):
    """A gateway whose database is unreachable answers OpenAI-shaped 503s for keys it has not cached."""
    world.deployment("m")
    _, raw = world.key()
    proc = start_gateway(tmp_path, DATABASE_URL=f"postgres://postgres@127.0.0.1:{free_port()}/nothing")
    try:
        assert_openai_error(post(proc, raw, {"model": "m", **CHAT}), 503, "store_unavailable")
    finally:
        proc.stop()


def test_a_deployment_whose_kv_is_not_on_the_efa_asked_for_stays_closed_saying_why(world, gateway):
    """The conformance run found KV off EFA: users get a 503 with why and the fix, Tandem's service key still gets
    through (a rerun can check a fix), and a run that finds it fixed opens it."""
    from deployments.conditions import condition_set, conformance_passed, endpoint_ready
    from observability.conformance.runner import service_key_mint

    d = world.deployment("m")
    fabric = {"ok": False, "messages": ["KV does not move over EFA on these EFA instance types: prefill: NIXL "
                                        "instantiated UCX, not LIBFABRIC: KV moves over TCP. Fix: run an image "
                                        "with libfabric ..."]}
    checked = conformance_passed(passed=True, summary="12/12 checks passed.", pd_health={"ok": True, "fabric": fabric})
    d.conditions = condition_set([], type="ConformancePassed", generation=d.generation, now=timezone.now(), **checked)
    ready = endpoint_ready(d.conditions, generation=d.generation, answers=True)
    d.conditions = condition_set(d.conditions, type="EndpointReady", generation=d.generation, now=timezone.now(),
                                 **ready)
    deployment_observe(deployment_id=d.pk, conditions=d.conditions)  # through their one writer
    _, raw = world.key()
    error = assert_openai_error(post(gateway, raw, {"model": "m", **CHAT}), 503, "kv_not_on_efa")
    assert "NIXL instantiated UCX, not LIBFABRIC: KV moves over TCP" in error["message"]
    assert httpx.get(gateway.base_url + "/v1/models", headers={"Authorization": f"Bearer {raw}"}).json()["data"] == []
    _, service_raw = service_key_mint(deployment=d)
    assert post(gateway, service_raw, {"model": "m", **CHAT}).status_code == 200

    fixed = conformance_passed(passed=True, summary="12/12 checks passed.",
                               pd_health={"ok": True, "fabric": {"ok": True, "messages": []}})
    d.conditions = condition_set(d.conditions, type="ConformancePassed", generation=d.generation, now=timezone.now(),
                                 **fixed)
    d.conditions = condition_set(d.conditions, type="EndpointReady", generation=d.generation, now=timezone.now(),
                                 **endpoint_ready(d.conditions, generation=d.generation, answers=True))
    deployment_observe(deployment_id=d.pk, conditions=d.conditions)  # through their one writer
    wait_for(lambda: post(gateway, raw, {"model": "m", **CHAT}).status_code == 200, timeout=6, what="the fixed one open")
