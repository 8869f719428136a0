"""Gateway benchmark: direct-to-mock vs a bare aiohttp proxy vs the gateway, side by side, in one bounded run.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/tandem_gw_bench REDIS_URL=redis://127.0.0.1:6379/5 \\
        .venv/bin/python -m bench.gateway_bench [--seconds 5] [--json out.json]

Upstream scenarios: c=1 uses a 2 ms TTFT and 2 ms pacing (16 chunks); c=64 uses 20 ms TTFT and 20 ms pacing
(a realistic 50 tokens/s decode, so the machine is not saturated); non-streaming uses the zero-delay mode; the
ladder opens N one-second streams at once. The gateway runs on core 0 (taskset), the mock upstream, the bare proxy's upstream and this load generator on
core 1; the bare proxy also gets core 0, and is only driven while the gateway is idle. The database named by
DATABASE_URL is migrated and gets a bench team, key and deployments (use a database of its own).
"""
import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACED = "ttft=0.002,chunks=16,gap=0.002"  # c=1 TTFT and gaps: every chunk its own write
STEADY = "ttft=0.02,chunks=16,gap=0.02"  # c=64: 50 tokens/s per stream, like a real decode
WIDE = "chunks=20,gap=0.05"  # ~1 s streams, for the concurrency ladder
FAST = ""  # zero-delay mode
ROUNDS = 3


def pct(values, q):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q / 100 * len(values)))]


def spawn(args, core, log, env=None):
    return subprocess.Popen(["taskset", "-c", str(core), sys.executable, *args], cwd=ROOT,
                            env={**os.environ, **(env or {})}, stdout=log, stderr=subprocess.STDOUT)


async def wait_ready(session, url, proc, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited")
        try:
            async with session.get(url) as r:
                if r.status < 500:
                    return
        except Exception:  # noqa: BLE001 - not up yet
            pass
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


class Target:
    """One way to reach the mock: its URL for a scenario, headers and body."""

    def __init__(self, name, url_for, headers, model_for):
        self.name, self.url_for, self.headers, self.model_for = name, url_for, headers, model_for

    def body(self, scenario, stream=True):
        return json.dumps({"model": self.model_for(scenario), "stream": stream, "max_tokens": 64,
                           "messages": [{"role": "user", "content": "benchmark prompt of a few words"}]}).encode()


async def one_stream(session, target, scenario, expect_events):
    """(ttft, gaps, complete) for one streamed request, measured from just before the request is sent."""
    body = target.body(scenario)
    t0 = time.perf_counter()
    gaps, ttft, last, events, tail = [], None, 0.0, 0, b""
    async with session.post(target.url_for(scenario), data=body, headers=target.headers) as r:
        if r.status != 200:
            await r.read()
            return None, [], False
        while True:
            data = await r.content.readany()
            if not data:
                break
            now = time.perf_counter()
            if ttft is None:
                ttft = now - t0
            else:
                gaps.append(now - last)
            last = now
            events += data.count(b"\n\n")
            tail = data[-16:]
    return ttft, gaps, events == expect_events and tail.endswith(b"[DONE]\n\n")


async def one_request(session, target):
    async with session.post(target.url_for(FAST), data=target.body(FAST, stream=False), headers=target.headers) as r:
        await r.read()
        return r.status == 200


async def closed_loop(seconds, concurrency, work):
    results, stop = [], time.perf_counter() + seconds

    async def worker():
        while time.perf_counter() < stop:
            results.append(await work())

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results, time.perf_counter() - started


async def run(args, world):
    import aiohttp

    logs = Path(args.logs)
    logs.mkdir(parents=True, exist_ok=True)
    procs = [
        spawn(["-m", "bench.mock_upstream", "--port", str(args.mock_port)], 1, open(logs / "mock.log", "wb")),
        spawn(["-m", "bench.bare_proxy", "--port", str(args.bare_port), "--upstream",
               f"http://127.0.0.1:{args.mock_port}"], 0, open(logs / "bare.log", "wb")),
        spawn(["-m", "gateway", "--port", str(args.gateway_port)], 0, open(logs / "gateway.log", "wb"),
              env={"TANDEM_GATEWAY_ACCESS_LOG": "1" if args.access_log else "0"}),
    ]
    mock, bare, gw = (f"http://127.0.0.1:{p}" for p in (args.mock_port, args.bare_port, args.gateway_port))
    opts = {"paced": PACED, "steady": STEADY, "wide": WIDE, "fast": FAST}
    prefix = {s: (f"/o/{o}" if o else "") for s, o in opts.items()}
    scen = {o: s for s, o in opts.items()}
    targets = [
        Target("direct", lambda o: f"{mock}{prefix[scen[o]]}/v1/chat/completions", {}, lambda o: "m"),
        Target("bare", lambda o: f"{bare}{prefix[scen[o]]}/v1/chat/completions", {}, lambda o: "m"),
        Target("gateway", lambda o: f"{gw}/v1/chat/completions",
               {"Authorization": f"Bearer {world['raw_key']}", "Content-Type": "application/json"},
               lambda o: world["models"][scen[o]]),
    ]
    out = {"load_average_at_start": os.getloadavg()}
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                         timeout=aiohttp.ClientTimeout(total=120)) as session:
            for url, proc in ((mock + "/_mock/requests", procs[0]), (bare + "/", procs[1]),
                              (gw + "/readyz", procs[2])):
                await wait_ready(session, url, proc)
            expect = 16 + 3
            for t in targets:  # warm connections and caches
                for _ in range(20):
                    await one_stream(session, t, PACED, expect)
                await asyncio.gather(*(one_stream(session, t, STEADY, expect) for _ in range(64)))

            # 1. c=1, interleaved so a neighbour's noise hits all three alike
            c1 = {t.name: {"ttft": [], "gaps": []} for t in targets}
            stop = time.perf_counter() + args.seconds * 2
            while time.perf_counter() < stop:
                for t in targets:
                    ttft, gaps, _ = await one_stream(session, t, PACED, expect)
                    c1[t.name]["ttft"].append(ttft)
                    c1[t.name]["gaps"] += gaps
            # 2. c=64 streams, closed loop
            # (in ROUNDS slices per target, alternating, so a neighbour's burst does not land on one target only)
            c64 = {t.name: {"results": [], "took": 0.0} for t in targets}
            for _ in range(ROUNDS):
                for t in targets:
                    results, took = await closed_loop(args.seconds / ROUNDS, 64,
                                                      lambda t=t: one_stream(session, t, STEADY, expect))
                    c64[t.name]["results"] += results
                    c64[t.name]["took"] += took
            for name, acc in c64.items():
                results = acc["results"]
                c64[name] = {"ttft": [r[0] for r in results if r[0] is not None],
                             "gaps": [g for r in results for g in r[1]],
                             "streams_per_s": sum(1 for r in results if r[2]) / acc["took"],
                             "incomplete": sum(1 for r in results if not r[2])}
            # 3. non-streaming requests/s, c=64, zero-delay upstream
            rps = {t.name: {"ok": 0, "errors": 0, "took": 0.0} for t in targets}
            for _ in range(ROUNDS):
                for t in targets:
                    results, took = await closed_loop(args.seconds / ROUNDS, 64, lambda t=t: one_request(session, t))
                    rps[t.name]["ok"] += sum(results)
                    rps[t.name]["errors"] += results.count(False)
                    rps[t.name]["took"] += took
            for acc in rps.values():
                acc["rps"] = acc["ok"] / acc["took"]
            # 4. concurrent streams with every frame delivered
            ladder = {}
            for n in args.ladder:
                row = {}
                for t in (targets[0], targets[2]):
                    results = await asyncio.gather(*(one_stream(session, t, WIDE, 20 + 3) for _ in range(n)),
                                                   return_exceptions=True)
                    row[t.name] = sum(1 for r in results if not isinstance(r, BaseException) and r[2])
                ladder[n] = row
                if row["gateway"] < n:
                    break
        out["key_check"] = await key_check_cost(world)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(20)
    out.update(report(c1, c64, rps, ladder, out))
    return out


async def key_check_cost(world):
    """The API-key check (parse, cache hit, HMAC, constant-time compare, expiry) with a warm cache."""
    from gateway.config import config_from_settings
    from gateway.keys import KeyRing
    from gateway.store import Store

    config = config_from_settings()
    store = Store(config.database_conninfo)
    await store.open()
    ring = KeyRing(store, hmac_secret=config.hmac_secret, ttl=60, negative_ttl=5)
    header = f"Bearer {world['raw_key']}".encode()
    await ring.authenticate(header)
    samples = []
    for _ in range(20000):
        t = time.perf_counter_ns()
        await ring.authenticate(header)
        samples.append(time.perf_counter_ns() - t)
    await store.close()
    return {"p50_us": pct(samples, 50) / 1000, "p99_us": pct(samples, 99) / 1000}


def report(c1, c64, rps, ladder, out):
    ms = 1000
    lines, res = [], {}

    def added(data, name, kind, q):
        return (pct(data[name][kind], q) - pct(data["direct"][kind], q)) * ms

    for label, data in (("c=1", c1), ("c=64", c64)):
        for name in ("bare", "gateway"):
            for kind in ("ttft", "gaps"):
                for q in (50, 99):
                    res[f"{label} added {kind} p{q} ms {name}"] = added(data, name, kind, q)
    for name in ("direct", "bare", "gateway"):
        res[f"c=64 streams/s {name}"] = c64[name]["streams_per_s"]
        res[f"non-stream req/s {name}"] = rps[name]["rps"]
    res["streams/s ratio gateway/direct"] = c64["gateway"]["streams_per_s"] / c64["direct"]["streams_per_s"]
    res["streams/s ratio bare/direct"] = c64["bare"]["streams_per_s"] / c64["direct"]["streams_per_s"]
    res["non-stream ratio gateway/bare"] = rps["gateway"]["rps"] / rps["bare"]["rps"]
    res["max concurrent streams, zero loss (gateway)"] = max((n for n, r in ladder.items() if r["gateway"] == n),
                                                            default=0)
    res["ladder"] = ladder
    res["incomplete streams at c=64"] = {k: v["incomplete"] for k, v in c64.items()}
    res["non-stream errors"] = {k: v["errors"] for k, v in rps.items()}
    targets = [("c=1 added ttft p50 ms gateway", "<= 2"), ("c=64 added ttft p50 ms gateway", "<= 2"),
               ("c=1 added gaps p50 ms gateway", "<= 0.5"), ("c=64 added gaps p50 ms gateway", "<= 0.5"),
               ("streams/s ratio gateway/direct", ">= 0.98"), ("non-stream ratio gateway/bare", ">= 0.7"),
               ("max concurrent streams, zero loss (gateway)", ">= 1000")]
    lines.append(f"load average at start: {out['load_average_at_start']}")
    lines.append(f"{'measure':46} {'bare':>10} {'gateway':>10}   target")
    for label in ("c=1", "c=64"):
        for kind in ("ttft", "gaps"):
            for q in (50, 99):
                key = f"{label} added {kind} p{q} ms"
                target = dict(targets).get(f"{key} gateway", "")
                lines.append(f"{key:46} {res[key + ' bare']:10.3f} {res[key + ' gateway']:10.3f}   {target}")
    label = "c=64 streams/s (direct %.0f)" % res["c=64 streams/s direct"]
    lines.append(f"{label:46} "
                 f"{res['c=64 streams/s bare']:10.0f} {res['c=64 streams/s gateway']:10.0f}")
    lines.append(f"{'c=64 streams/s ratio vs direct':46} {res['streams/s ratio bare/direct']:10.3f} "
                 f"{res['streams/s ratio gateway/direct']:10.3f}   >= 0.98")
    label = "non-stream req/s c=64 (direct %.0f)" % res["non-stream req/s direct"]
    lines.append(f"{label:46} "
                 f"{res['non-stream req/s bare']:10.0f} {res['non-stream req/s gateway']:10.0f}")
    lines.append(f"{'non-stream ratio gateway/bare':46} {'':10} {res['non-stream ratio gateway/bare']:10.3f}   >= 0.7")
    lines.append(f"{'max concurrent streams, zero loss':46} {'':10} "
                 f"{res['max concurrent streams, zero loss (gateway)']:10d}   >= 1000   ladder {ladder}")
    lines.append(f"{'key check p50 / p99 us (warm cache)':46} {'':10} "
                 f"{out['key_check']['p50_us']:6.1f}/{out['key_check']['p99_us']:.1f}   p50 <= 500")
    res["table"] = "\n".join(lines)
    return res


def main():
    parser = argparse.ArgumentParser(prog="python -m bench.gateway_bench")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each closed-loop phase")
    parser.add_argument("--ladder", type=int, nargs="+", default=[1000, 1500, 2000])
    parser.add_argument("--mock-port", type=int, default=9410)
    parser.add_argument("--bare-port", type=int, default=9411)
    parser.add_argument("--gateway-port", type=int, default=9412)
    parser.add_argument("--no-access-log", dest="access_log", action="store_false")
    parser.add_argument("--logs", default=f"/tmp/tandem-bench-{uuid.uuid4().hex[:6]}")
    parser.add_argument("--json")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings.test")
    import django

    django.setup()
    import uvloop

    from bench.bench_setup import bench_world

    os.sched_setaffinity(0, {1})
    world = bench_world({"paced": PACED, "steady": STEADY, "wide": WIDE, "fast": FAST}, args.mock_port)
    out = uvloop.run(run(args, world))
    print(out["table"])
    if args.json:
        Path(args.json).write_text(json.dumps({k: v for k, v in out.items() if k != "table"}, indent=1,
                                              default=str))


if __name__ == "__main__":
    main()
