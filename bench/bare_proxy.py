"""A bare aiohttp pass-through proxy (no auth, no accounting): the benchmark's yardstick for the gateway.

    python -m bench.bare_proxy --port 9201 --upstream http://127.0.0.1:9100
"""
import argparse

import aiohttp
from aiohttp import web


def build_app(upstream: str, keepalive: float = 15.0) -> web.Application:
    async def startup(app):
        app["session"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=keepalive),
                                               auto_decompress=False)

    async def cleanup(app):
        await app["session"].close()

    async def proxy(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        async with request.app["session"].post(upstream + request.path, data=body,
                                               headers={"Content-Type": "application/json"}) as up:
            if up.content_type != "text/event-stream":
                return web.Response(status=up.status, body=await up.read(), content_type=up.content_type)
            resp = web.StreamResponse(status=up.status, headers={"Content-Type": up.headers["Content-Type"]})
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp

    app = web.Application(client_max_size=16 * 1024 * 1024)
    app.router.add_post("/{tail:.*}", proxy)
    app.on_startup.append(startup)
    app.on_cleanup.append(cleanup)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bare_proxy")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9201)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--keepalive", type=float, default=15.0, help="seconds an idle upstream connection is kept")
    args = parser.parse_args()
    import uvloop

    uvloop.install()
    web.run_app(build_app(args.upstream, args.keepalive), host=args.host, port=args.port, access_log=None, print=None,
                backlog=4096)


if __name__ == "__main__":
    main()
