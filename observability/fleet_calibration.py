"""Self-calibration from the fleet: what running deployments of a model measured against what the performance
model predicts for the same work, applied to plans of that model on that GPU. Pure (observability.selectors reads
the windows from the rollups).

A window is one hour of one deployment's engine rollups: the mean prefill time per request (Ray's histogram
_sum / _count, exact) at the window's mean prompt length, and the mean inter-token latency at its mean running
sequences per decode replica (per-minute peaks, so the batch is if anything overstated) and a context of the mean
prompt plus half the mean output. The ratio measured / predicted is taken with the plan's own model facts (the same
weights have the same facts), so deployments need not store them.

A ratio needs MIN_REQUESTS requests in its window: fewer are dominated by who sent them (one long prompt, a cold
cache) rather than by the GPU. Of the windows that have enough, the latest wins: a new engine version or a
changed setting shows up within the hour instead of being averaged away.
"""
import datetime as dt
from dataclasses import dataclass

from observability.model_facts import ModelFacts
from observability.performance_model import decode_estimate, prefill_estimate

MIN_REQUESTS = 300
WINDOW = dt.timedelta(hours=1)
LOOKBACK = dt.timedelta(days=7)


@dataclass(frozen=True)
class FleetWindow:
    """What one deployment's engines measured for one stage over one window."""

    stage: str  # prefill or decode
    deployment: str  # as a plan names it
    gpu: str
    tensor_parallel_size: int
    window_end: dt.datetime
    requests: int
    measured_ms: float  # mean prefill time per request, or mean inter-token latency
    prompt_tokens: float  # mean per request
    sequences: float = 0.0  # decode: mean running sequences per replica
    context_tokens: float = 0.0  # decode: mean prompt + half the mean output


@dataclass(frozen=True)
class Correction:
    """The ratio a plan applies to the profile's figure for one stage, and the window it comes from."""

    window: FleetWindow
    predicted_ms: float

    @property
    def ratio(self) -> float:
        return self.window.measured_ms / self.predicted_ms

    def line(self) -> str:
        w = self.window
        at = (f"at its mean prompt of {w.prompt_tokens:,.0f} tokens" if w.stage == "prefill" else
              f"at {w.sequences:,.1f} sequences per replica of {w.context_tokens:,.0f} tokens")
        return (f"measured on deployment {w.deployment} over {w.requests:,} requests (the hour to "
                f"{w.window_end:%Y-%m-%d %H:%M} UTC): {w.stage} {self.ratio:.2f}× the profile ({w.measured_ms:,.2f} ms "
                f"measured, {self.predicted_ms:,.2f} ms predicted {at}, {w.gpu} TP {w.tensor_parallel_size})")

    def to_json(self) -> dict:
        w = self.window
        return {"stage": w.stage, "deployment": w.deployment, "gpu": w.gpu, "requests": w.requests,
                "window_end": w.window_end.isoformat(), "measured_ms": round(w.measured_ms, 3),
                "predicted_ms": round(self.predicted_ms, 3), "ratio": round(self.ratio, 3)}


def correction_for(stage: str, facts: ModelFacts, gpu: str, windows) -> Correction | None:
    """The latest window of this stage on this GPU with enough requests, as a ratio to the profile; else None."""
    usable = [w for w in windows if w.stage == stage and w.gpu == gpu and w.requests >= MIN_REQUESTS]
    if not usable:
        return None
    w = max(usable, key=lambda w: w.window_end)
    if stage == "prefill":
        predicted = prefill_estimate(facts, gpu, w.prompt_tokens, w.tensor_parallel_size).seconds
    else:
        predicted = decode_estimate(facts, gpu, w.sequences, w.context_tokens, w.tensor_parallel_size).seconds
    return Correction(w, predicted * 1000)
