"""Server-sent events passed through chunk by chunk, reading usage and dropping the usage chunk nobody asked for."""
import asyncio

import aiohttp
import orjson

from gateway.errors import upstream_error_event

DONE = b"data: [DONE]\n\n"
UPSTREAM_FAILURES = (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError)


def take_usage(data: bytes, rec, keep_usage_chunk: bool) -> bytes:
    """Read `usage` from whole events in `data`; drop a usage-only chunk (`choices == []`) unless the client asked."""
    kept, dropped = [], False
    for event in data.split(b"\n\n"):
        if b'"usage"' in event and event.startswith(b"data:"):
            try:
                obj = orjson.loads(event[5:])
            except orjson.JSONDecodeError:
                obj = None
            usage = obj.get("usage") if isinstance(obj, dict) else None
            if isinstance(usage, dict):
                rec.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                rec.completion_tokens = int(usage.get("completion_tokens") or 0)
                if not keep_usage_chunk and not obj.get("choices"):
                    dropped = True
                    continue
        kept.append(event)
    return b"\n\n".join(kept) if dropped else data


def _split_complete(data: bytes) -> int:
    """Where the last whole event in `data` ends (0 when none has ended yet)."""
    lf, crlf = data.rfind(b"\n\n"), data.rfind(b"\r\n\r\n")
    return max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)


async def relay_events(resp, send, rec, *, keep_usage_chunk: bool) -> None:
    """Send each upstream read on at once. Only an unfinished trailing event is held until its end arrives:
    a client cannot use half an event, and whole events are needed to find and drop the usage chunk.
    An upstream that breaks or ends without `[DONE]` gives the client an error event and `[DONE]`.
    """
    read = resp.content.readany
    tail = b""
    events = 0
    saw_done = False
    failure = None
    try:
        while True:
            data = await read()
            if not data:
                break
            if tail:
                data, tail = tail + data, b""
            if not data.endswith(b"\n\n"):
                cut = _split_complete(data)
                data, tail = data[:cut], data[cut:]
                if not data:
                    continue
            if b'"usage"' in data:
                data = take_usage(data, rec, keep_usage_chunk)
            saw_done = data.endswith(DONE)
            events += data.count(b"\n\n")
            await send({"type": "http.response.body", "body": data, "more_body": True})
            rec.chunk_sent(len(data))
    except UPSTREAM_FAILURES as e:
        failure = e
    if saw_done and not tail:
        return
    if tail and failure is None:
        await send({"type": "http.response.body", "body": tail, "more_body": True})
        rec.chunk_sent(len(tail))
    # Upstream dropped mid-stream: what was counted so far is an estimate (about one event per token).
    rec.partial = True
    rec.error_type = "upstream_timeout" if isinstance(failure, asyncio.TimeoutError) else "upstream_disconnected"
    if not rec.completion_tokens:
        rec.completion_tokens = max(0, events - 1)
    message = ("The deployment stopped answering mid-stream." if rec.error_type == "upstream_timeout"
               else "The deployment closed the stream before it finished.")
    body = upstream_error_event(message, rec.error_type)
    await send({"type": "http.response.body", "body": body, "more_body": True})
    rec.chunk_sent(len(body))
