"""Prometheus metrics of the gateway process, labelled by deployment; observed off the hot path by the recorder.

They name every tenant's deployments and traffic, so they are served on an internal port of their own
(`TANDEM_GATEWAY_METRICS_HOST`/`_PORT`, 127.0.0.1:9801 by default), never on the public one.
"""
import asyncio

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
GAP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)

REQUESTS = Counter("tandem_gateway_requests", "Requests answered, by deployment, endpoint and status",
                   ["deployment", "endpoint", "status"])
TOKENS = Counter("tandem_gateway_tokens", "Tokens reported by upstream", ["deployment", "kind"])
PARTIAL = Counter("tandem_gateway_partial_streams", "Streams that ended early", ["deployment", "reason"])
TTFT = Histogram("tandem_gateway_ttft_seconds", "Time to first streamed byte, as the client sees it",
                 ["deployment"], buckets=LATENCY_BUCKETS)
E2E = Histogram("tandem_gateway_e2e_seconds", "End-to-end request time", ["deployment"], buckets=LATENCY_BUCKETS)
GAP_MEAN = Histogram("tandem_gateway_inter_chunk_gap_mean_seconds", "Mean gap between streamed chunks, per request",
                     ["deployment"], buckets=GAP_BUCKETS)
GAP_MAX = Histogram("tandem_gateway_inter_chunk_gap_max_seconds", "Largest gap between streamed chunks, per request",
                    ["deployment"], buckets=GAP_BUCKETS)
BYTES = Counter("tandem_gateway_response_bytes", "Bytes sent to clients", ["deployment"])
RECORDS_DROPPED = Counter("tandem_gateway_records_dropped", "Request records dropped because Redis was away too long")
IN_FLIGHT = Gauge("tandem_gateway_in_flight_requests", "Requests being proxied now (read from the gateway)")
STORE_QUERIES = Counter("tandem_gateway_store_queries", "Lookups sent to PostgreSQL, by query", ["query"])
AUTH_FAILURES = Counter("tandem_gateway_auth_failures", "Requests refused for their key (401) or their address "
                        "(429, `refused`), by reason", ["reason"])
UNTRUSTED_FORWARDED = Counter("tandem_gateway_untrusted_forwarded", "Requests carrying a load balancer's header "
                              "(X-Forwarded-For, X-Amzn-Trace-Id) from a peer outside "
                              "TANDEM_GATEWAY_FORWARDED_ALLOW_IPS, served as that peer (gateway/forwarded.py)")
UPSTREAM_RETRIES = Counter("tandem_gateway_upstream_retries", "Retries of requests whose try failed before the "
                           "client got a byte, by deployment and reason (502/503/504, replica_died, connect, "
                           "disconnected, stream_not_started, first_byte_timeout)",
                           ["deployment", "reason"])
CACHE_ENTRIES = Gauge("tandem_gateway_cache_entries", "Entries held in memory, by cache", ["cache"])


_by_deployment: dict[str, tuple] = {}  # label children, looked up once per deployment (labels() takes a lock)
_requests: dict[tuple, object] = {}


def observe(rec) -> None:
    dep = str(rec.deployment_id) if rec.deployment_id else "none"
    children = _by_deployment.get(dep)
    if children is None:
        children = _by_deployment[dep] = (E2E.labels(dep), BYTES.labels(dep), TOKENS.labels(dep, "prompt"),
                                          TOKENS.labels(dep, "completion"), TTFT.labels(dep), GAP_MEAN.labels(dep),
                                          GAP_MAX.labels(dep))
    e2e, nbytes, prompt, completion, ttft, gap_mean, gap_max = children
    labels = (dep, rec.endpoint, rec.status_code)
    requests = _requests.get(labels)
    if requests is None:
        requests = _requests[labels] = REQUESTS.labels(dep, rec.endpoint, str(rec.status_code))
    requests.inc()
    e2e.observe(rec.e2e_ms / 1000)
    if rec.bytes_out:
        nbytes.inc(rec.bytes_out)
    if rec.prompt_tokens:
        prompt.inc(rec.prompt_tokens)
    if rec.completion_tokens:
        completion.inc(rec.completion_tokens)
    if rec.ttft_ms is not None:
        ttft.observe(rec.ttft_ms / 1000)
    if rec.mean_itl_ms is not None:
        gap_mean.observe(rec.mean_itl_ms / 1000)
        gap_max.observe(rec.max_itl_ms / 1000)
    if rec.partial:
        PARTIAL.labels(dep, rec.error_type or "unknown").inc()


def retried(deployment_id: int, reason: str) -> None:
    UPSTREAM_RETRIES.labels(str(deployment_id), reason).inc()


def watch_sizes(**sized) -> None:
    """Report each object's len() as `tandem_gateway_cache_entries{cache=name}`, read when scraped."""
    for name, obj in sized.items():
        CACHE_ENTRIES.labels(name).set_function(obj.__len__)


async def serve(host: str, port: int) -> web.AppRunner:
    """The internal metrics server (`GET /metrics`), on the gateway's event loop; rendering runs in a thread."""

    async def scrape(request: web.Request) -> web.Response:
        body = await asyncio.get_running_loop().run_in_executor(None, generate_latest)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", scrape)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
