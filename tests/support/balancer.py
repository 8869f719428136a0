"""A load balancer in front of the gateway, as AWS's ALB is in the EKS overlay: it appends the address of whoever
connected to X-Forwarded-For (the ALB's default `append` processing mode: "client-supplied, ..., client-ip"), adds
X-Forwarded-Proto, X-Forwarded-Port and an X-Amzn-Trace-Id, and forwards the request from an address of its own
(`--source`, as the ALB's nodes connect from their addresses in the VPC), streaming the answer back as it comes.
(Header behaviour from AWS's "HTTP headers and your Application Load Balancer" page.)

    python -m tests.support.balancer --upstream http://127.0.0.1:8001 --source 127.0.1.1

prints `balancer listening on 127.0.0.1:<port>` once it accepts connections."""
import argparse
import asyncio
import re
import secrets
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

# Hop-by-hop headers (RFC 9110 7.6.1) and the framing the balancer redoes itself.
NOT_FORWARDED = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade",
                 "host", "content-length", "x-forwarded-for"}


def forwarded_headers(request: web.Request) -> CIMultiDict:
    """The request's headers as the ALB sends them on."""
    peer = request.transport.get_extra_info("peername")[0]
    headers = CIMultiDict((k, v) for k, v in request.headers.items() if k.lower() not in NOT_FORWARDED)
    headers["X-Forwarded-For"] = ", ".join([*request.headers.getall("X-Forwarded-For", []), peer])
    headers["X-Forwarded-Proto"], headers["X-Forwarded-Port"] = "https", "443"
    headers["X-Amzn-Trace-Id"] = f"Root=1-{int(time.time()):08x}-{secrets.token_hex(12)}"
    return headers


def build_app(upstream: str, source: str) -> web.Application:
    async def open_session(app):
        app["session"] = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(local_addr=(source, 0)), auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None), skip_auto_headers=("User-Agent", "Accept-Encoding"))
        yield
        await app["session"].close()

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        async with request.app["session"].request(request.method, upstream + request.raw_path, data=body,
                                                  headers=forwarded_headers(request),
                                                  allow_redirects=False) as resp:  # the client's to follow
            answer = web.StreamResponse(status=resp.status, headers=CIMultiDict(
                (k, v) for k, v in resp.headers.items() if k.lower() not in NOT_FORWARDED))
            await answer.prepare(request)
            async for chunk in resp.content.iter_any():
                await answer.write(chunk)
            await answer.write_eof()
            return answer

    app = web.Application()
    app.cleanup_ctx.append(open_session)
    app.router.add_route("*", "/{path:.*}", forward)
    return app


async def serve(upstream: str, source: str) -> None:
    runner = web.AppRunner(build_app(upstream, source), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(f"balancer listening on 127.0.0.1:{site._server.sockets[0].getsockname()[1]}", flush=True)
    await asyncio.Event().wait()


def start_balancer(tmp: Path, *, upstream: str, source: str):
    """This balancer as a process in front of `upstream`, connecting to it from `source`; a Proc with its URL."""
    from tests.support.processes import ROOT, Proc

    log = tmp / "balancer.log"
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.balancer", "--upstream", upstream,
                             "--source", source], cwd=ROOT, stdout=subprocess.PIPE, stderr=log.open("wb"), text=True)
    match = re.search(r":(\d+)$", proc.stdout.readline().strip())
    if not match:
        proc.kill()
        raise RuntimeError(f"balancer did not start: {log.read_text()[-2000:]}")
    return Proc(proc, f"http://127.0.0.1:{match[1]}", log)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m tests.support.balancer")
    parser.add_argument("--upstream", required=True, help="base URL of what is behind the balancer")
    parser.add_argument("--source", required=True, help="the address the balancer connects upstream from")
    args = parser.parse_args()
    asyncio.run(serve(args.upstream.rstrip("/"), args.source))
