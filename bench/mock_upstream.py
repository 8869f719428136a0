"""A mock OpenAI upstream (vLLM-like framing) for tests and benchmarks: configurable TTFT, chunks and pacing.

    python -m bench.mock_upstream --port 9100 [--ttft 0.02 --chunks 16 --gap 0.005] [--record]

Defaults are the zero-delay mode (no sleeps at all). A deployment's endpoint URL may carry per-scenario options
as a path prefix, so tests need no extra headers:  http://127.0.0.1:9100/o/ttft=0.5,chunks=4,drop=2
    ttft, gap   seconds before the first chunk / between chunks      chunks  content chunks to send
    fail        answer this HTTP status before any byte              drop    close the connection after N chunks
    pad         bytes of filler per content chunk (slow-reader tests)
    stall       after N content chunks, send nothing more (the connection stays open)
    die_first   the first N requests for the request's `model` close the connection before any event (a stream
                after its headers, any other before answering): a replica that died; later ones are served
    hang_first  the first N requests for the request's `model` send no event (a stream its headers only) and wait
                until the client gives up: a decode waiting for KV that never comes; later ones are served
    died_first  the first N requests for the request's `model` get the 500 Ray Serve LLM answered on the local PD
                stack to requests whose decode replica was killed (its body recorded: REPLICA_DIED_BODY)
    ingress_died_first  the first N requests for the request's `model` get the bare 500 Serve's HTTP proxy answered
                when the ingress replica died under the request (recorded: INGRESS_DIED_BODY)
    kv_lost_first  the first N requests for the request's `model` get the stream Ray Serve LLM sent on the local PD
                stack to a request whose prefill was killed under it (recorded: KV_LOST_STREAM): vLLM's empty
                first chunk, then its error event
    retry_after with `fail`, a Retry-After header of this many seconds
    linger      seconds a stream stays open after its `[DONE]` before it ends (Ray Serve's proxy holds it a while)

--keepalive-timeout closes a connection idle that long between requests (as Ray Serve's proxy does after 5 s).

With --record, every request is remembered by its X-Request-ID (usage sent, upstream auth, cancellation, `calls`:
how many times it was asked, and `paths`: at which path each time) and served at GET /_mock/requests for tests to compare against what the gateway recorded.
"""
import argparse
import asyncio
import sys
import time
from pathlib import Path

import orjson
from aiohttp import web

DONE = b"data: [DONE]\n\n"
# Answers the real local PD stack gave when a replica died (bench/recorded/README.md says where each came from).
RECORDED = Path(__file__).with_name("recorded")
REPLICA_DIED_BODY = (RECORDED / "serve-500-decode-killed.json").read_bytes()
KV_LOST_STREAM = (RECORDED / "serve-stream-prefill-killed.txt").read_bytes()
INGRESS_DIED_BODY = (RECORDED / "serve-proxy-500-ingress-stopped.txt").read_bytes()


def parse_options(text: str, defaults: dict) -> dict:
    options = dict(defaults)
    for item in filter(None, (text or "").split(",")):
        name, _, value = item.partition("=")
        options[name] = float(value) if name in ("ttft", "gap") else int(value)
    return options


def prompt_tokens(body: dict) -> int:
    """A deterministic stand-in for tokenizing: whitespace-separated words of every message or prompt."""
    if "messages" in body:
        text = " ".join(m.get("content") or "" for m in body["messages"] if isinstance(m.get("content"), str))
    else:
        prompt = body.get("prompt", body.get("input", ""))
        text = prompt if isinstance(prompt, str) else " ".join(map(str, prompt))
    return max(1, len(text.split()))


class Mock:
    def __init__(self, defaults: dict, record: bool):
        self.defaults = defaults
        self.record = record
        self.requests: dict[str, dict] = {}
        self.served = 0
        self.by_model: dict[str, int] = {}  # requests seen per `model`, for the *_first options

    def _log(self, request, body, **fields):
        if self.record:
            rid = request.headers.get("X-Request-ID", f"none-{self.served}")
            try:
                orjson.dumps(body)
            except orjson.JSONEncodeError:  # nested deeper than orjson writes: keep that it came, not what
                body = {"unrecordable": True}
            entry = self.requests.setdefault(rid, {"auth": request.headers.get("Authorization"), "body": body,
                                                   "peer_port": request.transport.get_extra_info("peername")[1]})
            entry.update(fields, calls=entry.get("calls", 0) + 1, paths=[*entry.get("paths", ()), request.path])
            return entry
        return {}

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.served += 1
        options = parse_options(request.match_info.get("opts", ""), self.defaults)
        kind = request.match_info["kind"]
        try:  # what vLLM would refuse with a 400 (a list of numbers as messages, a stop that is not text...)
            body = orjson.loads(await request.read())
            prompt_tokens(body)
            if kind != "embeddings":
                self._tokens(body, options)
        except (orjson.JSONDecodeError, TypeError, AttributeError, KeyError, ValueError):
            return web.Response(status=400, content_type="application/json", body=orjson.dumps({"error": {
                "message": "mock upstream: unreadable request", "type": "BadRequestError", "param": None,
                "code": 400}}))
        entry = self._log(request, body, started=time.time(), cancelled=False, finished=False)
        nth = self.by_model[body.get("model")] = self.by_model.get(body.get("model"), 0) + 1
        if nth <= options["die_first"] or nth <= options["hang_first"]:
            try:
                return await self.fail_first(request, body, hang=nth <= options["hang_first"])
            except (asyncio.CancelledError, ConnectionResetError):
                entry.update(cancelled=True, cancelled_at=time.time())
                raise
        if nth <= options["died_first"]:
            return web.Response(status=500, content_type="application/json", body=REPLICA_DIED_BODY)
        if nth <= options["ingress_died_first"]:
            return web.Response(status=500, body=INGRESS_DIED_BODY)
        if nth <= options["kv_lost_first"]:
            return web.Response(content_type="text/event-stream", body=KV_LOST_STREAM)
        if options["fail"]:
            return web.Response(status=options["fail"], content_type="application/json",
                                headers={"Retry-After": str(options["retry_after"])} if options["retry_after"] else None,
                                body=orjson.dumps({"error": {"message": "mock failure", "type": "server_error",
                                                             "param": None, "code": None}}))
        try:
            if kind == "embeddings":
                return self.embeddings(body, entry)
            if body.get("stream"):
                return await self.stream(request, kind, body, options, entry)
            if options["drop"]:  # a non-streamed answer that never comes: the connection just closes
                request.transport.close()
                return web.Response()
            return await self.once(kind, body, options, entry)
        except (asyncio.CancelledError, ConnectionResetError):
            entry["cancelled"] = True
            entry["cancelled_at"] = time.time()
            raise

    async def fail_first(self, request, body: dict, *, hang: bool) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        if body.get("stream"):
            await resp.prepare(request)
        if hang:
            await asyncio.sleep(3600)  # until the client gives up and closes the connection
        request.transport.close()
        return resp

    def _tokens(self, body: dict, options: dict) -> tuple[list[str], str]:
        """The content pieces to send and the finish reason, honouring max_tokens and stop strings."""
        limit = body.get("max_completion_tokens") or body.get("max_tokens") or options["chunks"]
        count, reason = (limit, "length") if limit < options["chunks"] else (options["chunks"], "stop")
        stops = body.get("stop") or []
        stops = [stops] if isinstance(stops, str) else stops
        pieces = []
        for i in range(count):
            piece = f"tok{i} " + ("x" * options["pad"] if options["pad"] else "")
            if any(s in piece for s in stops):
                return pieces, "stop"
            pieces.append(piece)
        return pieces, reason

    def _usage(self, body, completion):
        prompt = prompt_tokens(body)
        return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}

    async def once(self, kind, body, options, entry):
        if options["ttft"]:
            await asyncio.sleep(options["ttft"])
        pieces, reason = self._tokens(body, options)
        usage = self._usage(body, len(pieces))
        text = "".join(pieces)
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": reason}
                  if kind == "chat/completions" else {"index": 0, "text": text, "finish_reason": reason})
        entry.update(usage=usage, finished=True)
        return web.Response(content_type="application/json", body=orjson.dumps({
            "id": "cmpl-mock", "object": "chat.completion" if kind == "chat/completions" else "text_completion",
            "created": int(time.time()), "model": body.get("model"), "choices": [choice], "usage": usage}))

    def embeddings(self, body, entry):
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        usage = {"prompt_tokens": prompt_tokens(body), "total_tokens": prompt_tokens(body)}
        entry.update(usage=usage, finished=True)
        return web.Response(content_type="application/json", body=orjson.dumps({
            "object": "list", "model": body.get("model"), "usage": usage,
            "data": [{"object": "embedding", "index": i, "embedding": [0.1, 0.2, 0.3]} for i in range(len(inputs))]}))

    async def stream(self, request, kind, body, options, entry):
        chat = kind == "chat/completions"
        head = {"id": "chatcmpl-mock" if chat else "cmpl-mock", "object": "chat.completion.chunk" if chat
                else "text_completion", "created": int(time.time()), "model": body.get("model")}

        def event(choices, **extra) -> bytes:
            return b"data: " + orjson.dumps({**head, "choices": choices, **extra}) + b"\n\n"

        def content(text, reason=None) -> bytes:
            choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
            choice["finish_reason"] = reason
            return event([choice])

        pieces, reason = self._tokens(body, options)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await resp.prepare(request)
        if options["ttft"]:
            await asyncio.sleep(options["ttft"])
        first = event([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]) \
            if chat else b""
        sent = 0
        for i, piece in enumerate(pieces):
            if i and options["gap"]:
                await asyncio.sleep(options["gap"])
            if options["stall"] and sent == options["stall"]:
                entry.update(stalled=True)
                await asyncio.sleep(3600)  # until the client gives up and closes the connection
            if options["drop"] and sent == options["drop"]:
                entry.update(dropped=True)
                request.transport.close()  # mid-stream, without the closing chunk: a broken upstream
                return resp
            await resp.write(first + content(piece) if i == 0 else content(piece))
            sent += 1
            if entry:
                entry["sent"] = sent  # progress, for tests that watch backpressure
        entry["sent"] = sent
        tail = content("", reason)
        usage = self._usage(body, sent)
        if (body.get("stream_options") or {}).get("include_usage"):
            tail += event([], usage=usage)
        await resp.write(tail + DONE)
        entry.update(usage=usage, finished=True)
        if options["linger"]:  # as Ray Serve does: the stream stays open a while after its last event
            await asyncio.sleep(options["linger"])
        await resp.write_eof()
        return resp

    async def requests_view(self, request):
        return web.Response(body=orjson.dumps(self.requests), content_type="application/json")

    async def reset_view(self, request):
        self.requests.clear()
        return web.Response(text="ok")


def build_app(defaults: dict, record: bool) -> web.Application:
    mock = Mock(defaults, record)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    for prefix in ("", "/o/{opts}"):
        app.router.add_post(prefix + "/v1/{kind:chat/completions|completions|embeddings}", mock.handle)
    app.router.add_get("/_mock/requests", mock.requests_view)
    app.router.add_post("/_mock/reset", mock.reset_view)
    app["mock"] = mock
    return app


async def serve(host: str, port: int, defaults: dict, record: bool, keepalive_timeout: float = 75.0) -> None:
    runner = web.AppRunner(build_app(defaults, record), handler_cancellation=True, access_log=None,
                           keepalive_timeout=keepalive_timeout)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=4096)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]
    print(f"mock upstream listening on {host}:{bound}", flush=True)
    await asyncio.Event().wait()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.mock_upstream")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9100, help="0 picks a free port (printed)")
    parser.add_argument("--ttft", type=float, default=0.0)
    parser.add_argument("--chunks", type=int, default=16)
    parser.add_argument("--gap", type=float, default=0.0)
    parser.add_argument("--record", action="store_true")
    parser.add_argument("--keepalive-timeout", type=float, default=75.0, help="seconds an idle connection is kept")
    args = parser.parse_args(argv)
    defaults = {"ttft": args.ttft, "chunks": args.chunks, "gap": args.gap, "fail": 0, "drop": 0, "pad": 0, "stall": 0,
                "retry_after": 0, "die_first": 0, "hang_first": 0, "died_first": 0, "ingress_died_first": 0,
                "kv_lost_first": 0, "linger": 0}
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    try:
        asyncio.run(serve(args.host, args.port, defaults, args.record, args.keepalive_timeout))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
