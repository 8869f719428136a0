"""The keep-alive race: a pooled connection reused just as upstream closes it for idleness.

    .venv/bin/python -m bench.keepalive_race [--requests 200]

Against the mock upstream with a 0.5 s keep-alive (Ray Serve's proxy: 5 s), one client sends requests 0.48-0.52 s
apart through an aiohttp pool like the gateway's, once keeping idle connections 30 s (the gateway before) and
once 0.4 s (the gateway now keeps them 4 s, the same proportion under Ray Serve's 5 s). Prints how many requests
failed for each: every failure is what a user of the gateway would have got as a 502.
"""
import argparse
import asyncio
import re
import subprocess
import sys
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]


async def run(port: int, keepalive: float, requests: int) -> int:
    failed = 0
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=keepalive)
    async with aiohttp.ClientSession(connector=connector) as session:
        for i in range(requests):
            await asyncio.sleep(0.48 + (i % 21) * 0.002)
            try:
                async with session.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body) as r:
                    await r.read()
                    failed += r.status != 200
            except aiohttp.ClientError:
                failed += 1
    return failed


def main():
    parser = argparse.ArgumentParser(prog="python -m bench.keepalive_race")
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    mock = subprocess.Popen([sys.executable, "-m", "bench.mock_upstream", "--port", "0", "--keepalive-timeout", "0.5"],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        port = int(re.search(r":(\d+)$", mock.stdout.readline().strip())[1])
        for keepalive in (30.0, 0.4):
            failed = asyncio.run(run(port, keepalive, args.requests))
            print(f"client keep-alive {keepalive:4.1f} s, upstream's 0.5 s: {failed} of {args.requests} requests failed")
    finally:
        mock.kill()


if __name__ == "__main__":
    main()
