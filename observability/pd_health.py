"""PD health from two scrapes around known traffic: did KV come from prefill, and how fast did it move?

Users of PD stacks report PD silently running decode-only (llm-d#1461) and KV transfer over EFA silently
falling back to TCP speed (nixl#909); this names either when it sees it.
"""
import math

from deployments.catalog import INSTANCE_TYPES
from observability.snapshot import snapshot_increase

# Throughput is only judged on transfers big enough to be bandwidth-bound rather than latency-bound.
MIN_MEAN_TRANSFER_BYTES = 4 * 1024 * 1024
SLOW_FRACTION = 0.10  # below this share of the instance's link, call it slow
TCP_LIKE_GBPS = 25.0  # what one host's TCP path usually gives; EFA instances should do far better


def pd_health(before: dict, after: dict, *, instance_type: str) -> dict:
    """A verdict (healthy, decode_only, unconfirmed, transfer_failures, slow_link, no_traffic) with the numbers
    and messages a user can act on."""
    inc = snapshot_increase(before, after)
    external = inc.counter.get(("prompt_tokens:external_kv_transfer", "decode"), 0.0)
    recomputed = inc.counter.get(("prompt_tokens:local_compute", "decode"), 0.0)
    prefill_tokens = inc.counter.get(("prompt_tokens:local_compute", "prefill"), 0.0)
    failed = sum(inc.counter.get((n, "decode"), 0.0) + inc.counter.get((n, "prefill"), 0.0)
                 for n in ("nixl_failed_transfers", "nixl_failed_notifications"))
    kv_bytes = inc.hist.get(("kv_bytes", "decode"))
    kv_time = inc.hist.get(("kv_transfer", "decode"))
    transfers = kv_bytes.count if kv_bytes else 0
    moved = kv_bytes.sum if kv_bytes else 0.0  # Ray exports bucket midpoints: an estimate, bounded by `span`
    span = kv_bytes.bounds_range() if kv_bytes else (0.0, 0.0)
    seconds = (kv_time.sum / 1000.0) if kv_time else 0.0
    gbps = (moved * 8 / seconds / 1e9) if seconds > 0 and moved > 0 else None
    instance = INSTANCE_TYPES.get(instance_type)
    link = instance.network_gbps if instance else 0.0
    result = {
        "verdict": "healthy", "ok": True, "messages": [],
        "external_kv_tokens": external, "decode_recomputed_tokens": recomputed, "prefill_tokens": prefill_tokens,
        "nixl_transfers": transfers, "nixl_bytes": moved, "nixl_seconds": round(seconds, 6),
        "nixl_bytes_range": [span[0], span[1] if math.isfinite(span[1]) else None],
        "mean_transfer_bytes": (moved / transfers) if transfers else None,
        "throughput_gbps": round(gbps, 4) if gbps is not None else None,
        "link_gbps": link, "efa": bool(instance and instance.has_efa), "failed_transfers": failed,
    }
    msgs = result["messages"]

    def verdict(name: str, message: str) -> None:
        if result["ok"]:
            result["verdict"] = name
        result["ok"] = False
        msgs.append(message)

    if not external and not recomputed and not transfers:
        result["verdict"], result["ok"] = "no_traffic", False
        msgs.append("No prompt tokens reached the decode pool between the two scrapes; send requests and probe again.")
        return result
    if failed:
        verdict("transfer_failures", f"NIXL reported {failed:g} failed transfers or notifications: decode had to "
                                     "recompute or drop those requests. Check the NIXL logs on both pools.")
    if not external:
        verdict("decode_only", f"Decode computed {recomputed:g} prompt tokens itself and received none "
                               f"through KV transfer ({moved:g} NIXL bytes): the deployment is "
                               "effectively decode-only and prefill adds only cost. Check the kv_transfer_config "
                               "(NixlConnector, kv_producer on prefill and kv_consumer on decode) and that the "
                               "stages can reach each other.")
    elif not moved:
        verdict("unconfirmed", f"Decode took {external:g} prompt tokens from KV transfer, but NIXL reported no "
                               "bytes moved: check that the engines export NIXL metrics (log_engine_metrics).")
    elif recomputed > external:
        verdict("decode_only", f"Decode recomputed {recomputed:g} prompt tokens but received only {external:g} "
                               "from prefill: most requests bypass KV transfer.")
    if gbps is not None and link and instance and instance.has_efa:
        mean = moved / transfers
        if mean < MIN_MEAN_TRANSFER_BYTES:
            msgs.append(f"Transfers average {mean / 1024:.0f} KiB, too small to judge the link "
                        f"(measured {gbps:.3f} Gbit/s).")
        elif gbps < link * SLOW_FRACTION or gbps < TCP_LIKE_GBPS:
            verdict("slow_link", f"KV moved at {gbps:.1f} Gbit/s on {instance_type}, whose EFA link gives "
                                 f"{link:g} Gbit/s: TCP speed. Likely the NIXL backend is not LIBFABRIC "
                                 "(kv_connector_extra_config.backends) or the pods lack vpc.amazonaws.com/efa "
                                 "resources and hugepages.")
    if result["ok"]:
        thr = f" at about {gbps:.3f} Gbit/s" if gbps is not None else ""
        msgs.insert(0, f"KV came from prefill: {external:g} prompt tokens over {transfers} NIXL transfers "
                       f"({bytes_span_text(*span)}){thr}. Ray exports NIXL's sizes and times as histogram buckets, "
                       "so bytes are known to the bucket and the rate is an estimate.")
    return result


def bytes_span_text(lo: float, hi: float | None) -> str:
    """A byte range from histogram buckets; no top (None or +Inf) when an observation fell in +Inf."""
    if hi is None or not math.isfinite(hi):
        return f"over {lo:,.0f} bytes"
    return f"{lo:,.0f}–{hi:,.0f} bytes"


# What the decode pool's KV reads did between two scrapes (kv_reads).
KV_FAILING, KV_MOVING, KV_QUIET, KV_MIXED = "failing", "moving", "quiet", "mixed"


def kv_reads(before: dict, after: dict) -> dict:
    """Whether the decode pool got its KV from prefill between two scrapes, from NIXL's own counters.

    `failing`: NIXL counted failed reads on the decode (vLLM counts failed handshakes and notifications among them)
    and none succeeded, as when a decode keeps a restarted prefill's NIXL peer; `moving`: reads succeeded and none
    failed; `mixed`: both; `quiet`: neither (no traffic, or no prefill to read from)."""
    inc = snapshot_increase(before, after)
    failed = inc.counter.get(("nixl_failed_transfers", "decode"), 0.0)
    kv_bytes = inc.hist.get(("kv_bytes", "decode"))
    transfers = kv_bytes.count if kv_bytes else 0
    state = (KV_MIXED if failed and transfers else KV_FAILING if failed else KV_MOVING if transfers
             else KV_QUIET)
    return {"state": state, "failed": failed, "transfers": transfers}
