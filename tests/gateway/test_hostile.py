"""The gateway under hostile traffic, each attack against a real gateway process: replayed request ids, floods of
made-up keys, password-style guessing, a control plane that goes away, and a look at other tenants' metrics."""
import asyncio
import secrets
import socket
import time
from urllib.parse import urlsplit, urlunsplit

import httpx
import orjson
import pytest
from django.conf import settings
from prometheus_client.parser import text_string_to_metric_families

from deployments.services.api_keys import api_key_create, api_key_revoke
from tests.deployments.services.test_credentials import legacy_secret, make_legacy
from tests.factories import MembershipFactory, TeamFactory
from tests.gateway.conftest import start_gateway
from tests.gateway.tcp_proxy import TcpProxy
from tests.gateway.test_errors import CHAT, assert_openai_error, post
from tests.support import processes
from tests.support.processes import wait_for
from usage.models import RequestRecord
from usage.tasks import drain_request_records


def _through(url: str, proxy: TcpProxy) -> str:
    parts = urlsplit(url)
    auth = parts.netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=(auth + "@" if auth else "") + proxy.address))


def _proxied(url: str) -> TcpProxy:
    parts = urlsplit(url)
    return TcpProxy(parts.hostname, parts.port, postgres=parts.scheme.startswith("postgres"))


def _metric(gw, name: str, **labels) -> float:
    for family in text_string_to_metric_families(httpx.get(gw.metrics_url).text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


def _made_up_keys(n: int) -> list[str]:
    """Keys an attacker can make: the current shape with a random check, the older three-part shape, junk."""
    random43 = lambda: secrets.token_urlsafe(32).replace("_", "x").replace("-", "y")  # noqa: E731
    keys = []
    for i in range(n):
        kind = i % 3
        if kind == 0:
            keys.append(f"tdm_{secrets.token_hex(6)}_{random43()}_{random43()[:6]}")
        elif kind == 1:
            keys.append(f"tdm_{secrets.token_hex(6)}_{random43()}")
        else:
            keys.append(f"tdm_{secrets.token_hex(6)}{random43()}")
    return keys


async def _flood(base_url: str, keys: list[str], concurrency: int = 32,
                 statuses: dict[int, int] | None = None) -> dict[int, int]:
    """Answers by status; pass `statuses` to watch them come in."""
    import aiohttp

    statuses = {} if statuses is None else statuses
    queue = iter(keys)
    body = orjson.dumps({"model": "m", **CHAT})
    async with aiohttp.ClientSession(base_url, timeout=aiohttp.ClientTimeout(total=30)) as client:
        async def worker():
            for key in queue:
                async with client.post("/v1/chat/completions", data=body, headers={
                        "Authorization": f"Bearer {key}", "Content-Type": "application/json"}) as r:
                    await r.read()
                    statuses[r.status] = statuses.get(r.status, 0) + 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return statuses


def test_a_replayed_request_id_is_counted_every_time(world, gateway, api):
    """The client's X-Request-ID is echoed and kept, but it is not the record's key: reusing it (or another team
    using the same one first) hides nothing."""
    ours = world.deployment("m")
    theirs_team = TeamFactory()
    theirs_member = MembershipFactory(team=theirs_team).user
    theirs = world.deployment("m", team=theirs_team)
    key, raw = world.key()
    _, their_raw = api_key_create(actor=theirs_member, team=theirs_team, name="theirs")
    for raw_key, times in ((their_raw, 2), (raw, 5)):  # they claim the id first
        for _ in range(times):
            r = httpx.post(gateway.base_url + "/v1/chat/completions", json={"model": "m", **CHAT},
                           headers={"Authorization": f"Bearer {raw_key}", "X-Request-ID": "predictable-1"})
            assert r.status_code == 200 and r.headers["x-request-id"] == "predictable-1"

    api.force_authenticate(world.member)

    def usage():
        drain_request_records()
        return api.get(f"/api/v1/usage/?deployment={ours.pk}&window=1h").json()

    wait_for(lambda: usage() and usage()[0]["requests"] == 5, timeout=10, every=0.2, what="5 requests in the usage")
    assert usage()[0]["api_key"] == key.key_id and usage()[0]["completion_tokens"] == 5 * 8
    records = RequestRecord.objects.filter(client_request_id="predictable-1")
    assert records.count() == 7 and len({r.request_id for r in records}) == 7
    assert records.filter(deployment=ours).count() == 5 and records.filter(deployment=theirs).count() == 2
    key.refresh_from_db()
    assert key.last_used_at is not None


def test_a_flood_of_made_up_keys_never_reaches_the_database(world, tmp_path):
    """Keys with a wrong check segment, keys of the older shape whose id is no live key's, and junk are refused
    without one query (counted on the wire to PostgreSQL); the key cache does not grow; a real key made during
    the flood gets in."""
    world.deployment("m")
    pg = _proxied(processes.test_database_url())
    gw = start_gateway(tmp_path, DATABASE_URL=_through(processes.test_database_url(), pg),
                       TANDEM_GATEWAY_KEY_MAX_STALE_S="600")
    try:
        wait_for(lambda: pg.queries >= 1, timeout=10, what="the startup read")  # the startup read of live key ids
        time.sleep(0.3)
        before = pg.queries
        statuses = asyncio.run(_flood(gw.base_url, _made_up_keys(3000)))
        assert statuses == {401: 3000}
        assert pg.queries == before, f"{pg.queries - before} database queries for 3000 made-up keys"
        assert _metric(gw, "tandem_gateway_cache_entries", cache="keys") == 0

        _, raw = world.key()

        async def flood_and_a_real_key():
            answered: dict[int, int] = {}
            flood = asyncio.ensure_future(_flood(gw.base_url, _made_up_keys(3000), statuses=answered))
            while sum(answered.values()) < 100 and not flood.done():  # under way, far from done (3000)
                await asyncio.sleep(0.001)
            assert not flood.done(), "the flood ended before the real key was tried"
            async with httpx.AsyncClient(base_url=gw.base_url, timeout=10) as client:
                real = await client.post("/v1/chat/completions", json={"model": "m", **CHAT},
                                         headers={"Authorization": f"Bearer {raw}"})
            return real.status_code, await flood

        real, statuses = asyncio.run(flood_and_a_real_key())
        assert real == 200 and statuses == {401: 3000}
        assert pg.queries - before == 2  # the real key's row and its team's routes; nothing for the flood
        assert _metric(gw, "tandem_gateway_cache_entries", cache="keys") == 1
        assert _metric(gw, "tandem_gateway_store_queries_total", query="key") == 1
    finally:
        gw.stop()
        pg.close()


def test_keys_minted_before_check_segments_keep_working(world, tmp_path):
    """A three-part key from before the upgrade authenticates (its id is a live key's); a made-up secret for the
    same id does not, and revoking it works as for any key."""
    world.deployment("m")
    key, _ = world.key()
    raw = make_legacy(key, "tdm")
    gw = start_gateway(tmp_path)
    try:
        assert post(gw, raw, {"model": "m", **CHAT}).status_code == 200
        assert_openai_error(post(gw, legacy_secret("tdm", key.key_id), {"model": "m", **CHAT}), 401)
        api_key_revoke(actor=world.member, key=key)
        wait_for(lambda: post(gw, raw, {"model": "m", **CHAT}).status_code == 401, timeout=2)
    finally:
        gw.stop()


def test_failed_authentications_are_limited_per_client_address(world, tmp_path):
    world.deployment("m")
    _, raw = world.key()
    _, fresh = world.key()
    legacy = make_legacy(world.key()[0], "tdm")
    gw = start_gateway(tmp_path, TANDEM_GATEWAY_AUTH_FAILURES_PER_MINUTE="5",
                       TANDEM_GATEWAY_FORWARDED_ALLOW_IPS="127.0.0.1")
    guesser = httpx.Client(base_url=gw.base_url, transport=httpx.HTTPTransport(local_address="127.0.0.2"))
    neighbour = httpx.Client(base_url=gw.base_url)
    try:
        assert post(gw, raw, {"model": "m", **CHAT}).status_code == 200  # the gateway now holds this key
        guesses = _made_up_keys(5)
        for guess in guesses:
            assert_openai_error(guesser.post("/v1/chat/completions", json={"model": "m", **CHAT},
                                             headers={"Authorization": f"Bearer {guess}"}), 401)
        r = guesser.post("/v1/chat/completions", json={"model": "m", **CHAT},
                         headers={"Authorization": f"Bearer {guesses[0]}"})
        assert_openai_error(r, 429, "too_many_auth_failures")
        assert 1 <= int(r.headers["retry-after"]) <= 60
        # Refused before any check, even for a key from before check segments that the gateway would have to
        # look up (only a lookup could tell it from a guess)...
        assert guesser.post("/v1/chat/completions", json={"model": "m", **CHAT},
                            headers={"Authorization": f"Bearer {legacy}"}).status_code == 429
        # ...while a key it already holds costs nothing and still works, and a new key whose check segment is
        # right (only the server's secret makes one) is looked up and served: someone sharing the guesser's address
        # (a NAT, a proxy) is not locked out. Other addresses are not affected.
        assert guesser.post("/v1/chat/completions", json={"model": "m", **CHAT},
                            headers={"Authorization": f"Bearer {fresh}"}).status_code == 200
        assert guesser.post("/v1/chat/completions", json={"model": "m", **CHAT},
                            headers={"Authorization": f"Bearer {raw}"}).status_code == 200
        assert_openai_error(neighbour.post("/v1/chat/completions", json={"model": "m", **CHAT},
                                           headers={"Authorization": f"Bearer {guesses[0]}"}), 401)
        assert neighbour.post("/v1/chat/completions", json={"model": "m", **CHAT},
                              headers={"Authorization": f"Bearer {fresh}"}).status_code == 200
        # Behind a trusted proxy the client is the one X-Forwarded-For names.
        for _ in range(5):
            neighbour.get("/v1/models", headers={"X-Forwarded-For": "203.0.113.7", "Authorization": "Bearer x"})
        assert_openai_error(neighbour.get("/v1/models", headers={"X-Forwarded-For": "203.0.113.7",
                                                                 "Authorization": "Bearer x"}), 429)
        assert_openai_error(neighbour.get("/v1/models", headers={"X-Forwarded-For": "203.0.113.8",
                                                                 "Authorization": "Bearer x"}), 401)
    finally:
        guesser.close()
        neighbour.close()
        gw.stop()


def test_revocation_fails_closed_while_the_control_plane_is_unreachable(world, tmp_path):
    """PostgreSQL and Redis both cut off from the gateway, a key revoked meanwhile: the gateway honours its
    cached key at most TANDEM_GATEWAY_KEY_MAX_STALE_S, then answers 503 (never 200) until it can check again,
    and then 401."""
    world.deployment("m")
    key, raw = world.key()
    pg, rd = _proxied(processes.test_database_url()), _proxied(settings.REDIS_URL)
    gw = start_gateway(tmp_path, DATABASE_URL=_through(processes.test_database_url(), pg),
                       REDIS_URL=_through(settings.REDIS_URL, rd), TANDEM_GATEWAY_KEY_MAX_STALE_S="2")
    try:
        assert post(gw, raw, {"model": "m", **CHAT}).status_code == 200
        pg.cut()
        rd.cut()
        api_key_revoke(actor=world.member, key=key)  # committed, announced; the gateway hears neither
        cut_at = time.monotonic()

        def refused():
            r = post(gw, raw, {"model": "m", **CHAT})
            return r if r.status_code != 200 else None

        r = wait_for(refused, timeout=4, every=0.1, what="the revoked key refused in the outage")
        assert time.monotonic() - cut_at < 3.5
        error = assert_openai_error(r, 503, "store_unavailable")
        assert "try again" in error["message"] and int(r.headers["retry-after"]) >= 1
        for _ in range(5):
            assert_openai_error(post(gw, raw, {"model": "m", **CHAT}), 503, "store_unavailable")
            time.sleep(0.2)
        pg.restore()
        rd.restore()
        r = wait_for(lambda: (lambda r: r if r.status_code == 401 else None)(post(gw, raw, {"model": "m", **CHAT})),
                     timeout=10, every=0.2, what="a 401 once the store is back")
        assert "revoked" in r.json()["error"]["message"]
    finally:
        gw.stop()
        pg.close()
        rd.close()


def test_a_gateway_that_lost_its_revocation_channel_still_refuses_within_the_limit(world, tmp_path):
    world.deployment("m")
    key, raw = world.key()
    rd = _proxied(settings.REDIS_URL)
    gw = start_gateway(tmp_path, REDIS_URL=_through(settings.REDIS_URL, rd), TANDEM_GATEWAY_KEY_MAX_STALE_S="2")
    try:
        assert post(gw, raw, {"model": "m", **CHAT}).status_code == 200
        rd.cut()
        api_key_revoke(actor=world.member, key=key)
        revoked_at = time.monotonic()
        r = wait_for(lambda: (lambda r: r if r.status_code != 200 else None)(post(gw, raw, {"model": "m", **CHAT})),
                     timeout=4, every=0.1, what="the revoked key refused")
        assert_openai_error(r, 401)
        assert time.monotonic() - revoked_at < 3
    finally:
        gw.stop()
        rd.close()


def test_metrics_are_not_on_the_public_port(world, gateway):
    dep = world.deployment("m")
    _, raw = world.key()
    assert post(gateway, raw, {"model": "m", **CHAT}).status_code == 200
    assert_openai_error(httpx.get(gateway.base_url + "/metrics"), 404, "not_found")
    wait_for(lambda: f'deployment="{dep.pk}"' in httpx.get(gateway.metrics_url).text, timeout=3)
    assert urlsplit(gateway.metrics_url).hostname == "127.0.0.1"


@pytest.mark.parametrize("size", [100 * 1024, 32 * 1024 * 1024])
def test_oversized_headers_get_a_431_without_the_gateway_holding_them(world, gateway, size):
    """A header line far past any real client's, never finished: the gateway must not keep it in memory. It
    answers 431 once the head passes 64 KiB and closes the connection."""
    _, raw = world.key()
    before = gateway.rss_kib()
    sock = socket.create_connection(("127.0.0.1", urlsplit(gateway.base_url).port), timeout=10)
    answer = b""
    try:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + raw.encode() +
                     b"\r\nX-Filler: ")
        try:
            for _ in range(size // 65536):
                sock.sendall(b"a" * 65536)
        except (BrokenPipeError, ConnectionResetError):
            pass
        time.sleep(0.2)
        grown_mib = (gateway.rss_kib() - before) / 1024
        sock.settimeout(5)
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except (ConnectionResetError, TimeoutError):
            pass
    finally:
        sock.close()
    assert grown_mib < 16, f"the gateway grew by {grown_mib:.0f} MiB holding an unfinished header"
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
    assert b'"code":"request_headers_too_large"' in answer
