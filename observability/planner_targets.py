"""Can the requested pools meet the spec's latency targets at the expected load? The planner's own arithmetic,
from the GPUs' published figures, written out as lines a person can check. Pure.

- Prefill of one request = 2 × params × prompt tokens FLOPs / (TP × the GPU's dense BF16 peak × PREFILL_MFU).
- Each prefill replica is a single server (M/M/1) with the load split evenly over replicas_max: utilisation
  ρ = λ × prefill time; ρ ≥ 1 never keeps up; the p95 wait is ln(ρ / 0.05) / (μ − λ) (zero when ρ ≤ 0.05).
- KV transfer = KV bytes per request × 8 / the link's Gbit/s (nothing when both pools share a machine).
- A decode step reads the weights on each GPU and the KV of every running sequence: (weights + KV in flight per
  replica / TP) / (HBM bandwidth × DECODE_BW_EFFICIENCY); sequences in flight = λ × output tokens × step time
  (solved by iteration). ITL p95 ≈ that step time (each step does the same work at a steady batch).
- TTFT p95 ≈ prefill + p95 wait + KV transfer + one decode step.
"""
import math

from deployments.catalog import INSTANCE_TYPES
from deployments.spec import DeploymentSpec

# Dense BF16 tensor TFLOPS and HBM GB/s from the vendors' data sheets.
GPU_FIGURES = {
    "A10G": (125, 600), "L4": (121, 300), "L40S": (362, 864), "A100-40GB": (312, 1555),
    "A100-80GB": (312, 2039), "H100": (989, 3350), "H200": (989, 4800),
}
PREFILL_MFU = 0.4  # share of peak FLOPs a long prefill reaches in vLLM
DECODE_BW_EFFICIENCY = 0.7  # share of HBM bandwidth a decode step reaches


def _judged(target: float | None, expected: float) -> dict | None:
    if target is None:
        return None
    return {"target_ms": target, "expected_ms": round(expected, 1), "meets": expected <= target}


def targets_plan(spec: DeploymentSpec, *, param_count: int, dtype_bytes: int, kv_bytes_per_token: int,
                 kv_bytes_per_request: int, link_gbps: float, lines: list[str]) -> dict | None:
    """The verdict on the spec's targets (None without targets), appending its arithmetic to `lines`."""
    targets = spec.targets
    if targets is None:
        return None
    pi, di = INSTANCE_TYPES[spec.prefill.instance_type], INSTANCE_TYPES[spec.decode.instance_type]
    if pi.gpu not in GPU_FIGURES or di.gpu not in GPU_FIGURES:
        text = ("No published figures for these processors (the CPU local target): the plan cannot judge the "
                "targets; attainment will, once it serves.")
        lines.append(f"Targets: {text}")
        return {"verdict": "unknown", "text": text}
    load, p, d = spec.expected_load, spec.prefill, spec.decode
    flops = 2 * param_count * load.mean_prompt_tokens
    peak = GPU_FIGURES[pi.gpu][0] * 1e12 * p.tensor_parallel_size * PREFILL_MFU
    prefill_s = flops / peak
    lam = load.requests_per_second / p.replicas_max
    rho = lam * prefill_s
    lines.append(f"Targets, prefill: 2 × {param_count:,} params × {load.mean_prompt_tokens:,} tokens = {flops:.3g} "
                 f"FLOPs / ({p.tensor_parallel_size} × {GPU_FIGURES[pi.gpu][0]} TFLOPS {pi.gpu} × {PREFILL_MFU}) = "
                 f"{prefill_s * 1000:,.1f} ms per request; {load.requests_per_second:g} req/s over "
                 f"{p.replicas_max} replicas → ρ = {rho:.2f} per replica.")
    if rho >= 1:
        text = (f"Prefill cannot keep up: each replica gets {lam:g} req/s but serves at most {1 / prefill_s:,.2f}; "
                "the queue grows without bound. Add prefill replicas or GPUs.")
        lines.append(f"Targets: {text}")
        return {"verdict": "misses", "text": text, "prefill_utilization": round(rho, 3)}
    mu = 1 / prefill_s
    wait_s = math.log(rho / 0.05) / (mu - lam) if rho > 0.05 else 0.0
    kv_s = kv_bytes_per_request * 8 / (link_gbps * 1e9) if link_gbps else 0.0
    weights_gpu = param_count * dtype_bytes / d.tensor_parallel_size
    bw = GPU_FIGURES[di.gpu][1] * 1e9 * DECODE_BW_EFFICIENCY
    step_s, in_flight = weights_gpu / bw, 0.0
    for _ in range(20):  # sequences in flight depend on the step time, which depends on them
        in_flight = load.requests_per_second * load.mean_output_tokens * step_s / d.replicas_max
        kv_read = in_flight * (load.mean_prompt_tokens + load.mean_output_tokens / 2) * kv_bytes_per_token
        step_s = (weights_gpu + kv_read / d.tensor_parallel_size) / bw
    ttft_ms = (prefill_s + wait_s + kv_s + step_s) * 1000
    itl_ms = step_s * 1000
    lines.append(f"Targets, queue: M/M/1 per replica, p95 wait = ln({rho:.2f} / 0.05) / ({mu:,.2f} − {lam:g}) = "
                 f"{wait_s * 1000:,.1f} ms; KV transfer {kv_bytes_per_request:,} B × 8 / {link_gbps:g} Gbit/s = "
                 f"{kv_s * 1000:,.2f} ms.")
    lines.append(f"Targets, decode step: ({weights_gpu / 1e9:,.2f} GB weights per GPU + KV of {in_flight:,.1f} "
                 f"sequences per replica / TP {d.tensor_parallel_size}) / ({GPU_FIGURES[di.gpu][1]} GB/s {di.gpu} × "
                 f"{DECODE_BW_EFFICIENCY}) = {itl_ms:,.2f} ms → TTFT p95 ≈ {ttft_ms:,.1f} ms, ITL p95 ≈ "
                 f"{itl_ms:,.2f} ms.")
    out = {"ttft": _judged(targets.ttft_p95_ms, ttft_ms), "itl": _judged(targets.itl_p95_ms, itl_ms),
           "share": targets.share, "prefill_utilization": round(rho, 3)}
    judged = [v for v in (out["ttft"], out["itl"]) if v]
    misses = [name.upper() for name in ("ttft", "itl") if out[name] and not out[name]["meets"]]
    out["verdict"] = "misses" if misses else "meets"
    out["text"] = (f"Expected to miss the {' and '.join(misses)} target at the expected load." if misses else
                   f"Expected to meet {'both targets' if len(judged) > 1 else 'the target'} at the expected load.")
    return out
