"""Server-sent events passed through chunk by chunk, reading usage and dropping the usage chunk nobody asked for.

Events end with a blank line, LF (`\n\n`, as vLLM sends) or CRLF (`\r\n\r\n`); both pass through unchanged."""
import asyncio
import re

import aiohttp
import orjson

from gateway.errors import upstream_error_event

UPSTREAM_FAILURES = (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError)
_EVENT_END = re.compile(rb"\r\n\r\n|\n\n")
DONE_ENDINGS = (b"[DONE]\n\n", b"[DONE]\r\n\r\n")
_MAX_COUNT = 2 ** 31 - 1  # what a record's token columns hold
_INF = float("inf")


def _count(value) -> int:
    return min(int(value), _MAX_COUNT) if type(value) in (int, float) and 0 <= value < _INF else 0


def read_usage(usage, rec) -> None:
    """Token counts from an OpenAI `usage` object into the record; anything but a sane count reads as 0, so a
    strange upstream cannot make a record the database refuses (and stop the drain behind it)."""
    rec.prompt_tokens = _count(usage.get("prompt_tokens"))
    rec.completion_tokens = _count(usage.get("completion_tokens"))


def take_usage(data: bytes, rec, keep_usage_chunk: bool) -> bytes:
    """Read `usage` from whole events in `data`; drop a usage-only chunk (`choices == []`) unless the client asked."""
    kept, dropped, start = [], False, 0
    for end in _EVENT_END.finditer(data):
        event, start = data[start:end.end()], end.end()
        if b'"usage"' in event and event.startswith(b"data:"):
            try:
                obj = orjson.loads(event[5:])
            except orjson.JSONDecodeError:
                obj = None
            usage = obj.get("usage") if isinstance(obj, dict) else None
            if isinstance(usage, dict):
                read_usage(usage, rec)
                if not keep_usage_chunk and not obj.get("choices"):
                    dropped = True
                    continue
        kept.append(event)
    return b"".join(kept) + data[start:] if dropped else data


def _ends_with_done(data: bytes) -> bool:
    """Whether the last event in `data` is `data: [DONE]` (either framing)."""
    last = data.rstrip(b"\r\n")
    return last.endswith(b"[DONE]") and last[:-6].rstrip(b" ").endswith(b"data:")


def _split_complete(data: bytes) -> int:
    """Where the last whole event in `data` ends (0 when none has ended yet)."""
    lf, crlf = data.rfind(b"\n\n"), data.rfind(b"\r\n\r\n")
    return max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)


class NotStarted(Exception):
    """Upstream ended, broke or failed before its first token: nothing reached the client, so it may be asked again.
    `timed_out`: it stopped answering (a read timeout) rather than closing; `failed`: the message of the server
    error event it ended with (vLLM's "Internal server error" for a request whose KV could not be loaded: seen on
    the local PD stack when the prefill died under it)."""

    def __init__(self, timed_out: bool, failed: str | None = None):
        super().__init__("upstream stream ended before its first token")
        self.timed_out, self.failed = timed_out, failed


PREAMBLE = object()  # _opening: every event so far is empty


def _opening(data: bytes):
    """What the whole events in `data` say of an answer not yet begun: PREAMBLE while none holds anything of it
    (vLLM opens a chat stream with `{"delta": {"role": "assistant", "content": ""}}` before its first token, and
    may follow it with an error), a server error event's message when one comes first, or None once the answer
    begins (a token, a tool call, a finish, `[DONE]`, a client error, or anything not understood)."""
    start = 0
    for end in _EVENT_END.finditer(data):
        event, start = data[start:end.start()], end.end()
        if not event.startswith(b"data:"):
            continue  # a comment or another field: not part of the answer
        try:
            obj = orjson.loads(event[5:])
        except orjson.JSONDecodeError:
            return None
        if not isinstance(obj, dict):
            return None
        error = obj.get("error")
        if isinstance(error, dict):
            code = error.get("code")
            if isinstance(code, int) and code < 500:
                return None  # the request's own fault: the client's answer, as upstream gave it
            return str(error.get("message") or "")[:300] or "an error"
        choices = obj.get("choices")
        if not isinstance(choices, list) or not choices or not all(_empty_choice(c) for c in choices):
            return None
    return PREAMBLE


def _empty_choice(choice) -> bool:
    if not isinstance(choice, dict) or choice.get("finish_reason") is not None:
        return False
    delta = choice.get("delta", {"text": choice.get("text")})
    return isinstance(delta, dict) and not any(value for key, value in delta.items() if key != "role")


async def relay_events(resp, send, rec, *, start: dict, keep_usage_chunk: bool, first_byte=None) -> None:
    """Send each upstream read on at once. Only an unfinished trailing event is held until its end arrives:
    a client cannot use half an event, and whole events are needed to find and drop the usage chunk.

    The response's head (`start`) goes out with the first event that holds anything of the answer (events before
    it with nothing in them are held: _opening), so until then the client has nothing and an upstream that ends,
    breaks or sends a server error event raises NotStarted (the caller may retry). `first_byte`, an
    asyncio.Timeout bounding the wait for that event, is lifted once it is sent. An upstream that breaks or ends
    without `[DONE]` after that gives the client an error event and `[DONE]`.
    """
    read = resp.content.readany
    tail = held = b""
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
            if not data.endswith(b"\n\n"):  # (a CRLF-framed event ends in "\r\n", never in "\n\n")
                cut = _split_complete(data)
                data, tail = data[:cut], data[cut:]
                if not data:
                    continue
            if b'"usage"' in data:
                data = take_usage(data, rec, keep_usage_chunk)
            saw_done = data.endswith(DONE_ENDINGS) and _ends_with_done(data)
            events += data.count(b"\n\n") or data.count(b"\r\n\r\n")
            if start is not None:
                opening = _opening(data)
                if opening is PREAMBLE:
                    held += data
                    continue
                if opening is not None:
                    raise NotStarted(False, failed=opening)
                data, held = held + data, b""
                if first_byte is not None:
                    first_byte.reschedule(None)
                await send(start)
                start = None
            await send({"type": "http.response.body", "body": data, "more_body": True})
            rec.chunk_sent(len(data))
            if saw_done and not tail:
                # The answer is whole: do not wait for upstream to close the stream (Serve holds it open a while),
                # or a client that leaves at `[DONE]`, as the SDKs do, would count as one that left midway.
                return
    except UPSTREAM_FAILURES as e:
        failure = e
    if start is not None:
        raise NotStarted(isinstance(failure, asyncio.TimeoutError))
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
