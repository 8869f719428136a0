"""One OpenAI request through the gateway: authenticate, check, route, limit, forward, relay, record."""
import asyncio
import logging
import random
from contextlib import nullcontext
from functools import partial

import aiohttp
import orjson

from deployments.redaction import internal_redact
from gateway import metrics
from gateway.errors import GatewayError, bad_gateway, first_byte_timeout, from_upstream, gateway_timeout
from gateway.requests import (ClientGone, RequestHead, check_against_deployment, parse_request, read_body,
                              upstream_body)
from gateway.streaming import NotStarted, read_usage, relay_events
from gateway.timing import Record

log = logging.getLogger(__name__)

JSON = b"application/json"
CLIENT_CLOSED = 499  # nginx's convention for "the client went away first"
# Upstream answers that mean "this replica could not take it" (Ray Serve's proxy answers 503 when its replicas are
# full, 502/504 when one died or hung): another try may reach another replica.
RETRY_STATUSES = frozenset((502, 503, 504))
# Ray Serve LLM answers a request whose replica died under it with a 500 quoting Ray's exception (recorded on the
# local PD stack: bench/recorded/serve-500-decode-killed.json). These say a replica is gone, not that the request
# is wrong; any other 500 is the answer.
REPLICA_DIED = (b"The actor died unexpectedly before finishing this task",  # ray.exceptions.ActorDiedError
                b"failed because an upstream actor died")  # Serve's router, wrapping it (ray/serve/_private/router.py)
# Serve's HTTP proxy answers a bare `Internal Server Error` when the ingress replica itself died under the request
# (the application's own errors are JSON): recorded on the local PD stack while Serve replaced every replica of a
# deployment Tandem restarted (its log: "Request failed: The actor died unexpectedly before finishing this task").
SERVE_PROXY_500 = b"Internal Server Error"
# The mean waits before each retry, jittered over 0.5-1.5x so that retries of one failure spread. The first soon:
# another replica may take it. The second only for a replica that is gone (connect, disconnect, a dead actor):
# by then Serve has dropped it from its routing and queues the request until its replacement runs.
RETRY_WAITS_S = (0.1, 2.0)
UNBOUNDED = nullcontext()  # a whole answer's wait (asyncio.timeout(None) would cost 2 us a request for nothing)


class Retryable(Exception):
    """Upstream failed before the client got any byte of the answer: `error` is what the client gets if no retry
    is left; `reason` labels the retry's metric; `gone`: the replica is gone (it may take two retries for Serve
    to route around it), rather than busy or silent (one retry: more would only add load or wait)."""

    def __init__(self, error: GatewayError, reason: str, gone: bool = False):
        super().__init__(error.message)
        self.error, self.reason, self.gone = error, reason, gone


class Exchange:
    """State shared with the disconnect watcher: whether the response is done and whether the client left; and
    the upstream response being read (closed, not released, when it was not read to its end)."""

    __slots__ = ("task", "finished", "client_gone", "resp")

    def __init__(self):
        self.task = asyncio.current_task()
        self.finished = False
        self.client_gone = False
        self.resp = None


def _client_left(ex: Exchange) -> None:
    # Cancel the handler, which closes the upstream connection and so cancels the generation there too.
    if not ex.finished:
        ex.client_gone = True
        ex.task.cancel()


async def _watch_disconnect(receive, ex: Exchange) -> None:
    # uvicorn's send() silently drops data for a gone client, so only receive() tells us (when the server does not
    # offer gateway.server's connection hook).
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            _client_left(ex)
            return


async def send_error(send, err: GatewayError, request_id: bytes, extra: tuple = ()) -> None:
    body = err.body()
    await send({"type": "http.response.start", "status": err.status,
                "headers": [(b"content-type", JSON), (b"content-length", str(len(body)).encode()),
                            (b"x-request-id", request_id), *err.headers, *extra]})
    await send({"type": "http.response.body", "body": body})


async def handle_openai(gw, head: RequestHead, receive, send):
    """The record is kept under the gateway's own request id (sent upstream too); the client's `X-Request-ID`,
    when sane, is kept beside it and echoed back. One generation of the deployment serves the whole request
    (routing.Route.upstream) and every answer from then on names it (`x-tandem-generation`). An upstream that
    fails before the client got any byte is asked again (_answer says when, _answer_with_retries how often). The
    tokens a key's request used count towards its limit once the request has finished."""
    rec = Record(head.request_id, head.endpoint, head.client_id)
    rid = head.echo_id
    ex = Exchange()
    connection = head.connection
    key = watcher = None
    generation = ()
    status = 200
    try:
        key = await gw.keys.authenticate(head.authorization, head.client)
        rec.key_pk, rec.key_id = key.pk, key.key_id
        raw = await read_body(receive, head.content_length, gw.config.max_body_bytes)
        data = parse_request(raw, head.endpoint)
        rec.model = data["model"]
        rec.stream = data.get("stream") is True
        route = await gw.router.resolve(key, rec.model)
        rec.deployment_id = route.deployment_id
        check_against_deployment(data, route)
        await gw.limiter.check(key)
        body, keep_usage_chunk = upstream_body(raw, data, stream=rec.stream)
        upstream = route.upstream(service=key.service)
        rec.generation = upstream.generation
        generation = (upstream.header,)
        if connection is None:
            watcher = asyncio.ensure_future(_watch_disconnect(receive, ex))
        elif connection.lost:
            raise ClientGone
        else:
            connection.on_lost = partial(_client_left, ex)
        await _answer_with_retries(gw, ex, route, upstream, head, body, send, rec, keep_usage_chunk)
    except GatewayError as err:
        status = err.status
        rec.error_type = err.code or err.type
        ex.finished = True
        await send_error(send, err, rid, generation)
    except ClientGone:
        status, rec.error_type = CLIENT_CLOSED, "client_disconnected"
    except asyncio.CancelledError:
        if not ex.client_gone:
            raise
        asyncio.current_task().uncancel()  # our own cancel: the client left; record it and end quietly
        if not ex.finished:  # it left with the whole answer (at `[DONE]`): a complete request, as recorded
            status, rec.partial, rec.error_type = CLIENT_CLOSED, True, "client_disconnected"
            if rec.stream and not rec.completion_tokens:
                rec.completion_tokens = max(0, rec.chunks - 1)  # an estimate; the record says partial
    except Exception:  # noqa: BLE001 - a bug must still give the client an OpenAI-shaped answer, never a page
        log.exception("gateway error")
        status, rec.error_type = 500, "internal_error"
        if not ex.finished:
            ex.finished = True
            try:
                await send_error(send, GatewayError(500, "The gateway failed; the request id is in the logs.",
                                                    type="server_error", code="internal_error"), rid, generation)
            except RuntimeError:  # the response had already started; the connection is closed instead
                pass
    finally:
        if watcher is not None:
            watcher.cancel()
        elif connection is not None:
            connection.on_lost = None
        if ex.resp is not None:
            if status < 400 and not rec.partial:
                ex.resp.release()
            else:  # not read to the end: closing the connection is what cancels the work upstream
                ex.resp.close()
        rec.finish(status)
        gw.recorder.add(rec)
        if key is not None:
            gw.limiter.spent(key, at=rec.created_at, tokens=rec.prompt_tokens + rec.completion_tokens)


async def _answer_with_retries(gw, ex: Exchange, route, upstream, head: RequestHead, body: bytes, send,
                               rec: Record, keep_usage_chunk: bool) -> None:
    """_answer, tried again while the client has nothing yet, on the same generation (`upstream`) every time:
    once after any Retryable failure, and once more while each failure says the replica is gone (RETRY_WAITS_S).
    A stream silent past its bound is so retried once: two bounds at most."""
    for tried, wait in enumerate((*RETRY_WAITS_S, None), 1):
        try:
            return await _answer(gw, ex, route, upstream, head, body, send, rec, keep_usage_chunk)
        except Retryable as failed:
            if ex.resp is not None:
                ex.resp.close()
                ex.resp = None
            if wait is None or (tried > 1 and not failed.gone):
                raise failed.error from None
            metrics.retried(rec.deployment_id, failed.reason)
            await asyncio.sleep(wait * (0.5 + random.random()))


async def _answer(gw, ex: Exchange, route, upstream, head: RequestHead, body: bytes, send, rec: Record,
                  keep_usage_chunk: bool) -> None:
    """One try at upstream, relayed to the client. Raises Retryable while the client has nothing yet and another
    try may work: the connection failed or broke before the answer, upstream answered 502/503/504 or a 500 that
    says its replica died (REPLICA_DIED), or a stream ended, broke, sent a server error event or stayed silent
    past `first_byte_timeout_s` before its first token (a decode waiting for KV that never comes, or whose KV
    could not be read from a prefill that died). A non-streamed answer is bounded by the read timeout alone, and a
    timeout there is final.
    """
    stream = rec.stream
    header = upstream.header
    try:
        async with asyncio.timeout(gw.config.first_byte_timeout_s) if stream else UNBOUNDED as first_byte:
            resp = ex.resp = await _post(gw, route, upstream.urls[head.endpoint], body, head.request_id)
            if resp.status >= 400:
                error, payload = await _upstream_error(resp, head.request_id)
                if resp.status in RETRY_STATUSES:
                    raise Retryable(error, str(resp.status))
                if resp.status == 500 and _replica_died(payload):
                    raise Retryable(error, "replica_died", gone=True)
                raise error
            if stream and resp.content_type == "text/event-stream":
                start = {"type": "http.response.start", "status": 200, "headers": [
                    (b"content-type", resp.headers.get("Content-Type", "text/event-stream").encode()),
                    (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no"), (b"x-request-id", head.echo_id),
                    header]}
                try:
                    await relay_events(resp, send, rec, start=start, keep_usage_chunk=keep_usage_chunk,
                                       first_byte=first_byte)
                except NotStarted as e:
                    error = (gateway_timeout(gw.config.upstream_timeout_s) if e.timed_out else
                             bad_gateway("The deployment failed before its first token: "
                                         f"{internal_redact(e.failed)}") if e.failed else
                             bad_gateway("The deployment closed the stream before its first token.",
                                         "upstream_disconnected"))
                    raise Retryable(error, "stream_not_started", gone=not e.timed_out) from None
                ex.finished = True
                await send({"type": "http.response.body", "body": b""})
                return
    except TimeoutError:
        if rec.chunks:  # not the bound (lifted with the first event): never a second try once the client has bytes
            raise
        raise Retryable(first_byte_timeout(gw.config.first_byte_timeout_s), "first_byte_timeout") from None
    payload = await _read_all(gw, resp)
    _read_usage(payload, rec)
    ex.finished = True
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", resp.headers.get("Content-Type", "application/json").encode()),
        (b"content-length", str(len(payload)).encode()), (b"x-request-id", head.echo_id), header]})
    await send({"type": "http.response.body", "body": payload})
    rec.bytes_out = len(payload)


def _replica_died(payload: bytes) -> bool:
    """Whether a 500's body is Serve's word for a replica that died under the request."""
    return payload.strip() == SERVE_PROXY_500 or any(marker in payload for marker in REPLICA_DIED)


async def _post(gw, route, url, body: bytes, request_id: str):
    headers = {"Content-Type": "application/json", "X-Request-ID": request_id, **dict(route.headers)}
    try:
        return await gw.session.post(url, data=body, headers=headers)
    except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError):
        raise Retryable(bad_gateway("Could not connect to the deployment.", "upstream_unreachable"),
                        "connect", gone=True) from None
    except asyncio.TimeoutError:  # connected and sent, then no answer within the read timeout: asking again waits
        raise gateway_timeout(gw.config.upstream_timeout_s) from None  # as long again
    except aiohttp.ClientError as e:
        raise Retryable(bad_gateway(f"The deployment failed before answering ({type(e).__name__})."),
                        "disconnected", gone=True) from None


async def _read_all(gw, resp) -> bytes:
    try:
        return await resp.read()
    except asyncio.TimeoutError:
        raise gateway_timeout(gw.config.upstream_timeout_s) from None
    except (aiohttp.ClientError, ConnectionError):  # nothing of it reached the client yet
        raise Retryable(bad_gateway("The deployment broke off its answer.", "upstream_disconnected"),
                        "disconnected", gone=True) from None


async def _upstream_error(resp, request_id: str) -> tuple[GatewayError, bytes]:
    """The client's error for upstream's error answer, and that answer's body. A server-side failure's body is
    logged whole (the client gets it redacted): what the operator needs to see what failed."""
    try:
        payload = await resp.content.read(64 * 1024)
    except (aiohttp.ClientError, asyncio.TimeoutError):
        payload = b""
    if resp.status >= 500:
        log.warning("upstream answered %s to request %s: %s", resp.status, request_id,
                    payload[:4096].decode(errors="replace"))
    return from_upstream(resp.status, payload, resp.headers.get("Retry-After")), payload


def _read_usage(payload: bytes, rec) -> None:
    """`usage` of a whole answer: usually the last object in it, so that object alone is read when it can be."""
    start = payload.rfind(b'"usage":{')
    if start >= 0:
        try:
            usage = orjson.loads(payload[start + 8:payload.index(b"}", start) + 1])
            if "prompt_tokens" in usage:
                read_usage(usage, rec)
                return
        except (orjson.JSONDecodeError, ValueError):
            pass
    try:
        usage = orjson.loads(payload).get("usage")
    except (orjson.JSONDecodeError, AttributeError):
        return
    if isinstance(usage, dict):
        read_usage(usage, rec)
