"""How long one prefill and one decode step take on a GPU: a small model whose coefficients are fitted to
measurements of that GPU (observability/profiles/*.json, fitted by bench/fit_gpu_profile.py). Pure. One line
per term:

Prefill of T prompt tokens at tensor-parallel size TP = max(host floor, GPU work):
- host floor = layers × launch time per layer: below it the GPU waits for the host's kernel launches; above it
  the launches hide behind the GPU's work (short prompts are host-bound, long ones are not);
- GPU work = layers × fixed time per layer
  + 2 × matmul params × T FLOPs / (TP × peak × matmul share)
  + attention's causal 2 × layers × T² × heads × head dim FLOPs / (TP × peak × attention share)
  + the all-reduces (below).
Decode step of S running sequences holding C tokens of KV each =
- layers × fixed time per layer
  + (weights read + S × C × KV bytes per token) / TP / (HBM bandwidth × bytes share)
  + 2 × matmul params × S FLOPs / (TP × peak × batch share): the batch's own compute, which is why a step's share
    of HBM bandwidth grows with the batch
  + the all-reduces.
Matmul params are all parameters but the embedding table (a lookup); the LM head runs for every decode sequence
but, in prefill, for the last position only. Without `vocab_size` every parameter counts as matmul work.
Tensor parallelism divides compute and bytes and adds two all-reduces per layer (after attention and after the
MLP) of tokens × hidden × dtype bytes, a ring moving 2 × (TP − 1) / TP of it over the GPU's interconnect: that
term is the interconnect's data-sheet figure, not calibrated (every profile was measured on one GPU).

A GPU without a measured profile is the H200 profile scaled by data-sheet figures (peak FLOPS and HBM bandwidth;
the per-layer times kept): marked "scaled, not measured" wherever it is used.
"""
import json
import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from deployments.catalog import GPUS, GpuFigures
from observability.model_facts import DTYPE_BYTES, ModelFacts

PROFILES_DIR = Path(__file__).with_name("profiles")
REFERENCE_GPU = "H200"  # what unmeasured GPUs are scaled from
MEASURED_FILES = {"H200": "h200.json"}


@dataclass(frozen=True)
class Coefficients:
    """What a fit gives: per-layer times in seconds and shares of the data-sheet peak FLOPS or HBM bandwidth."""

    launch_s_per_layer: float
    prefill_s_per_layer: float
    prefill_matmul_share: float
    prefill_attention_share: float
    decode_s_per_layer: float
    decode_bytes_share: float
    decode_batch_share: float


@dataclass(frozen=True)
class Profile:
    gpu: str
    measured: bool
    source: str
    figures: GpuFigures
    coefficients: Coefficients
    # Lowest and highest (predicted / measured − 1) over the measured points: what a figure's range comes from.
    prefill_error: tuple[float, float]
    decode_error: tuple[float, float]

    @property
    def kind(self) -> str:
        return "measured" if self.measured else "scaled, not measured"

    def to_json(self) -> dict:
        return {"gpu": self.gpu, "kind": self.kind, "source": self.source,
                "prefill_error": list(self.prefill_error), "decode_error": list(self.decode_error)}


def expected_range(seconds: float, error: tuple[float, float]) -> tuple[float, float]:
    """Where the measured time would lie if this prediction erred as the fit did at its measured points:
    measured = predicted / (1 + error)."""
    low, high = error
    return seconds / (1 + high), seconds / (1 + low)


def _profile_read(name: str) -> dict:
    with open(PROFILES_DIR / name, encoding="utf-8") as f:
        return json.load(f)


def profile_from_json(data: dict, gpu: str) -> Profile:
    """A measured profile from its file's JSON (the shape bench/fit_gpu_profile.py writes)."""
    errors = data["errors"]
    return Profile(gpu=gpu, measured=True, source=data["source"], figures=GPUS[gpu],
                   coefficients=Coefficients(**data["coefficients"]),
                   prefill_error=_span(e["error"] for e in errors["prefill"]),
                   decode_error=_span(e["error"] for e in errors["decode"]))


def _span(values) -> tuple[float, float]:
    values = list(values)
    return min(min(values), 0.0), max(max(values), 0.0)


@cache
def profile_for(gpu: str) -> Profile:
    """The GPU's measured profile, else the reference GPU's scaled to its data-sheet figures."""
    if gpu not in GPUS:
        raise ValueError(f"No data-sheet figures for GPU {gpu!r}; known: {', '.join(GPUS)}.")
    if gpu in MEASURED_FILES:
        return profile_from_json(_profile_read(MEASURED_FILES[gpu]), gpu)
    ref = profile_for(REFERENCE_GPU)
    fig = GPUS[gpu]
    source = (f"{ref.gpu} profile scaled to the {gpu}'s data-sheet figures ({fig.tflops:g} TFLOPS, "
              f"{fig.hbm_gbs:g} GB/s HBM), not measured; measured on: {ref.source}")
    return Profile(gpu=gpu, measured=False, source=source, figures=fig, coefficients=ref.coefficients,
                   prefill_error=ref.prefill_error, decode_error=ref.decode_error)


def matmul_params(facts: ModelFacts) -> tuple[int, int]:
    """(parameters every token multiplies through, LM head parameters): the embedding table is a lookup."""
    if not facts.vocab_size:
        return facts.param_count, 0
    table = facts.vocab_size * facts.hidden_size
    body = facts.param_count - table - (0 if facts.tie_word_embeddings else table)
    return max(body, 0), table


def _allreduce_s(facts: ModelFacts, fig: GpuFigures, tokens: float, tp: int) -> float:
    if tp <= 1:
        return 0.0
    moved = 2 * (tp - 1) / tp * tokens * facts.hidden_size * DTYPE_BYTES[facts.dtype]
    return facts.num_layers * 2 * moved / (fig.interconnect_gbs * 1e9)


@dataclass(frozen=True)
class PrefillEstimate:
    """One prefill's time and its terms (seconds), for lines a person can check."""

    seconds: float
    host_s: float
    layers_s: float
    matmul_flops: float
    matmul_s: float
    attention_flops: float
    attention_s: float
    allreduce_s: float
    profile: Profile

    @property
    def host_bound(self) -> bool:
        return self.host_s >= self.seconds


@dataclass(frozen=True)
class DecodeEstimate:
    """One decode step's time and its terms (seconds)."""

    seconds: float
    layers_s: float
    bytes_read: float
    bytes_s: float
    batch_flops: float
    batch_s: float
    allreduce_s: float
    profile: Profile


def prefill_estimate(facts: ModelFacts, gpu: str, prompt_tokens: float, tensor_parallel_size: int = 1, *,
                     profile: Profile | None = None) -> PrefillEstimate:
    """`profile` stands in for the GPU's stored one (a fit being checked)."""
    pr, tp, t = profile or profile_for(gpu), tensor_parallel_size, prompt_tokens
    c, peak = pr.coefficients, pr.figures.tflops * 1e12
    body, head = matmul_params(facts)
    mm = 2 * body * t + 2 * head
    attn = 2 * facts.num_layers * t * t * facts.num_attention_heads * facts.head_dim
    host = facts.num_layers * c.launch_s_per_layer
    layers = facts.num_layers * c.prefill_s_per_layer
    mm_s = mm / (tp * peak * c.prefill_matmul_share)
    attn_s = attn / (tp * peak * c.prefill_attention_share)
    ar = _allreduce_s(facts, pr.figures, t, tp)
    return PrefillEstimate(max(host, layers + mm_s + attn_s + ar), host, layers, mm, mm_s, attn, attn_s, ar, pr)


def kv_bytes_per_token_per_gpu(facts: ModelFacts, tensor_parallel_size: int = 1) -> int:
    """K and V of every layer for one token on one GPU; TP above the KV heads replicates them."""
    return 2 * facts.num_layers * math.ceil(facts.num_kv_heads / tensor_parallel_size) * facts.head_dim \
        * DTYPE_BYTES[facts.dtype]


def decode_estimate(facts: ModelFacts, gpu: str, sequences: float, context_tokens: float,
                    tensor_parallel_size: int = 1, *, profile: Profile | None = None) -> DecodeEstimate:
    """A step at `sequences` (fractional: a mean batch) running sequences of `context_tokens` each."""
    pr, tp = profile or profile_for(gpu), tensor_parallel_size
    c = pr.coefficients
    body, head = matmul_params(facts)
    weights = (body + head) * DTYPE_BYTES[facts.dtype] / tp
    read = weights + sequences * context_tokens * kv_bytes_per_token_per_gpu(facts, tp)
    bytes_s = read / (pr.figures.hbm_gbs * 1e9 * c.decode_bytes_share)
    flops = 2 * (body + head) * sequences / tp
    batch_s = flops / (pr.figures.tflops * 1e12 * c.decode_batch_share)
    layers = facts.num_layers * c.decode_s_per_layer
    ar = _allreduce_s(facts, pr.figures, sequences, tp)
    return DecodeEstimate(layers + bytes_s + batch_s + ar, layers, read, bytes_s, flops, batch_s, ar, pr)


def prefill_seconds(facts: ModelFacts, gpu: str, prompt_tokens: int, tensor_parallel_size: int = 1) -> float:
    """Seconds one prefill of `prompt_tokens` takes on one replica of `gpu` at this tensor-parallel size."""
    return prefill_estimate(facts, gpu, prompt_tokens, tensor_parallel_size).seconds


def decode_step_seconds(facts: ModelFacts, gpu: str, sequences: int, context_tokens: int,
                        tensor_parallel_size: int = 1) -> float:
    """Seconds one decode step takes with `sequences` running, each holding `context_tokens` of KV."""
    return decode_estimate(facts, gpu, sequences, context_tokens, tensor_parallel_size).seconds
