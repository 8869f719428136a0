"""The SSE relay (`gateway.streaming.relay_events`) driven with real aiohttp streams: an upstream stream cut at
every byte boundary, or sent a byte at a time, comes out byte-identical, with its usage read, in both of SSE's
framings (vLLM's LF and the CRLF some servers send)."""
import asyncio

import orjson
import pytest
from aiohttp import ClientSession, web

from gateway.streaming import relay_events
from gateway.timing import Record


START = {"type": "http.response.start", "status": 200, "headers": []}


def _stream(sep: bytes) -> tuple[bytes, bytes]:
    """(the whole stream, the usage-only event in it) as vLLM frames a chat completion."""
    def event(obj) -> bytes:
        return b"data: " + orjson.dumps(obj) + sep

    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    usage = event({**head, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}})
    parts = [event({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
             *(event({**head, "choices": [{"index": 0, "delta": {"content": f"tok{i} ü"}}]}) for i in range(3)),
             event({**head, "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "stop"}]}),
             usage, b"data: [DONE]" + sep]
    return b"".join(parts), usage


async def _relay_all(cuts: list[list[int]], stream: bytes, keep_usage_chunk: bool) -> list[tuple[bytes, Record]]:
    """For each list of cut points, upstream writes the stream in those pieces (pausing between them so each
    arrives on its own); returns what the relay sent on and the record it filled."""
    async def upstream(request: web.Request) -> web.StreamResponse:
        points = cuts[int(request.match_info["case"])]
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for start, end in zip([0, *points], [*points, len(stream)]):
            await resp.write(stream[start:end])
            await asyncio.sleep(0.001)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/{case}", upstream)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    gate = asyncio.Semaphore(32)

    async def relay(session, case):
        sent, rec = [], Record("r", "chat.completions")

        async def send(message):
            sent.append(message)

        async with gate, session.get(f"http://127.0.0.1:{port}/{case}") as resp:
            await relay_events(resp, send, rec, start=START, keep_usage_chunk=keep_usage_chunk)
        assert sent[0] is START and all(m["type"] == "http.response.body" for m in sent[1:])  # the head goes first
        return b"".join(m["body"] for m in sent[1:]), rec

    try:
        async with ClientSession() as session:
            return await asyncio.gather(*(relay(session, case) for case in range(len(cuts))))
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("sep", [b"\n\n", b"\r\n\r\n"], ids=["lf", "crlf"])
@pytest.mark.parametrize("keep_usage_chunk", [True, False])
def test_a_stream_cut_at_every_byte_boundary_comes_out_byte_identical(sep, keep_usage_chunk):
    stream, usage = _stream(sep)
    expected = stream if keep_usage_chunk else stream.replace(usage, b"")
    cuts = [[i] for i in range(1, len(stream))]
    for out, rec in asyncio.run(_relay_all(cuts, stream, keep_usage_chunk)):
        assert out == expected
        assert (rec.prompt_tokens, rec.completion_tokens, rec.partial) == (3, 4, False)


@pytest.mark.parametrize("sep", [b"\n\n", b"\r\n\r\n"], ids=["lf", "crlf"])
def test_a_stream_sent_a_byte_at_a_time_comes_out_byte_identical(sep):
    stream, _ = _stream(sep)
    [(out, rec)] = asyncio.run(_relay_all([list(range(1, len(stream)))], stream, True))
    assert out == stream
    assert (rec.prompt_tokens, rec.completion_tokens, rec.partial, rec.error_type) == (3, 4, False, "")
