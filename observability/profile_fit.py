"""Fit a GPU's performance profile (observability.performance_model's coefficients) to a measurement file in the
format bench/gpu_profile.py writes (the shared H200 table's). Pure: no numpy; least squares by hand.

Every fit minimises the relative error (predicted / measured − 1), so short and long shapes weigh the same.
- Decode is linear in its three unknowns (fixed time per layer, 1 / bytes share, 1 / batch share): one weighted
  least-squares solve.
- Prefill is max(host floor, GPU work), with GPU work linear in its three unknowns. Each point is assigned to the
  side that binds, each side fitted by least squares, and points reassigned until nothing moves. It starts with the
  point of the smallest time per layer on the host side (the floor cannot exceed it). With no host-bound point
  (or too few points to spare one) the floor is not measured and is set to 0.
"""
import math
from dataclasses import asdict

from deployments.catalog import GPUS
from observability.model_facts import DTYPE_BYTES, ModelFacts
from observability.performance_model import (Coefficients, Profile, decode_estimate, prefill_estimate,
                                             profile_from_json)


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """x minimising |a x − b|² (columns scaled, normal equations, Gaussian elimination with pivoting)."""
    n = len(a[0])
    scale = [math.sqrt(sum(row[j] ** 2 for row in a)) or 1.0 for j in range(n)]
    a = [[row[j] / scale[j] for j in range(n)] for row in a]
    m = [[sum(r[i] * r[j] for r in a) for j in range(n)] + [sum(r[i] * y for r, y in zip(a, b, strict=True))]
         for i in range(n)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[pivot] = m[pivot], m[col]
        if abs(m[col][col]) < 1e-12:
            raise ValueError("The measurements do not determine the coefficients (too few distinct shapes).")
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [x - f * y for x, y in zip(m[r], m[col], strict=True)]
    return [m[i][n] / m[i][i] / scale[i] for i in range(n)]


def facts_of(shape: dict, params: int) -> ModelFacts:
    """The measured decoder as the planner sees a model (untied embeddings, bf16: the table's method)."""
    return ModelFacts(shape["layers"], shape["hidden"], shape["heads"], shape["kv_heads"], shape["head_dim"],
                      params, "bfloat16", vocab_size=shape["vocab"])


def measured_points(measurement: dict, models=None) -> tuple[list, list]:
    """([(model, facts, tokens, seconds)], [(model, facts, sequences, context, seconds)]) of the file."""
    prefill, decode = [], []
    for name, m in measurement["models"].items():
        if models is not None and name not in models:
            continue
        facts = facts_of(measurement["shapes"][name], m["params"])
        if m.get("kv_bytes_per_token") not in (None, 2 * facts.num_layers * facts.num_kv_heads * facts.head_dim
                                                * DTYPE_BYTES[facts.dtype]):
            raise ValueError(f"{name}: kv_bytes_per_token disagrees with its shape.")
        prefill += [(name, facts, p["tokens"], p["ms"] / 1000) for p in m["prefill"]]
        decode += [(name, facts, p["sequences"], p["context"], p["ms"] / 1000) for p in m["decode"]]
    return prefill, decode


def _unit_profile(gpu: str) -> Profile:
    """Every coefficient 1: the model's terms then are the multipliers of the unknowns (one formula, the model's)."""
    return Profile(gpu, True, "", GPUS[gpu], Coefficients(1, 1, 1, 1, 1, 1, 1), (0, 0), (0, 0))


def _fit_prefill(points, gpu: str) -> tuple[float, float, float, float]:
    unit = _unit_profile(gpu)
    feats = []
    for _, f, tokens, s in points:
        e = prefill_estimate(f, gpu, tokens, profile=unit)
        feats.append(((e.layers_s, e.matmul_s, e.attention_s), s))
    fastest = min(range(len(feats)), key=lambda i: feats[i][1] / feats[i][0][0])
    host = {fastest} if len(feats) > 3 else set()  # GPU work needs three points of its own
    for _ in range(20):
        gpu_side = [i for i in range(len(feats)) if i not in host]
        g, u, v = _solve([[x / feats[i][1] for x in feats[i][0]] for i in gpu_side], [1.0] * len(gpu_side))
        if host:
            w = [feats[i][0][0] / feats[i][1] for i in host]
            launch = sum(w) / sum(x * x for x in w)
        else:
            launch = 0.0
        new = {i for i, (x, _) in enumerate(feats) if launch * x[0] > g * x[0] + u * x[1] + v * x[2]}
        if new == host or len(feats) - len(new) < 3:
            break
        host = new
    return launch, g, 1 / u, 1 / v


def _fit_decode(points, gpu: str) -> tuple[float, float, float]:
    unit = _unit_profile(gpu)
    rows = []
    for _, f, seqs, ctx, s in points:
        e = decode_estimate(f, gpu, seqs, ctx, profile=unit)
        rows.append([e.layers_s / s, e.bytes_s / s, e.batch_s / s])
    c, x_bytes, x_batch = _solve(rows, [1.0] * len(rows))
    return c, 1 / x_bytes, 1 / x_batch


def _checked(stage: str, values: tuple) -> tuple:
    if min(values) < 0:
        raise ValueError(f"The {stage} fit gave a negative coefficient {values}: these measurements do not "
                         "determine it (too few shapes or batches).")
    return values


def fit_coefficients(measurement: dict, *, gpu: str, models=None) -> Coefficients:
    """The coefficients that fit `measurement` (optionally only some of its models) best, relative to `gpu`'s
    data-sheet figures in the catalog."""
    prefill, decode = measured_points(measurement, models)
    return Coefficients(*_checked("prefill", _fit_prefill(prefill, gpu)),
                        *_checked("decode", _fit_decode(decode, gpu)))


def point_errors(profile_json: dict, gpu: str, measurement: dict, models=None) -> dict:
    """Predicted against measured at every point of `measurement` (optionally only some models)."""
    profile = profile_from_json(profile_json | {"errors": {"prefill": [{"error": 0}], "decode": [{"error": 0}]}}, gpu)
    prefill, decode = measured_points(measurement, models)
    out = {"prefill": [], "decode": []}
    for name, f, tokens, s in prefill:
        est = prefill_estimate(f, gpu, tokens, profile=profile).seconds
        out["prefill"].append({"model": name, "tokens": tokens, "measured_ms": round(s * 1000, 3),
                               "predicted_ms": round(est * 1000, 3), "error": round(est / s - 1, 4)})
    for name, f, seqs, ctx, s in decode:
        est = decode_estimate(f, gpu, seqs, ctx, profile=profile).seconds
        out["decode"].append({"model": name, "sequences": seqs, "context": ctx, "measured_ms": round(s * 1000, 3),
                              "predicted_ms": round(est * 1000, 3), "error": round(est / s - 1, 4)})
    return out


def profile_fit(measurement: dict, *, gpu: str, source: str, date: str) -> dict:
    """The profile file's JSON: coefficients, the fit's error at every point, the errors of fits on one model
    checked on the others (hold-outs), and the measured table itself."""
    coeffs = fit_coefficients(measurement, gpu=gpu)
    out = {
        "gpu": gpu,
        "source": source,
        "device": measurement.get("device"),
        "date": date,
        "software": {k: measurement[k] for k in ("torch", "cuda", "driver") if k in measurement},
        "method": measurement.get("method"),
        "figures": {"tflops": GPUS[gpu].tflops, "hbm_gbs": GPUS[gpu].hbm_gbs},
        "coefficients": asdict(coeffs),
    }
    out["errors"] = point_errors(out, gpu, measurement)
    out["holdout"] = [_holdout(out, measurement, gpu, kept) for kept in measurement["models"]
                      if len(measurement["models"]) > 1]
    out["measurement"] = {k: measurement[k] for k in ("shapes", "models")}
    return out


def _holdout(profile_json: dict, measurement: dict, gpu: str, kept: str) -> dict:
    """Fit on one model only, then the errors on the others; each stage on its own, as either may be undetermined
    by one model (decode at one shape cannot tell the per-layer time from the weights' bytes with few batches)."""
    others = [m for m in measurement["models"] if m != kept]
    prefill, decode = measured_points(measurement, [kept])
    out = {"fitted_on": [kept], "checked_on": others}
    base = dict(profile_json["coefficients"])
    for stage, fit, points, names in (("prefill", _fit_prefill, prefill, list(Coefficients.__dataclass_fields__)[:4]),
                                      ("decode", _fit_decode, decode, list(Coefficients.__dataclass_fields__)[4:])):
        try:
            values = _checked(stage, fit(points, gpu))
        except ValueError as e:
            out[stage] = {"failed": str(e)}
            continue
        coeffs = base | dict(zip(names, values, strict=True))
        errors = point_errors(profile_json | {"coefficients": coeffs}, gpu, measurement, models=others)[stage]
        out[stage] = {"coefficients": dict(zip(names, values, strict=True)), "errors": errors}
    return out
