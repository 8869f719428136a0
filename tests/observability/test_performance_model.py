"""The performance model against the H200 table it was fitted on (a copy of
../shared/data/gpu/h200-20261204-llama8b-qwen32b.json is inside observability/profiles/h200.json, under
"measurement"), point by point; hold-outs; tensor parallelism and scaled GPUs against hand arithmetic."""
import json
from dataclasses import asdict, replace

import pytest

from deployments.spec import SpecError
from observability.model_facts import ModelFacts, model_facts_parse
from observability.performance_model import (PROFILES_DIR, decode_estimate, decode_step_seconds, matmul_params,
                                             prefill_estimate, prefill_seconds, profile_for)
from observability.profile_fit import facts_of, profile_fit

with open(PROFILES_DIR / "h200.json", encoding="utf-8") as f:
    H200 = json.load(f)
TABLE = H200["measurement"]
LLAMA_8B = facts_of(TABLE["shapes"]["llama-3.1-8b"], TABLE["models"]["llama-3.1-8b"]["params"])

PREFILL_POINTS = [(name, p["tokens"], p["ms"]) for name, m in TABLE["models"].items() for p in m["prefill"]]
DECODE_POINTS = [(name, p["sequences"], p["context"], p["ms"]) for name, m in TABLE["models"].items()
                 for p in m["decode"]]


def _facts(name: str) -> ModelFacts:
    return facts_of(TABLE["shapes"][name], TABLE["models"][name]["params"])


@pytest.mark.parametrize(("name", "tokens", "ms"), PREFILL_POINTS)
def test_prefill_matches_every_measured_point(name, tokens, ms):
    allowed = 0.25 if tokens < 512 else 0.10
    assert prefill_seconds(_facts(name), "H200", tokens) * 1000 == pytest.approx(ms, rel=allowed)


@pytest.mark.parametrize(("name", "sequences", "context", "ms"), DECODE_POINTS)
def test_decode_step_matches_every_measured_point(name, sequences, context, ms):
    assert decode_step_seconds(_facts(name), "H200", sequences, context) * 1000 == pytest.approx(ms, rel=0.10)


def test_the_committed_profile_is_what_the_fit_gives_on_its_table():
    """observability/profiles/h200.json is bench/fit_gpu_profile.py's output on the table it holds: a change to the
    model or the fit without refitting the profile fails here."""
    again = profile_fit(TABLE, gpu="H200", source=H200["source"], date=H200["date"])
    assert again["coefficients"] == pytest.approx(H200["coefficients"], rel=1e-9)
    assert again["errors"] == H200["errors"]


def test_a_fit_on_one_model_predicts_the_other_within_the_hold_out_bounds():
    """Fitted on the Llama-8B shape only (32 layers, hidden 4,096, 32 heads, vocabulary 128,256), checked on the
    Qwen-32B shape (64 layers, hidden 5,120, 40 heads, vocabulary 152,064): ±15% prefill, ±12% decode."""
    fit = profile_fit(TABLE, gpu="H200", source="test", date="2026-12-04")
    on_llama = next(h for h in fit["holdout"] if h["fitted_on"] == ["llama-3.1-8b"])
    assert [e["model"] for e in on_llama["prefill"]["errors"]] == ["qwen2.5-32b"] * 3
    assert all(abs(e["error"]) <= 0.15 for e in on_llama["prefill"]["errors"])
    assert all(abs(e["error"]) <= 0.12 for e in on_llama["decode"]["errors"])


def test_llama_8b_at_2048_tokens_is_the_measured_56_ms_not_the_old_83():
    est = prefill_estimate(LLAMA_8B, "H200", 2048)
    low, high = est.profile.prefill_error
    assert est.seconds / (1 + high) <= 0.056018 <= est.seconds / (1 + low)
    assert est.seconds < 0.060 and not est.host_bound
    assert prefill_estimate(LLAMA_8B, "H200", 128).host_bound  # 32 layers × the launch floor


def test_tensor_parallelism_divides_the_work_and_adds_the_all_reduces():
    """Llama-8B, 2,048 tokens, TP 2 on H200: all-reduces = 32 layers × 2 × (2 × 1/2 × 2,048 × 4,096 × 2 B =
    16,777,216 B) / 450 GB/s = 2.386 ms; the per-layer time stays, the matmul and attention terms halve."""
    one, two = prefill_estimate(LLAMA_8B, "H200", 2048), prefill_estimate(LLAMA_8B, "H200", 2048, 2)
    assert two.allreduce_s * 1000 == pytest.approx(32 * 2 * 16_777_216 / 450e9 * 1000, rel=1e-9)
    assert two.seconds == pytest.approx(one.layers_s + (one.matmul_s + one.attention_s) / 2 + two.allreduce_s)
    d1, d2 = decode_estimate(LLAMA_8B, "H200", 8, 2048), decode_estimate(LLAMA_8B, "H200", 8, 2048, 2)
    assert d2.bytes_read == pytest.approx(d1.bytes_read / 2)  # 8 KV heads split over 2 GPUs, weights halved
    # TP 16 above the 8 KV heads replicates them: each GPU holds one KV head per layer, 2 × 32 × 1 × 128 × 2 B.
    d16 = decode_estimate(LLAMA_8B, "H200", 8, 2048, 16)
    assert d16.bytes_read == pytest.approx((d1.bytes_read - 8 * 2048 * 131_072) / 16 + 8 * 2048 * 16_384)


def test_a_gpu_without_measurements_is_scaled_from_h200_and_says_so():
    h100 = profile_for("H100")
    assert h100.kind == "scaled, not measured" and "H200 profile scaled" in h100.source
    assert profile_for("H200").kind == "measured"
    h200_step, h100_step = decode_estimate(LLAMA_8B, "H200", 1, 1024), decode_estimate(LLAMA_8B, "H100", 1, 1024)
    assert h100_step.bytes_s == pytest.approx(h200_step.bytes_s * 4800 / 3350)  # HBM 4.8 vs 3.35 TB/s
    assert h100_step.layers_s == h200_step.layers_s
    l40s = prefill_estimate(LLAMA_8B, "L40S", 2048)
    assert l40s.matmul_s == pytest.approx(prefill_estimate(LLAMA_8B, "H200", 2048).matmul_s * 989 / 362)
    with pytest.raises(ValueError, match="No data-sheet figures for GPU 'B200'"):
        prefill_seconds(LLAMA_8B, "B200", 128)


def test_without_a_vocabulary_every_parameter_counts_as_matmul_work():
    """Facts entered without vocab_size: the embedding table is counted as work (slower, never faster)."""
    bare = replace(LLAMA_8B, vocab_size=None)
    assert prefill_seconds(bare, "H200", 2048) > prefill_seconds(LLAMA_8B, "H200", 2048)
    assert asdict(bare)["vocab_size"] is None


def test_tied_embeddings_count_the_table_once_and_a_flag_that_is_not_a_boolean_is_refused():
    """Llama-3.2-1B's config (tied): 128,256 × 2,048 = 262,668,288 table parameters, and 16 layers × (2,048 × 32 × 64
    × 2 + 2,048 × 8 × 64 × 2 + 3 × 2,048 × 8,192 + 2 × 2,048) + the final norm = 973,146,112 others."""
    cfg = {"num_hidden_layers": 16, "hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 8,
           "head_dim": 64, "intermediate_size": 8192, "vocab_size": 128256, "tie_word_embeddings": True}
    facts = model_facts_parse(cfg)
    assert facts.param_count == 1_235_814_400 and matmul_params(facts) == (973_146_112, 262_668_288)
    with pytest.raises(SpecError) as e:
        model_facts_parse(cfg | {"tie_word_embeddings": "yes"})
    assert e.value.errors == {"model_facts.tie_word_embeddings": ["Must be true or false."]}
