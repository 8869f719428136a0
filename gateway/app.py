"""The gateway's ASGI application: lifespan (pools, listeners) and a tiny router over a handful of paths."""
import asyncio
import logging

import aiohttp
import orjson
import redis.asyncio as aioredis

from gateway import metrics
from gateway.announcements import Listener
from gateway.config import GatewayConfig
from gateway.errors import GatewayError
from gateway.keys import AuthFailures, KeyRing
from gateway.proxy import handle_openai, send_error
from gateway.ratelimit import RateLimiter
from gateway.requests import RequestHead
from gateway.routing import Router
from gateway.store import Store
from gateway.timing import Recorder
from gateway.wake import Waker

log = logging.getLogger(__name__)

OPENAI_POSTS = {b"/v1/chat/completions": "chat.completions", b"/v1/completions": "completions",
                b"/v1/embeddings": "embeddings"}


class Gateway:
    """One gateway process: caches, one pooled upstream client, a recorder; no state replicas must share."""

    def __init__(self, config: GatewayConfig):
        self.config = config
        self.store = Store(config.database_conninfo)
        self.failures = AuthFailures(limit=config.auth_failures_per_minute, max_addresses=config.cache_max_entries)
        self.keys = KeyRing(self.store, hmac_secret=config.hmac_secret, ttl=config.key_ttl_s,
                            max_stale=config.max_stale_s, negative_ttl=config.negative_ttl_s,
                            max_entries=config.cache_max_entries, failures=self.failures)
        self.router = Router(self.store, ttl=config.route_ttl_s, max_stale=config.max_stale_s,
                             max_entries=config.cache_max_entries)
        self.announcements = Listener(keys=self.keys.cache, routes=self.router.cache)
        self.metrics_server = None
        self.in_flight = 0
        self.redis = None
        self.session = None
        self.limiter = None
        self.recorder = None
        self._tasks: list[asyncio.Task] = []

    async def startup(self) -> None:
        try:
            self.metrics_server = await metrics.serve(self.config.metrics_host, self.config.metrics_port)
        except OSError as e:
            raise RuntimeError(f"cannot serve metrics on {self.config.metrics_host}:{self.config.metrics_port} ({e}); "
                               "set TANDEM_GATEWAY_METRICS_HOST/_PORT") from None
        await self.store.open()
        # The process's one Redis client: rate limits, the request recorder and the announcements share its pool.
        self.redis = aioredis.Redis.from_url(self.config.redis_url)
        self.limiter = RateLimiter(self.redis, interval=self.config.flush_interval_s,
                                   max_keys=self.config.cache_max_entries)
        self.router.waker = Waker(self.redis)
        self.recorder = Recorder(self.redis, interval=self.config.flush_interval_s, access_log=self.config.access_log)
        metrics.watch_sizes(keys=self.keys.cache, routes=self.router.cache, auth_failures=self.failures,
                            rate_limits=self.limiter)
        metrics.IN_FLIGHT.set_function(lambda: self.in_flight)
        # One pooled client for every deployment; no connection limit (streams are long-lived and many).
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=self.config.upstream_keepalive_s),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.config.connect_timeout_s,
                                          sock_read=self.config.upstream_timeout_s),
            skip_auto_headers=("Accept-Encoding", "User-Agent"), auto_decompress=False)
        self._tasks = [asyncio.ensure_future(self.announcements.run(self.redis)),
                       asyncio.ensure_future(self.recorder.run()),
                       asyncio.ensure_future(self.limiter.run()),
                       asyncio.ensure_future(self.keys.keep_known_ids(every=self.config.max_stale_s))]
        try:  # refuse traffic until revocations and endpoint changes can reach us
            await asyncio.wait_for(self.announcements.listening.wait(), timeout=10)
        except asyncio.TimeoutError:
            log.warning("announcement channels not subscribed yet; starting anyway")
        log.info("gateway ready on %s:%s", self.config.host, self.config.port)

    async def shutdown(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.recorder.pending:
            await self.recorder.flush()
        await self.limiter.sync()
        await self.session.close()
        await self.redis.aclose()
        await self.store.close()
        await self.metrics_server.cleanup()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            await self.http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self.lifespan(receive, send)

    async def lifespan(self, receive, send):
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as e:  # noqa: BLE001 - reported to the server, which exits
                    log.exception("gateway failed to start")
                    await send({"type": "lifespan.startup.failed", "message": str(e)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def http(self, scope, receive, send):
        path, method = scope["raw_path"].partition(b"?")[0], scope["method"]
        endpoint = OPENAI_POSTS.get(path)
        head = RequestHead.from_scope(scope, endpoint or "")
        if endpoint is not None and method == "POST":
            self.in_flight += 1
            try:
                await handle_openai(self, head, receive, send)
            finally:
                self.in_flight -= 1
        elif path == b"/v1/models" and method == "GET":
            await self.list_models(head, send)
        elif path in (b"/healthz", b"/readyz") and method == "GET":
            ready = path == b"/healthz" or self.announcements.listening.is_set()
            await _plain(send, 200 if ready else 503, b'{"status":"%s"}' % (b"ok" if ready else b"not ready"),
                         b"application/json")
        elif endpoint is not None or path == b"/v1/models":
            await send_error(send, GatewayError(405, f"{method} is not allowed here.", code="method_not_allowed"),
                             head.echo_id)
        else:
            await send_error(send, GatewayError(404, f"There is no {path[:200].decode(errors='replace')} here; the "
                                                     "gateway serves /v1/models, /v1/chat/completions, "
                                                     "/v1/completions and /v1/embeddings.", code="not_found"),
                             head.echo_id)

    async def list_models(self, head: RequestHead, send) -> None:
        try:
            key = await self.keys.authenticate(head.authorization, head.client)
            routes = await self.router.models(key)
        except GatewayError as err:
            await send_error(send, err, head.echo_id)
            return
        body = orjson.dumps({"object": "list", "data": [
            {"id": r.model_id, "object": "model", "created": r.created, "owned_by": key.team_slug} for r in routes]})
        await _plain(send, 200, body, b"application/json", head.echo_id)


async def _plain(send, status: int, body: bytes, content_type: bytes, request_id: bytes | None = None):
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    if request_id:
        headers.append((b"x-request-id", request_id))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
