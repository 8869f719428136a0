"""Gateway benchmark: Tandem's gateway against a bare aiohttp pass-through, side by side, as users meet it.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/tandem_gw_bench REDIS_URL=redis://127.0.0.1:6379/5 \\
        .venv/bin/python -m bench.gateway_bench [--rounds 5] [--seconds 3] [--json out.json]

Targets: `direct` (the mock upstream itself, the floor), `bare` (bench/bare_proxy.py: no auth, no accounting),
`gateway` (a warm key without limits) and `limited` (the gateway with a key that has request and token limits:
one pipelined Redis round trip more per request); `cold` is the gateway with keys it has never seen, so every
request is a cache miss that reaches PostgreSQL.

Every round runs each phase for every target, the targets' order rotating from round to round, so a neighbour's
burst does not land on one target only:
  stream c=1       2 ms TTFT, 16 chunks 2 ms apart: added TTFT and gaps
  req/s c=1, c=32  non-streaming, zero-delay upstream
  stream c=64      20 ms TTFT, 16 chunks 20 ms apart (50 tokens/s, like a real decode): added TTFT p50/p99
  streams 500/1000 that many concurrent ~1 s streams (20 chunks 50 ms apart), closed loop: streams/s
  cold c=32        non-streaming, each request with a key the gateway has not seen yet
Within a round, the short phases are cut into `--slices` slices that alternate between the targets. Each measure
is reported as the median over rounds with [min-max]; ratios are taken within a round. The c=64 TTFT p99 targets
are also taken over every round's samples pooled (a p99 of one round rests on a handful of requests).
"Added" = a percentile through the proxy minus the same percentile direct.

Steady load is what the c=32 and c=64 phases measure. Each slice opens with an untimed warm-up at the same
concurrency, so a target's upstream connections, closed while the other targets ran (the gateway keeps idle ones
for 4 s, below Ray Serve's 5 s, and the bare proxy is given the gateway's setting), are open again when the clock
starts; and the clients start at random moments in its first half, as independent users do. Started together,
the c=64 clients would stay in step (every stream lasts the same), and each wave of 64 requests arriving in the
same millisecond would measure the proxy's queue for one core, not the latency it adds.

The gateway and the bare proxy run on core 0 (taskset), the mock upstream and this load generator on core 1.
The database named by DATABASE_URL is migrated and gets a bench team, keys and deployments (use one of its own).
"""
import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = {
    "paced": "ttft=0.002,chunks=16,gap=0.002",  # c=1 TTFT and gaps: every chunk its own write
    "steady": "ttft=0.02,chunks=16,gap=0.02",  # c=64: 50 tokens/s per stream, like a real decode
    "wide": "chunks=20,gap=0.05",  # ~1 s streams, for 500 and 1,000 at once
    "fast": "",  # zero-delay mode
}
EVENTS = {"paced": 16 + 3, "steady": 16 + 3, "wide": 20 + 3}  # role chunk + content + finish chunk + [DONE]
PROXIES = ("bare", "gateway", "limited")


def pct(values, q):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q / 100 * len(values)))]


def cpu_seconds(pid: int | None) -> float:
    """User plus system CPU time the process has used so far (0 for none)."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
    """One way to reach the mock: the URL and model for a scenario, and the headers."""

    def __init__(self, name, url_for, model_for, key=None):
        self.name, self.url_for, self.model_for = name, url_for, model_for
        self.headers = {"Content-Type": "application/json"}
        if key:
            self.headers["Authorization"] = f"Bearer {key}"

    def body(self, scenario, stream=True):
        return json.dumps({"model": self.model_for(scenario), "stream": stream, "max_tokens": 64,
                           "messages": [{"role": "user", "content": "benchmark prompt of a few words"}]}).encode()


async def one_stream(session, target, scenario):
    """(ttft, gaps, complete) for one streamed request, measured from just before the request is sent."""
    body = target.body(scenario)
    t0 = time.perf_counter()
    gaps, ttft, last, events, tail = [], None, 0.0, 0, b""
    try:
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
    except Exception:  # noqa: BLE001 - a refused or broken stream counts as incomplete
        return None, [], False
    return ttft, gaps, events == EVENTS[scenario] and tail.endswith(b"[DONE]\n\n")


async def one_request(session, target, headers=None):
    try:
        async with session.post(target.url_for("fast"), data=target.body("fast", stream=False),
                                headers=headers or target.headers) as r:
            await r.read()
            return r.status == 200
    except Exception:  # noqa: BLE001
        return False


async def closed_loop(seconds, concurrency, work, warmup=0.0):
    """`concurrency` clients, each calling `work` again as soon as it returns, for `seconds` after an untimed
    `warmup`. Each client first waits a random part of the warm-up's first half, so that the clients fall out of step
    as independent users are; only calls that start after the warm-up count. Returns those calls' results, the
    time from the warm-up's end, and the number of calls in all (the proxy's CPU time covers them all)."""
    results, begin, calls = [], time.perf_counter() + warmup, 0
    stop = begin + seconds

    async def worker():
        nonlocal calls
        if warmup:
            await asyncio.sleep(random.uniform(0, warmup / 2))
        while (now := time.perf_counter()) < stop:
            result = await work()
            calls += 1
            if now >= begin:
                results.append(result)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results, time.perf_counter() - begin, calls


async def stream_phase(session, target, scenario, concurrency, seconds, warmup=0.0):
    results, took, calls = await closed_loop(seconds, concurrency, lambda: one_stream(session, target, scenario),
                                             warmup)
    return {"calls": calls, "ttft": [r[0] for r in results if r[0] is not None],
            "gaps": [g for r in results for g in r[1]], "complete": sum(1 for r in results if r[2]),
            "incomplete": sum(1 for r in results if not r[2]), "took": took}


async def request_phase(session, target, concurrency, seconds, warmup=0.0):
    results, took, calls = await closed_loop(seconds, concurrency, lambda: one_request(session, target), warmup)
    return {"calls": calls, "complete": sum(results), "errors": results.count(False), "took": took}


def merge(parts: list[dict]) -> dict:
    """One target's slices of a phase as one measurement: lists joined, counts and time added."""
    out = {}
    for part in parts:
        for name, value in part.items():
            out[name] = out.get(name, [] if isinstance(value, list) else 0) + value
    out["per_s"] = out["complete"] / out["took"]
    out["cpu_us"] = out.get("cpu", 0) / max(1, out["calls"]) * 1e6  # warm-up calls included, as in the CPU time
    return out


async def cold_phase(session, target, keys, concurrency):
    """Non-streaming requests, each with a key the gateway has not seen: every one is a cache miss."""
    queue = iter(keys)
    results = []

    async def worker():
        for key in queue:
            results.append(await one_request(session, target, {**target.headers, "Authorization": f"Bearer {key}"}))

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    took = time.perf_counter() - started
    return {"per_s": sum(results) / took, "errors": results.count(False), "complete": sum(results), "took": took}


async def run(args, world):
    import aiohttp

    from gateway.config import config_from_settings

    logs = Path(args.logs)
    logs.mkdir(parents=True, exist_ok=True)
    procs = [
        spawn(["-m", "bench.mock_upstream", "--port", str(args.mock_port)], 1, open(logs / "mock.log", "wb")),
        spawn(["-m", "bench.bare_proxy", "--port", str(args.bare_port), "--upstream",
               f"http://127.0.0.1:{args.mock_port}", "--keepalive", str(config_from_settings().upstream_keepalive_s)],
              0, open(logs / "bare.log", "wb")),
        spawn(["-m", "gateway", "--port", str(args.gateway_port)], 0, open(logs / "gateway.log", "wb"),
              env={"TANDEM_GATEWAY_ACCESS_LOG": "1" if args.access_log else "0",
                   "TANDEM_GATEWAY_METRICS_PORT": str(args.gateway_port + 1)}),
    ]
    mock, bare, gw = (f"http://127.0.0.1:{p}" for p in (args.mock_port, args.bare_port, args.gateway_port))
    prefix = {s: (f"/o/{o}" if o else "") for s, o in SCENARIOS.items()}
    targets = {
        "direct": Target("direct", lambda s: f"{mock}{prefix[s]}/v1/chat/completions", lambda s: "m"),
        "bare": Target("bare", lambda s: f"{bare}{prefix[s]}/v1/chat/completions", lambda s: "m"),
        "gateway": Target("gateway", lambda s: f"{gw}/v1/chat/completions", lambda s: world["models"][s],
                          world["raw_key"]),
        "limited": Target("limited", lambda s: f"{gw}/v1/chat/completions", lambda s: world["models"][s],
                          world["limited_key"]),
    }
    everyone, proxies = list(targets), ["direct", "bare", "gateway"]
    # (name, targets, slices per round, how): short slices alternate between targets, so each sees the same
    # neighbours; the many-stream rungs need whole seconds per slice (each stream lasts about one). The concurrent
    # phases start each slice with an untimed warm-up (see the module's docstring).
    short, warm = args.seconds / args.slices, args.warmup
    phases = [
        ("stream c=1", everyone, args.slices, lambda t: stream_phase(session, t, "paced", 1, short)),
        ("req/s c=1", everyone, args.slices, lambda t: request_phase(session, t, 1, short)),
        ("req/s c=32", everyone, args.slices, lambda t: request_phase(session, t, 32, short, warm)),
        ("stream c=64", everyone, max(1, args.slices // 3),
         lambda t: stream_phase(session, t, "steady", 64, args.seconds / max(1, args.slices // 3), warm)),
        *((f"streams {n}", proxies, 1, lambda t, n=n: stream_phase(session, t, "wide", n, args.seconds))
          for n in args.streams),
    ]
    # The proxy process each target goes through, whose CPU time each slice measures (per request: a cost that
    # the load generator's own limits do not hide).
    pids = {"direct": None, "bare": procs[1].pid, "gateway": procs[2].pid, "limited": procs[2].pid}

    async def measured(name, how):
        before = cpu_seconds(pids[name])
        part = await how(targets[name])
        part["cpu"] = cpu_seconds(pids[name]) - before
        return part

    rounds = []
    out = {"load_average_at_start": os.getloadavg(), "command": " ".join(sys.argv)}
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                         timeout=aiohttp.ClientTimeout(total=120)) as session:
            for url, proc in ((mock + "/_mock/requests", procs[0]), (bare + "/", procs[1]),
                              (gw + "/readyz", procs[2])):
                await wait_ready(session, url, proc)
            for t in targets.values():  # warm connections and caches
                for _ in range(20):
                    await one_stream(session, t, "paced")
                await asyncio.gather(*(one_stream(session, t, "wide") for _ in range(max(args.streams))))
            per_round = len(world["cold_keys"]) // args.rounds
            for r in range(args.rounds):
                result = {}
                for name, names, slices, how in phases:
                    parts = {n: [] for n in names}
                    for i in range(slices):
                        shift = (r + i) % len(names)
                        for n in names[shift:] + names[:shift]:
                            parts[n].append(await measured(n, how))
                    result[name] = {n: merge(p) for n, p in parts.items()}
                keys = world["cold_keys"][r * per_round:(r + 1) * per_round]
                if keys:
                    result["cold c=32"] = {"gateway": await cold_phase(session, targets["gateway"], keys, 32)}
                rounds.append(result)
                print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
        out["key_check"] = await key_check_cost(world)
        out["load_average_at_end"] = os.getloadavg()
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(20)
    out.update(report(rounds, args, out))
    return out


async def key_check_cost(world):
    """The API-key check (parse, cache hit, HMAC, constant-time compare, expiry) with a warm cache."""
    from gateway.app import Gateway
    from gateway.config import config_from_settings

    keys = Gateway(config_from_settings()).keys
    await keys._store.open()
    header = f"Bearer {world['raw_key']}".encode()
    await keys.authenticate(header)
    samples = []
    for _ in range(20000):
        t = time.perf_counter_ns()
        await keys.authenticate(header)
        samples.append(time.perf_counter_ns() - t)
    await keys._store.close()
    return {"p50_us": pct(samples, 50) / 1000, "p99_us": pct(samples, 99) / 1000}


def spread(values):
    values = [v for v in values if v == v]  # drop NaN
    if not values:
        return "n/a"
    fmt = (lambda v: f"{v:.0f}") if max(abs(v) for v in values) >= 100 else (lambda v: f"{v:.2f}")
    return f"{fmt(statistics.median(values))} [{fmt(min(values))}-{fmt(max(values))}]"


def report(rounds, args, out):
    """Per-round values, then median [min-max] over rounds for each measure and target."""
    ms = 1000
    rows, res = [], {}

    def series(phase, target, fn):
        return [fn(r[phase]) for r in rounds if phase in r and target in r[phase]]

    def added(phase, target, kind, q):
        return series(phase, target, lambda p: (pct(p[target][kind], q) - pct(p["direct"][kind], q)) * ms)

    def row(label, values_by_target, target=""):
        res[label] = {t: v for t, v in values_by_target.items()}
        cells = "".join(f"{spread(values_by_target[t]) if t in values_by_target else '':>22}"
                        for t in ("direct", *PROXIES))
        rows.append(f"{label:34}{cells}   {target}")

    for label, phase in (("c=1", "stream c=1"), ("c=64", "stream c=64")):
        for kind, name in (("ttft", "TTFT"), ("gaps", "gap")):
            for q in (50, 99):
                row(f"added {name} p{q} ms, {label}", {t: added(phase, t, kind, q) for t in PROXIES})
    for phase in ("req/s c=1", "req/s c=32", "stream c=64", *(f"streams {n}" for n in args.streams)):
        unit = "" if phase.startswith("req") else " streams/s"
        row(f"{phase}{unit}", {t: series(phase, t, lambda p, t=t: p[t]["per_s"])
                               for t in ("direct", *PROXIES) if any(t in r.get(phase, {}) for r in rounds)})
    for phase in ("req/s c=1", "req/s c=32", "stream c=64", *(f"streams {n}" for n in args.streams)):
        row(f"proxy CPU us per answer, {phase.replace('req/s ', '')}",
            {t: series(phase, t, lambda p, t=t: p[t]["cpu_us"]) for t in PROXIES
             if any(t in r.get(phase, {}) for r in rounds)})
    for n in args.streams:
        row(f"incomplete streams, {n}", {t: series(f"streams {n}", t, lambda p, t=t: p[t]["incomplete"])
                                         for t in ("direct", "bare", "gateway")})
    if any("cold c=32" in r for r in rounds):
        row("cold keys req/s c=32", {"gateway": series("cold c=32", "gateway", lambda p: p["gateway"]["per_s"])})
    errors = {t: sum(p[t].get("errors", 0) for r in rounds for name, p in r.items() if t in p)
              for t in ("direct", *PROXIES)}

    def ratio(phase, num, den="bare"):
        return series(phase, num, lambda p: p[num]["per_s"] / p[den]["per_s"])

    def cpu_ratio(phase, num, den="bare"):
        return series(phase, num, lambda p: p[num]["cpu_us"] / p[den]["cpu_us"])

    checks = [
        ("req/s c=1, gateway / bare", ratio("req/s c=1", "gateway"), ">= 0.9"),
        ("req/s c=1, limited / bare", ratio("req/s c=1", "limited"), ">= 0.9"),
        ("req/s c=32, gateway / bare", ratio("req/s c=32", "gateway"), ">= 0.9"),
        ("req/s c=32, limited / bare", ratio("req/s c=32", "limited"), ">= 0.9"),
        *((f"streams/s {n}, gateway / bare", ratio(f"streams {n}", "gateway"), ">= 0.95" if n == 500 else "")
          for n in args.streams),
        ("CPU per request c=32, gateway / bare", cpu_ratio("req/s c=32", "gateway"), "(lower is leaner)"),
        ("CPU per request c=32, limited / bare", cpu_ratio("req/s c=32", "limited"), ""),
        *((f"CPU per stream {n}, gateway / bare", cpu_ratio(f"streams {n}", "gateway"), "") for n in args.streams),
    ]

    def p99_over_bare(phases, proxy):
        return (pct(phases[proxy]["ttft"], 99) - pct(phases["bare"]["ttft"], 99)) * ms

    for proxy in ("gateway", "limited"):  # per round, then over every round's samples at once
        pooled = {t: {"ttft": [v for r in rounds for v in r["stream c=64"][t]["ttft"]]} for t in (proxy, "bare")}
        checks += [(f"TTFT p99 c=64, {proxy} - bare ms", series("stream c=64", proxy, lambda p, x=proxy:
                                                                  p99_over_bare(p, x)), "<= 2"),
                   (f"TTFT p99 c=64 pooled, {proxy} - bare ms", [p99_over_bare(pooled, proxy)], "<= 2")]
    if any("cold c=32" in r for r in rounds):
        checks.append(("cold keys req/s / bare warm c=32", [
            r["cold c=32"]["gateway"]["per_s"] / r["req/s c=32"]["bare"]["per_s"] for r in rounds if "cold c=32" in r],
            ""))
    lines = [f"load average at start: {out['load_average_at_start']}, at end: {out['load_average_at_end']}; "
             f"{args.rounds} rounds of {args.seconds:g} s per phase and target; median [min-max] over rounds",
             f"{'measure':34}{'direct':>22}{'bare':>22}{'gateway':>22}{'limited':>22}   target", *rows,
             f"{'requests that failed':34}" + "".join(f"{errors[t]:>22}" for t in ("direct", *PROXIES)), "",
             f"{'ratio (within each round)':34}{'median [min-max]':>22}   target"]
    for label, values, target in checks:
        res[label] = values
        lines.append(f"{label:34}{spread(values):>22}   {target}")
    lines.append(f"{'key check p50 / p99 us (warm)':34}{out['key_check']['p50_us']:>12.1f} /"
                 f"{out['key_check']['p99_us']:>7.1f}")
    res["table"] = "\n".join(lines)
    return res


def main():
    parser = argparse.ArgumentParser(prog="python -m bench.gateway_bench")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each phase, per target and round")
    parser.add_argument("--slices", type=int, default=6, help="alternating slices each phase is cut into")
    parser.add_argument("--warmup", type=float, default=0.5, help="untimed seconds before each concurrent slice")
    parser.add_argument("--streams", type=int, nargs="+", default=[500, 1000], help="concurrent-stream rungs")
    parser.add_argument("--cold-keys", type=int, default=3000, help="never-seen keys, shared out over the rounds")
    parser.add_argument("--mock-port", type=int, default=9410)
    parser.add_argument("--bare-port", type=int, default=9411)
    parser.add_argument("--gateway-port", type=int, default=9412, help="its metrics go on the next port")
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
    world = bench_world(SCENARIOS, args.mock_port, cold_keys=args.cold_keys)
    out = uvloop.run(run(args, world))
    print(out["table"])
    if args.json:
        Path(args.json).write_text(json.dumps({k: v for k, v in out.items() if k != "table"}, indent=1,
                                              default=str))


if __name__ == "__main__":
    main()
