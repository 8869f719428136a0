"""What the advisor's changes are expected to give, from the performance model. Pure.

- One prefill and one decode step are observability.performance_model's figures for the deployment's model (the
  facts of its config.json) on the pool's GPU at its tensor-parallel size: prefill at the window's mean prompt, a
  decode step at the window's peak running sequences spread over the replicas, each holding the mean prompt and half
  the mean output. Each figure has the range the fit's error gives and names its profile (measured, or scaled), and
  is scaled by the fleet's correction (observability.fleet_calibration) where a running deployment of the same model
  on the same GPU measured one; the deployment itself counts once it has served an hour of enough requests.
- Prefill replicas r → r': TTFT p95 ≈ today's TTFT p95 − today's prefill queue p95 + the M/M/1 p95 wait at r'
  replicas (observability.planner_targets.mm1_p95_wait_s), the window's request rate split evenly over them.
- Decode replicas r → r': ITL p95 ≈ one decode step at the batch per replica r' leaves; the running figure is the
  window's peak, so the batch is if anything overstated.
- A stage bound by its own compute: the figure at today's tensor-parallel size and at twice it, where the instance
  has the GPUs (the all-reduces use the interconnect's data-sheet figure, not calibrated).
Without the model's facts (weights on S3 or Hugging Face, or no config.json inside the cluster's model sources) or
without a GPU profile (CPU pools), the line says the prediction is unavailable and why; nothing is guessed.
"""
import math
from dataclasses import dataclass

from deployments.catalog import GPUS, INSTANCE_TYPES
from deployments.spec import DeploymentSpec, PoolSpec
from observability.fleet_calibration import FleetWindow, correction_for
from observability.model_facts import ModelFacts
from observability.performance_model import decode_estimate, expected_range, prefill_estimate
from observability.planner_targets import mm1_p95_wait_s


class Unavailable(Exception):
    """The model cannot predict this figure; the message says why."""


@dataclass(frozen=True)
class ModelBasis:
    """What the advisor predicts with: the deployment's model facts (None: `unavailable` says why) and what running
    deployments of the same model measured (observability.selectors.fleet_windows)."""

    facts: ModelFacts | None
    unavailable: str = ""
    fleet: tuple[FleetWindow, ...] = ()


@dataclass(frozen=True)
class Traffic:
    """The request rate and mean request the predictions are made at, and where they come from."""

    requests_per_second: float
    prompt_tokens: float
    output_tokens: float
    source: str


def traffic_of(spec: DeploymentSpec, *, requests: int, prompt_tokens: int, output_tokens: int,
               seconds: int) -> Traffic:
    """The window's gateway traffic, or the spec's expected load when none was rolled up (and then says so)."""
    if requests:
        return Traffic(requests / seconds, prompt_tokens / requests, output_tokens / requests,
                       f"the window's {requests:,} requests")
    load = spec.expected_load
    return Traffic(load.requests_per_second, load.mean_prompt_tokens, load.mean_output_tokens,
                   "the spec's expected load: no gateway traffic was rolled up in this window")


def _ms(v: float) -> str:
    return f"{v:,.1f} ms" if v >= 10 else f"{v:,.2f} ms"


def _replicas(n: int) -> str:
    return f"{n} replica" if n == 1 else f"{n} replicas"


@dataclass(frozen=True)
class Figure:
    """A predicted time with the range the fit's error gives, and the profile and correction it rests on."""

    ms: float
    low_ms: float
    high_ms: float
    basis: str
    profile: dict
    correction: dict | None

    def text(self) -> str:
        return f"{_ms(self.ms)} (range {_ms(self.low_ms)}–{_ms(self.high_ms)})"

    def to_json(self) -> dict:
        return {"expected_ms": round(self.ms, 1), "range_ms": [round(self.low_ms, 1), round(self.high_ms, 1)]}


def _facts(basis: ModelBasis, pool: PoolSpec) -> tuple[ModelFacts, str]:
    if basis.facts is None:
        raise Unavailable(basis.unavailable)
    inst = INSTANCE_TYPES[pool.instance_type]
    if inst.gpu not in GPUS:
        raise Unavailable(f"{inst.name} has no GPU the performance model has figures for (it models GPUs only)")
    return basis.facts, inst.gpu


def _figure(stage: str, est, basis: ModelBasis, facts: ModelFacts, gpu: str) -> Figure:
    corr = correction_for(stage, facts, gpu, basis.fleet)
    ratio = corr.ratio if corr else 1.0
    p = est.profile
    low, high = expected_range(est.seconds * ratio, p.prefill_error if stage == "prefill" else p.decode_error)
    text = f"{gpu}, {p.kind} profile"
    if corr:
        text += f", × {ratio:.2f} as {corr.line()}"
    return Figure(est.seconds * ratio * 1000, low * 1000, high * 1000, text, p.to_json(),
                  corr.to_json() if corr else None)


def prefill_figure(basis: ModelBasis, pool: PoolSpec, prompt_tokens: float, tp: int | None = None) -> Figure:
    """One prefill of `prompt_tokens` on one replica of the pool (at `tp`, else the pool's tensor-parallel size)."""
    facts, gpu = _facts(basis, pool)
    tp = tp or pool.tensor_parallel_size
    return _figure("prefill", prefill_estimate(facts, gpu, prompt_tokens, tp), basis, facts, gpu)


def decode_figure(basis: ModelBasis, pool: PoolSpec, sequences: float, context_tokens: float,
                  tp: int | None = None) -> Figure:
    """One decode step with `sequences` running per replica, each holding `context_tokens` of KV."""
    facts, gpu = _facts(basis, pool)
    tp = tp or pool.tensor_parallel_size
    return _figure("decode", decode_estimate(facts, gpu, sequences, context_tokens, tp), basis, facts, gpu)


def _judged(measure: str, fig_ms: float, low: float, high: float | None, target_ms: float, fig: Figure) -> dict:
    return {"measure": measure, "expected_ms": round(fig_ms, 1),
            "range_ms": [round(low, 1), None if high is None else round(high, 1)], "target_ms": target_ms,
            "meets": fig_ms <= target_ms, "profile": fig.profile, "fleet": fig.correction}


def unavailable(what: str, why: str) -> tuple[str, dict]:
    return f"expected {what}: unavailable, because {why}", {"unavailable": why}


def ttft_with_prefill_replicas(basis: ModelBasis, spec: DeploymentSpec, traffic: Traffic, *, ttft_ms: float | None,
                               queue_ms: float | None, replicas: int, target_ms: float) -> tuple[str, dict]:
    """(line, figures): TTFT p95 with `replicas` prefill replicas, today's queue replaced by the model's."""
    try:
        if ttft_ms is None or queue_ms is None:
            raise Unavailable("the window has no TTFT or prefill queue figure to start from")
        fig = prefill_figure(basis, spec.prefill, traffic.prompt_tokens)
    except Unavailable as e:
        return unavailable("TTFT", str(e))
    lam = traffic.requests_per_second / replicas

    def after(service_ms: float) -> float | None:
        s = service_ms / 1000
        return None if lam * s >= 1 else max(ttft_ms - queue_ms + mm1_p95_wait_s(lam, s) * 1000, 0.0)

    rho = lam * fig.ms / 1000
    head = (f"prefill {fig.text()} per request of {traffic.prompt_tokens:,.0f} tokens at TP "
            f"{spec.prefill.tensor_parallel_size} ({fig.basis}); {traffic.requests_per_second:,.3g} req/s "
            f"({traffic.source}) / {_replicas(replicas)}")
    mid, low, high = after(fig.ms), after(fig.low_ms), after(fig.high_ms)
    if mid is None:
        needed = math.floor(traffic.requests_per_second * fig.ms / 1000) + 1
        return (f"expected: prefill still falls behind at {_replicas(replicas)}: {head} → ρ = {rho:.2f} per replica, "
                f"at least 1, so the queue keeps growing; it keeps up from {needed} replicas",
                {"measure": "ttft_p95", "expected_ms": None, "keeps_up_from_replicas": needed,
                 "target_ms": target_ms, "meets": False, "profile": fig.profile, "fleet": fig.correction})
    wait = mid - max(ttft_ms - queue_ms, 0.0)
    verdict = "under" if mid <= target_ms else "still over"
    high_text = _ms(high) if high is not None else "no bound (at the range's slow end prefill falls behind)"
    return (f"expected TTFT p95 ≈ {_ms(ttft_ms)} − queue {_ms(queue_ms)} + p95 wait at {_replicas(replicas)} "
            f"{_ms(wait)} = {_ms(mid)} (range {_ms(low)}–{high_text}), {verdict} the {_ms(target_ms)} target: {head} "
            f"→ ρ = {rho:.2f} per replica, M/M/1 p95 wait ln(ρ / 0.05) / (μ − λ)",
            _judged("ttft_p95", mid, low, high, target_ms, fig))


def itl_with_decode_replicas(basis: ModelBasis, spec: DeploymentSpec, traffic: Traffic, *, running: float | None,
                             itl_ms: float | None, replicas_now: int, replicas: int,
                             target_ms: float) -> tuple[str, dict]:
    """(line, figures): ITL p95 with `replicas` decode replicas: one step at the batch per replica they leave."""
    try:
        if running is None:
            raise Unavailable("the decode engines reported no running sequences, which a step's time depends on")
        ctx = traffic.prompt_tokens + traffic.output_tokens / 2
        batch, batch_now = max(running / replicas, 1.0), max(running / replicas_now, 1.0)
        fig = decode_figure(basis, spec.decode, batch, ctx)
        now = decode_figure(basis, spec.decode, batch_now, ctx)
    except Unavailable as e:
        return unavailable("ITL", str(e))
    verdict = "under" if fig.ms <= target_ms else "still over"
    measured = f", against {_ms(itl_ms)} measured" if itl_ms is not None else ""
    return (f"expected ITL p95 ≈ one decode step at {running:g} running (the window's peak) / "
            f"{_replicas(replicas)} = {batch:,.1f} sequences per replica of {ctx:,.0f} tokens (mean prompt + half "
            f"the output, {traffic.source}) at TP {spec.decode.tensor_parallel_size}: {fig.text()}, {verdict} the "
            f"{_ms(target_ms)} target ({fig.basis}); at today's "
            f"{batch_now:,.1f} per replica the model gives {_ms(now.ms)}{measured}",
            _judged("itl_p95", fig.ms, fig.low_ms, fig.high_ms, target_ms, fig))


def _doubled_tp(pool: PoolSpec) -> int | None:
    tp = pool.tensor_parallel_size * 2
    return tp if tp <= INSTANCE_TYPES[pool.instance_type].gpus else None


def _compute(what: str, fig: Figure, pool: PoolSpec, doubled: Figure | None) -> tuple[str, dict]:
    tp = pool.tensor_parallel_size
    out = {"measure": what, "at_tp": {str(tp): fig.to_json()}, "profile": fig.profile, "fleet": fig.correction}
    text = f"the model gives {fig.text()} at TP {tp}"
    if doubled is not None:
        out["at_tp"][str(tp * 2)] = doubled.to_json()
        text += (f" and {doubled.text()} at TP {tp * 2} (its all-reduces at the interconnect's data-sheet figure, "
                 "not calibrated)")
    return f"{text} ({fig.basis})", out


def prefill_compute(basis: ModelBasis, spec: DeploymentSpec, traffic: Traffic) -> tuple[str, dict]:
    """(line, figures): one prefill at the window's mean prompt at today's tensor-parallel size and at twice it."""
    p = spec.prefill
    try:
        fig = prefill_figure(basis, p, traffic.prompt_tokens)
        tp2 = _doubled_tp(p)
        doubled = prefill_figure(basis, p, traffic.prompt_tokens, tp2) if tp2 else None
    except Unavailable as e:
        return unavailable("prefill", str(e))
    text, out = _compute("prefill", fig, p, doubled)
    return f"Expected prefill of {traffic.prompt_tokens:,.0f} tokens ({traffic.source}): {text}.", out


def decode_compute(basis: ModelBasis, spec: DeploymentSpec, traffic: Traffic, *,
                   running: float | None) -> tuple[str, dict]:
    """(line, figures): one decode step at today's batch per replica at today's tensor-parallel size and twice it."""
    d = spec.decode
    batch = max((running or 0) / d.replicas_max, 1.0)
    ctx = traffic.prompt_tokens + traffic.output_tokens / 2
    try:
        fig = decode_figure(basis, d, batch, ctx)
        tp2 = _doubled_tp(d)
        doubled = decode_figure(basis, d, batch, ctx, tp2) if tp2 else None
    except Unavailable as e:
        return unavailable("decode step", str(e))
    text, out = _compute("decode_step", fig, d, doubled)
    return (f"Expected decode step at {batch:,.1f} sequences per replica of {ctx:,.0f} tokens ({traffic.source}): "
            f"{text}.", out)
