"""Prometheus metrics of the gateway process, labelled by deployment; observed off the hot path by the recorder."""
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
IN_FLIGHT = Gauge("tandem_gateway_in_flight_requests", "Requests being proxied now")


def observe(rec) -> None:
    dep = str(rec.deployment_id) if rec.deployment_id else "none"
    REQUESTS.labels(dep, rec.endpoint, str(rec.status_code)).inc()
    E2E.labels(dep).observe(rec.e2e_ms / 1000)
    if rec.bytes_out:
        BYTES.labels(dep).inc(rec.bytes_out)
    if rec.prompt_tokens:
        TOKENS.labels(dep, "prompt").inc(rec.prompt_tokens)
    if rec.completion_tokens:
        TOKENS.labels(dep, "completion").inc(rec.completion_tokens)
    if rec.ttft_ms is not None:
        TTFT.labels(dep).observe(rec.ttft_ms / 1000)
    if rec.mean_itl_ms is not None:
        GAP_MEAN.labels(dep).observe(rec.mean_itl_ms / 1000)
        GAP_MAX.labels(dep).observe(rec.max_itl_ms / 1000)
    if rec.partial:
        PARTIAL.labels(dep, rec.error_type or "unknown").inc()


def render() -> tuple[bytes, bytes]:
    return generate_latest(), CONTENT_TYPE_LATEST.encode()
