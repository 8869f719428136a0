"""What latency the requested pools are expected to give at the expected load, and whether that meets the spec's
targets: the planner's arithmetic, written out as lines a person can check. Pure.

- Prefill of one request and a decode step come from observability.performance_model: the GPU's profile, fitted on
  measurements (or scaled from one, and then said so). Each figure has a range: where the measured time would lie
  if the model erred as its fit did at the measured points.
- A fleet correction (observability.fleet_calibration) multiplies a stage's figure, and its range, by what a
  running deployment of the same model on the same GPU measured against the profile.
- Each prefill replica is a single server (M/M/1) with the load split evenly over replicas_max: utilisation
  ρ = λ × prefill time; ρ ≥ 1 never keeps up; the p95 wait is ln(ρ / 0.05) / (μ − λ) (zero when ρ ≤ 0.05).
- KV transfer = KV bytes per request × 8 / the link's Gbit/s (nothing when both pools share a machine).
- Decode: sequences in flight per replica = λ × output tokens × step time / replicas (solved by iteration, at
  least one), each holding the prompt and half the output on average. ITL p95 ≈ that step time (a steady batch
  does the same work each step).
- TTFT p95 ≈ prefill + p95 wait + KV transfer + one decode step.
"""
import math

from deployments.catalog import GPUS, INSTANCE_TYPES
from deployments.spec import DeploymentSpec
from observability.fleet_calibration import Correction, correction_for
from observability.model_facts import ModelFacts
from observability.performance_model import (REFERENCE_GPU, DecodeEstimate, PrefillEstimate, decode_estimate,
                                             expected_range, prefill_estimate)


def _ms(s: float) -> str:
    return f"{s * 1000:,.2f} ms"


def _figure(seconds: float, error: tuple[float, float], correction: Correction | None) -> dict:
    ratio = correction.ratio if correction else 1.0
    low, high = expected_range(seconds * ratio, error)
    return {"expected_ms": round(seconds * ratio * 1000, 1), "range_ms": [round(low * 1000, 1), round(high * 1000, 1)]}


def mm1_p95_wait_s(rate: float, service_s: float) -> float:
    """The p95 wait of one M/M/1 server with `rate` arrivals per second, each served in `service_s` (ρ = rate ×
    service_s below 1): ln(ρ / 0.05) / (μ − λ), zero when ρ ≤ 0.05."""
    rho = rate * service_s
    return math.log(rho / 0.05) / (1 / service_s - rate) if rho > 0.05 else 0.0


def _profile_line(stage: str, est) -> str:
    p = est.profile
    lo, hi = p.prefill_error if stage == "prefill" else p.decode_error
    scope = "" if p.measured else f" (on the {REFERENCE_GPU}: scaling adds an error nobody measured)"
    return (f"Latency, {stage} profile: {p.gpu}, {p.kind}: {p.source}. The fit erred {lo:+.1%} to {hi:+.1%} at its "
            f"measured points{scope}, which gives each figure's range.")


def _prefill_line(e: PrefillEstimate, facts: ModelFacts, tokens: int, tp: int) -> str:
    c, peak = e.profile.coefficients, e.profile.figures.tflops
    ar = (f" + all-reduces {_ms(e.allreduce_s)} (2 per layer over {e.profile.figures.interconnect_gbs:g} GB/s, "
          "data sheet, not calibrated)") if tp > 1 else ""
    return (f"Latency, prefill of {tokens:,} tokens on {e.profile.gpu} TP {tp}: max(host floor {facts.num_layers} "
            f"layers × {c.launch_s_per_layer * 1000:.3f} ms = {_ms(e.host_s)}; GPU {facts.num_layers} layers × "
            f"{c.prefill_s_per_layer * 1000:.3f} ms = {_ms(e.layers_s)} + matmuls {e.matmul_flops:.4g} FLOPs / "
            f"({tp} × {peak:g} TFLOPS × {c.prefill_matmul_share:.3f}) = {_ms(e.matmul_s)} + attention "
            f"{e.attention_flops:.4g} FLOPs / ({tp} × {peak:g} TFLOPS × {c.prefill_attention_share:.3f}) = "
            f"{_ms(e.attention_s)}{ar}) = {_ms(e.seconds)} per request.")


def _decode_line(e: DecodeEstimate, facts: ModelFacts, seqs: float, ctx: float, tp: int) -> str:
    c, fig = e.profile.coefficients, e.profile.figures
    ar = (f" + all-reduces {_ms(e.allreduce_s)} (over {fig.interconnect_gbs:g} GB/s, data sheet, not calibrated)"
          if tp > 1 else "")
    return (f"Latency, decode step on {e.profile.gpu} TP {tp} at {seqs:,.1f} sequences per replica of "
            f"{ctx:,.0f} tokens: {facts.num_layers} layers × {c.decode_s_per_layer * 1000:.3f} ms = "
            f"{_ms(e.layers_s)} + {e.bytes_read / 1e9:,.2f} GB read per GPU (weights + KV) / ({fig.hbm_gbs:g} GB/s × "
            f"{c.decode_bytes_share:.3f}) = {_ms(e.bytes_s)} + batch matmuls {e.batch_flops:.4g} FLOPs / "
            f"({fig.tflops:g} TFLOPS × {c.decode_batch_share:.3f}) = {_ms(e.batch_s)}{ar} = {_ms(e.seconds)}.")


def latency_plan(spec: DeploymentSpec, *, facts: ModelFacts, kv_bytes_per_request: int, link_gbps: float,
                 lines: list[str], fleet=()) -> dict | None:
    """Expected prefill, TTFT and ITL at the expected load with their ranges (None where a pool has no GPUs),
    appending the arithmetic to `lines`; `fleet`: FleetWindows of this model (observability.selectors)."""
    pi, di = INSTANCE_TYPES[spec.prefill.instance_type], INSTANCE_TYPES[spec.decode.instance_type]
    if pi.gpu not in GPUS or di.gpu not in GPUS:
        return None
    load, p, d = spec.expected_load, spec.prefill, spec.decode
    pre = prefill_estimate(facts, pi.gpu, load.mean_prompt_tokens, p.tensor_parallel_size)
    lines.append(_profile_line("prefill", pre))
    lines.append(_prefill_line(pre, facts, load.mean_prompt_tokens, p.tensor_parallel_size))
    corrections = {"prefill": correction_for("prefill", facts, pi.gpu, fleet),
                   "decode": correction_for("decode", facts, di.gpu, fleet)}
    if corrections["prefill"]:
        lines.append(f"Latency, fleet: {corrections['prefill'].line()}; this plan's prefill is scaled by it.")
    prefill = _figure(pre.seconds, pre.profile.prefill_error, corrections["prefill"])
    prefill_s = prefill["expected_ms"] / 1000
    lam = load.requests_per_second / p.replicas_max
    rho = lam * prefill_s
    out = {"prefill_ms": prefill, "prefill_utilization": round(rho, 3), "ttft_ms": None, "itl_ms": None,
           "profiles": {"prefill": pre.profile.to_json()},
           "fleet": [c.to_json() for c in corrections.values() if c]}
    lines.append(f"Latency, prefill load: {load.requests_per_second:g} req/s over {p.replicas_max} replicas × "
                 f"{prefill['expected_ms']:,.1f} ms → ρ = {rho:.2f} per replica.")
    if rho >= 1:
        out["text"] = (f"Prefill cannot keep up: each replica gets {lam:g} req/s but serves at most "
                       f"{1 / prefill_s:,.2f}; the queue grows without bound. Add prefill replicas or GPUs.")
        lines.append(f"Latency: {out['text']}")
        return out
    mu = 1 / prefill_s
    wait_s = mm1_p95_wait_s(lam, prefill_s)
    kv_s = kv_bytes_per_request * 8 / (link_gbps * 1e9) if link_gbps else 0.0
    lines.append(f"Latency, queue: M/M/1 per replica, p95 wait = ln({rho:.2f} / 0.05) / ({mu:,.2f} − {lam:g}) = "
                 f"{wait_s * 1000:,.1f} ms; KV transfer {kv_bytes_per_request:,} B × 8 / {link_gbps:g} Gbit/s = "
                 f"{kv_s * 1000:,.2f} ms.")
    ctx = load.mean_prompt_tokens + load.mean_output_tokens / 2
    ratio = corrections["decode"].ratio if corrections["decode"] else 1.0
    step, in_flight = None, 0.0
    for _ in range(20):  # sequences in flight depend on the step time, which depends on them
        step = decode_estimate(facts, di.gpu, max(in_flight, 1.0), ctx, d.tensor_parallel_size)
        in_flight = load.requests_per_second * load.mean_output_tokens * step.seconds * ratio / d.replicas_max
    in_flight = max(in_flight, 1.0)  # a step decodes at least the request being measured
    step = decode_estimate(facts, di.gpu, in_flight, ctx, d.tensor_parallel_size)
    lines.append(_profile_line("decode", step) if step.profile != pre.profile else
                 "Latency, decode profile: the same as prefill's.")
    lines.append(_decode_line(step, facts, in_flight, ctx, d.tensor_parallel_size))
    if corrections["decode"]:
        lines.append(f"Latency, fleet: {corrections['decode'].line()}; this plan's decode step is scaled by it.")
    itl = _figure(step.seconds, step.profile.decode_error, corrections["decode"])
    fixed_ms = (wait_s + kv_s) * 1000
    ttft = {"expected_ms": round(prefill["expected_ms"] + fixed_ms + itl["expected_ms"], 1),
            "range_ms": [round(a + fixed_ms + b, 1) for a, b in zip(prefill["range_ms"], itl["range_ms"],
                                                                     strict=True)]}
    out |= {"ttft_ms": ttft, "itl_ms": itl, "profiles": out["profiles"] | {"decode": step.profile.to_json()}}
    lines.append(f"Latency: TTFT p95 ≈ {prefill['expected_ms']:,.1f} + {wait_s * 1000:,.1f} + {kv_s * 1000:,.2f} + "
                 f"{itl['expected_ms']:,.1f} = {ttft['expected_ms']:,.1f} ms (range {ttft['range_ms'][0]:,.1f}–"
                 f"{ttft['range_ms'][1]:,.1f}); ITL p95 ≈ one step = {itl['expected_ms']:,.1f} ms (range "
                 f"{itl['range_ms'][0]:,.1f}–{itl['range_ms'][1]:,.1f}).")
    return out


def _judged(target: float | None, figure: dict) -> dict | None:
    if target is None:
        return None
    return {"target_ms": target, "expected_ms": figure["expected_ms"], "range_ms": figure["range_ms"],
            "meets": figure["expected_ms"] <= target}


def targets_plan(spec: DeploymentSpec, latency: dict | None, *, lines: list[str]) -> dict | None:
    """The verdict on the spec's targets from `latency_plan`'s figures (None without targets)."""
    targets = spec.targets
    if targets is None:
        return None
    if latency is None:
        text = ("No published figures for these processors (the CPU local target): the plan cannot judge the "
                "targets; attainment will, once it serves.")
        lines.append(f"Targets: {text}")
        return {"verdict": "unknown", "text": text}
    if latency["ttft_ms"] is None:
        return {"verdict": "misses", "text": latency["text"], "prefill_utilization": latency["prefill_utilization"]}
    out = {"ttft": _judged(targets.ttft_p95_ms, latency["ttft_ms"]), "itl": _judged(targets.itl_p95_ms,
                                                                                     latency["itl_ms"]),
           "share": targets.share, "prefill_utilization": latency["prefill_utilization"]}
    judged = [v for v in (out["ttft"], out["itl"]) if v]
    misses = [name.upper() for name in ("ttft", "itl") if out[name] and not out[name]["meets"]]
    out["verdict"] = "misses" if misses else "meets"
    out["text"] = (f"Expected to miss the {' and '.join(misses)} target at the expected load." if misses else
                   f"Expected to meet {'both targets' if len(judged) > 1 else 'the target'} at the expected load.")
    lines.append(f"Targets: {out['text']}")
    return out

