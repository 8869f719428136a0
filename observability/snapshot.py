"""One scrape reduced to one model's PD series (by pool: prefill, decode, ingress), and reset-aware increases.

Ray labels vLLM series with `ReplicaId` only; Serve series carry `replica` and `deployment`
(`Prefill:<model>`, `Decode:<model>`, the ingress), so the replica map from Serve series splits vLLM by stage.
"""
import json
import math
from dataclasses import dataclass, field

from observability.histograms import Hist
from observability.promtext import Sample

# Histogram base name → (stored stage name, factor to the stored unit: ms for times, bytes for sizes).
HISTOGRAMS = {
    "ray_vllm_request_queue_time_seconds": ("queue", 1000.0),
    "ray_vllm_request_prefill_time_seconds": ("prefill", 1000.0),
    "ray_vllm_time_to_first_token_seconds": ("ttft", 1000.0),
    "ray_vllm_nixl_xfer_time_seconds": ("kv_transfer", 1000.0),
    "ray_vllm_request_decode_time_seconds": ("decode", 1000.0),
    "ray_vllm_inter_token_latency_seconds": ("itl", 1000.0),
    "ray_vllm_e2e_request_latency_seconds": ("engine_e2e", 1000.0),
    "ray_serve_deployment_processing_latency_ms": ("serve", 1.0),
    "ray_vllm_nixl_bytes_transferred": ("kv_bytes", 1.0),
}
COUNTERS = {
    "ray_vllm_prompt_tokens_by_source_total": "prompt_tokens",  # split by its `source` label
    "ray_vllm_generation_tokens_total": "generation_tokens",
    "ray_vllm_request_success_total": "requests_finished",
    "ray_vllm_nixl_num_failed_transfers_total": "nixl_failed_transfers",
    "ray_vllm_nixl_num_failed_notifications_total": "nixl_failed_notifications",
    "ray_vllm_nixl_num_kv_expired_reqs_total": "nixl_kv_expired",
}
GAUGES = {  # name → how replicas of one pool combine
    "ray_vllm_kv_cache_usage_perc": ("kv_cache_usage", max),
    "ray_vllm_num_requests_running": ("running", sum),
    "ray_vllm_num_requests_waiting": ("waiting", sum),
}
POOL_PREFIXES = {"Prefill:": "prefill", "Decode:": "decode"}


def serve_name(model_id: str) -> str:
    """How Ray Serve LLM spells a model id inside a deployment name."""
    return model_id.replace("/", "--").replace(".", "_")


def _pool_of(deployment: str, model_names: set[str]) -> str | None:
    for prefix, pool in POOL_PREFIXES.items():
        if deployment.startswith(prefix) and deployment[len(prefix):] in model_names:
            return pool
    return None


def _key(base: str, pool: str, labels: dict) -> str:
    return f"{base}|{pool}|{json.dumps(sorted((k, v) for k, v in labels.items() if k != 'le'))}"


def _le(value: str) -> float:
    return math.inf if value in ("+Inf", "Inf") else float(value)


def snapshot_build(samples: list[Sample], model_id: str, application: str | None = None) -> dict:
    """The JSON-able state of one model's series: {"hist": ..., "counter": ..., "gauge": ...}.

    With `application`, only that Serve application's: on a shared Ray cluster two teams may serve the same model
    id, each in its own application, and neither may read the other's numbers."""
    names = {model_id, serve_name(model_id)}
    replicas: dict[str, str] = {}
    apps: set[str] = set()
    for s in samples:
        dep, rep = s.labels.get("deployment"), s.labels.get("replica")
        if application is not None and s.labels.get("application") != application:
            continue
        if s.name.startswith("ray_serve_") and dep and _pool_of(dep, names):
            if rep:
                replicas[rep] = dep
            if s.labels.get("application"):
                apps.add(s.labels["application"])

    def pool_for(s: Sample) -> str | None:
        if application is not None and s.labels.get("application", application) != application:
            return None
        dep = s.labels.get("deployment") or replicas.get(s.labels.get("ReplicaId", ""))
        if not dep:
            return None
        pool = _pool_of(dep, names)
        if pool is None and s.name.startswith("ray_serve_") and s.labels.get("application") in apps:
            pool = "ingress"  # the OpenAI ingress of the same application
        return pool

    snap = {"hist": {}, "counter": {}, "gauge": {}}
    for s in samples:
        base, suffix = s.name, ""
        for sfx in ("_bucket", "_sum", "_count"):
            if s.name.endswith(sfx) and s.name[: -len(sfx)] in HISTOGRAMS:
                base, suffix = s.name[: -len(sfx)], sfx
        if base not in HISTOGRAMS and base not in COUNTERS and base not in GAUGES:
            continue
        pool = pool_for(s)
        if pool is None:
            continue
        key = _key(base, pool, s.labels)
        if base in HISTOGRAMS:
            stage, _ = HISTOGRAMS[base]
            h = snap["hist"].setdefault(key, {"stage": stage, "base": base, "pool": pool, "le": {}, "sum": 0.0,
                                              "count": 0.0})
            if suffix == "_bucket":
                h["le"][s.labels.get("le", "+Inf")] = s.value
            elif suffix == "_sum":
                h["sum"] = s.value
            elif suffix == "_count":
                h["count"] = s.value
        elif base in COUNTERS:
            name = COUNTERS[base]
            if "source" in s.labels:
                name = f"{name}:{s.labels['source']}"
            snap["counter"][key] = {"name": name, "pool": pool, "v": s.value}
        else:
            snap["gauge"][key] = {"name": GAUGES[base][0], "pool": pool, "v": s.value}
    return snap


@dataclass
class Increase:
    """What happened between two snapshots, summed over replicas: histograms and counters by (name, pool);
    gauges are the later snapshot's values."""

    hist: dict[tuple[str, str], Hist] = field(default_factory=dict)
    counter: dict[tuple[str, str], float] = field(default_factory=dict)
    gauge: dict[tuple[str, str], float] = field(default_factory=dict)


def _hist_increase(before: dict | None, after: dict) -> Hist:
    """Per-series increase; a decrease anywhere means the series restarted, so `after` is all new."""
    reset = before is None or after["count"] < before["count"] or any(
        after["le"].get(le, 0) < v for le, v in before["le"].items())
    base = {"le": {}, "sum": 0.0, "count": 0.0} if reset else before
    factor = HISTOGRAMS[after["base"]][1]
    cumulative = sorted(((_le(le), v - base["le"].get(le, 0)) for le, v in after["le"].items()))
    h, prev = Hist(), 0.0
    for bound, cum in cumulative:
        # Empty buckets are kept: they are the lower bounds of the next ones.
        h.buckets[bound * factor if not math.isinf(bound) else math.inf] = int(round(cum - prev))
        prev = cum
    h.count = int(round(after["count"] - base["count"]))
    h.sum = (after["sum"] - base["sum"]) * factor
    return h


def snapshot_increase(before: dict, after: dict) -> Increase:
    """Reset-aware increase from `before` to `after` (a series new since `before` counts in full)."""
    inc = Increase()
    for key, a in after["hist"].items():
        h = _hist_increase(before["hist"].get(key), a)
        inc.hist.setdefault((a["stage"], a["pool"]), Hist()).add(h)
    for key, a in after["counter"].items():
        b = before["counter"].get(key)
        delta = a["v"] if b is None or a["v"] < b["v"] else a["v"] - b["v"]
        inc.counter[(a["name"], a["pool"])] = inc.counter.get((a["name"], a["pool"]), 0.0) + delta
    combine = {name: how for name, how in GAUGES.values()}
    grouped: dict[tuple[str, str], list[float]] = {}
    for g in after["gauge"].values():
        grouped.setdefault((g["name"], g["pool"]), []).append(g["v"])
    inc.gauge = {k: float(combine[k[0]](v)) for k, v in grouped.items()}
    return inc


EMPTY = {"hist": {}, "counter": {}, "gauge": {}}
