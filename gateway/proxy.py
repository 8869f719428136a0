"""One OpenAI request through the gateway: authenticate, check, route, limit, forward, relay, record."""
import asyncio
import logging
from functools import partial

import aiohttp
import orjson

from gateway.errors import GatewayError, bad_gateway, from_upstream, gateway_timeout
from gateway.requests import (ClientGone, RequestHead, check_against_deployment, parse_request, read_body,
                              upstream_body)
from gateway.streaming import read_usage, relay_events
from gateway.timing import Record

log = logging.getLogger(__name__)

JSON = b"application/json"
CLIENT_CLOSED = 499  # nginx's convention for "the client went away first"


class Exchange:
    """State shared with the disconnect watcher: whether the response is done and whether the client left."""

    __slots__ = ("task", "finished", "client_gone")

    def __init__(self):
        self.task = asyncio.current_task()
        self.finished = False
        self.client_gone = False


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


async def send_error(send, err: GatewayError, request_id: bytes) -> None:
    body = err.body()
    await send({"type": "http.response.start", "status": err.status,
                "headers": [(b"content-type", JSON), (b"content-length", str(len(body)).encode()),
                            (b"x-request-id", request_id), *err.headers]})
    await send({"type": "http.response.body", "body": body})


async def handle_openai(gw, head: RequestHead, receive, send):
    """The record is kept under the gateway's own request id (sent upstream too); the client's `X-Request-ID`,
    when sane, is kept beside it and echoed back. The tokens a key's request used count towards its limit once
    the request has finished."""
    rec = Record(head.request_id, head.endpoint, head.client_id)
    rid = head.echo_id
    ex = Exchange()
    connection = head.connection
    key = watcher = resp = None
    status = 200
    try:
        key = await gw.keys.authenticate(head.authorization, head.client)
        rec.key_pk, rec.key_id = key.pk, key.key_id
        raw = await read_body(receive, head.content_length, gw.config.max_body_bytes)
        data = parse_request(raw, head.endpoint)
        rec.model = data["model"]
        stream = rec.stream = data.get("stream") is True
        route = await gw.router.resolve(key, rec.model)
        rec.deployment_id = route.deployment_id
        check_against_deployment(data, route)
        await gw.limiter.check(key)
        body, keep_usage_chunk = upstream_body(raw, data, stream=stream)
        if connection is None:
            watcher = asyncio.ensure_future(_watch_disconnect(receive, ex))
        elif connection.lost:
            raise ClientGone
        else:
            connection.on_lost = partial(_client_left, ex)
        resp = await _post(gw, route, head.endpoint, body, head.request_id)
        if resp.status >= 400:
            raise await _upstream_error(resp)
        if stream and resp.content_type == "text/event-stream":
            await send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-type", resp.headers.get("Content-Type", "text/event-stream").encode()),
                (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no"), (b"x-request-id", rid)]})
            await relay_events(resp, send, rec, keep_usage_chunk=keep_usage_chunk)
            ex.finished = True
            await send({"type": "http.response.body", "body": b""})
        else:
            payload = await _read_all(gw, resp)
            _read_usage(payload, rec)
            ex.finished = True
            await send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-type", resp.headers.get("Content-Type", "application/json").encode()),
                (b"content-length", str(len(payload)).encode()), (b"x-request-id", rid)]})
            await send({"type": "http.response.body", "body": payload})
            rec.bytes_out = len(payload)
    except GatewayError as err:
        status = err.status
        rec.error_type = err.code or err.type
        ex.finished = True
        await send_error(send, err, rid)
    except ClientGone:
        status, rec.error_type = CLIENT_CLOSED, "client_disconnected"
    except asyncio.CancelledError:
        if not ex.client_gone:
            raise
        asyncio.current_task().uncancel()  # our own cancel: the client left; record it and end quietly
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
                                                    type="server_error", code="internal_error"), rid)
            except RuntimeError:  # the response had already started; the connection is closed instead
                pass
    finally:
        if watcher is not None:
            watcher.cancel()
        elif connection is not None:
            connection.on_lost = None
        if resp is not None:
            if status < 400 and not rec.partial:
                resp.release()
            else:  # not read to the end: closing the connection is what cancels the work upstream
                resp.close()
        rec.finish(status)
        gw.recorder.add(rec)
        if key is not None:
            gw.limiter.spent(key, at=rec.created_at, tokens=rec.prompt_tokens + rec.completion_tokens)


async def _post(gw, route, endpoint: str, body: bytes, request_id: str):
    headers = {"Content-Type": "application/json", "X-Request-ID": request_id, **dict(route.headers)}
    try:
        return await gw.session.post(route.urls[endpoint], data=body, headers=headers)
    except asyncio.TimeoutError:
        raise gateway_timeout(gw.config.upstream_timeout_s) from None
    except aiohttp.ClientConnectorError:
        raise bad_gateway("Could not connect to the deployment.", "upstream_unreachable") from None
    except aiohttp.ClientError as e:
        raise bad_gateway(f"The deployment failed before answering ({type(e).__name__}).") from None


async def _read_all(gw, resp) -> bytes:
    try:
        return await resp.read()
    except asyncio.TimeoutError:
        raise gateway_timeout(gw.config.upstream_timeout_s) from None
    except (aiohttp.ClientError, ConnectionError):
        raise bad_gateway("The deployment broke off its answer.", "upstream_disconnected") from None


async def _upstream_error(resp) -> GatewayError:
    try:
        payload = await resp.content.read(64 * 1024)
    except (aiohttp.ClientError, asyncio.TimeoutError):
        payload = b""
    return from_upstream(resp.status, payload, resp.headers.get("Retry-After"))


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
