"""Expected latency and the verdict on targets, from the performance model.

Llama-3.1-8B on one H200 (p5e.48xlarge, TP 1 per pool), 0.1 req/s, 2,048 prompt and 256 output tokens:
- prefill: measured 56.018 ms on an H200 (../shared/data/gpu/h200-20261204-llama8b-qwen32b.json); the old
  constants (40% of 989 TFLOPS) said 2 × 8,030,261,248 × 2,048 / (989e12 × 0.4) = 83.1 ms;
- ρ = 0.1 × 0.056 = 0.006 ≤ 0.05 → no wait; KV 2,048 × 131,072 B = 268,435,456 B × 8 / 3,200 Gbit/s = 0.67 ms;
- TTFT = prefill + 0 + 0.67 + one decode step (1 sequence of 2,048 + 128 tokens); ITL = that step.
"""
import pytest

from observability.model_facts import model_facts_parse
from observability.performance_model import decode_step_seconds, prefill_seconds
from observability.planner import plan_for_spec
from tests.factories import local_spec_input, spec_input
from tests.observability.test_planner import LLAMA_8B

P5E = {"instance_type": "p5e.48xlarge", "nodes": 1, "gpus_per_node": 8, "tensor_parallel_size": 1}
LOAD_2K = {"requests_per_second": 0.1, "mean_prompt_tokens": 2048, "mean_output_tokens": 256}
FACTS = model_facts_parse(LLAMA_8B)


def _h200_plan(**overrides):
    return plan_for_spec(spec_input(prefill=P5E, decode=P5E, expected_load=LOAD_2K, **overrides), LLAMA_8B)


def test_llama_8b_on_one_h200_at_2048_tokens_expects_the_measured_56_ms_not_83():
    p = _h200_plan(targets={"ttft_p95_ms": 300, "itl_p95_ms": 20})
    prefill = p["latency"]["prefill_ms"]
    low, high = prefill["range_ms"]
    assert low <= 56.018 <= high and high < 60 and prefill["expected_ms"] == 56.0
    assert p["latency"]["profiles"]["prefill"]["kind"] == "measured"
    assert p["latency"]["profiles"]["prefill"]["source"].startswith("h200-20261204-llama8b-qwen32b.json")
    assert any(line.startswith("Latency, prefill of 2,048 tokens on H200 TP 1: max(host floor 32 layers × 0.308 ms")
               and line.endswith("= 56.04 ms per request.") for line in p["arithmetic"])


def test_ttft_is_prefill_plus_kv_transfer_plus_one_decode_step_with_the_ranges_added():
    p = _h200_plan(targets={"ttft_p95_ms": 300, "itl_p95_ms": 20})
    lat, t = p["latency"], p["targets"]
    step_ms = decode_step_seconds(FACTS, "H200", 1, 2048 + 128) * 1000
    kv_ms = 268_435_456 * 8 / 3200e9 * 1000
    assert lat["itl_ms"]["expected_ms"] == round(step_ms, 1)
    assert lat["ttft_ms"]["expected_ms"] == pytest.approx(round(prefill_seconds(FACTS, "H200", 2048) * 1000, 1)
                                                          + kv_ms + round(step_ms, 1), abs=0.06)
    assert lat["ttft_ms"]["range_ms"] == pytest.approx(
        [a + kv_ms + b for a, b in zip(lat["prefill_ms"]["range_ms"], lat["itl_ms"]["range_ms"], strict=True)],
        abs=0.06)
    assert t["ttft"] == {"target_ms": 300.0, **lat["ttft_ms"], "meets": True} and t["verdict"] == "meets"


def test_a_gpu_without_a_measured_profile_says_it_was_scaled_and_tp_says_uncalibrated():
    p = plan_for_spec(spec_input(targets={"ttft_p95_ms": 300}), LLAMA_8B)  # g6e.12xlarge: L40S, TP 4
    assert p["latency"]["profiles"]["prefill"]["kind"] == "scaled, not measured"
    assert any(line.startswith("Latency, prefill profile: L40S, scaled, not measured: H200 profile scaled")
               for line in p["arithmetic"])
    assert any("all-reduces" in line and "data sheet, not calibrated" in line for line in p["arithmetic"])


def test_a_tight_target_or_an_overloaded_prefill_is_judged_missed():
    tight = _h200_plan(targets={"ttft_p95_ms": 60})["targets"]
    assert tight["verdict"] == "misses" and tight["ttft"]["meets"] is False and tight["itl"] is None
    busy = spec_input(prefill=P5E, decode=P5E, targets={"ttft_p95_ms": 300},
                      expected_load={"requests_per_second": 40, "mean_prompt_tokens": 4096, "mean_output_tokens": 256})
    t = plan_for_spec(busy, LLAMA_8B)["targets"]
    assert t["verdict"] == "misses" and "cannot keep up" in t["text"] and t["prefill_utilization"] > 1


def test_no_targets_still_shows_the_expected_latency_and_the_cpu_target_is_not_guessed():
    p = _h200_plan()
    assert p["targets"] is None and p["latency"]["ttft_ms"]["expected_ms"] > 56
    local = plan_for_spec(local_spec_input(targets={"ttft_p95_ms": 300}), LLAMA_8B)
    assert local["latency"] is None and local["targets"]["verdict"] == "unknown"
