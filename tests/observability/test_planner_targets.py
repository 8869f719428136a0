"""The planner's verdict on latency targets, against hand arithmetic for Llama-3-8B on g6e.12xlarge (L40S).

Hand arithmetic, 2 req/s, 1,024 prompt and 256 output tokens, one replica of TP 4 per pool:
- prefill 2 × 8,030,261,248 × 1,024 = 1.6446e13 FLOPs / (4 × 362e12 × 0.4) = 28.39 ms; ρ = 2 × 0.02839 = 0.0568;
  p95 wait ln(0.0568 / 0.05) / (35.22 − 2) = 3.83 ms; KV 134,217,728 B × 8 / 100 Gbit/s = 10.74 ms;
- decode step ≈ (4.015 GB + KV of ~3.5 sequences / 4) / (864 GB/s × 0.7) = 6.86 ms;
- TTFT p95 ≈ 28.39 + 3.83 + 10.74 + 6.86 = 49.8 ms.
"""
from observability.planner import plan_for_spec
from tests.factories import local_spec_input, spec_input
from tests.observability.test_planner import LLAMA_8B


def test_targets_within_reach_are_judged_met_with_the_arithmetic_shown():
    p = plan_for_spec(spec_input(targets={"ttft_p95_ms": 300, "itl_p95_ms": 20}), LLAMA_8B)
    t = p["targets"]
    assert t["ttft"] == {"target_ms": 300.0, "expected_ms": 49.8, "meets": True}
    assert t["itl"] == {"target_ms": 20.0, "expected_ms": 6.9, "meets": True} and t["verdict"] == "meets"
    assert any("ln(0.06 / 0.05)" in line for line in p["arithmetic"])


def test_a_tight_target_or_an_overloaded_prefill_is_judged_missed():
    tight = plan_for_spec(spec_input(targets={"ttft_p95_ms": 40}), LLAMA_8B)["targets"]
    assert tight["verdict"] == "misses" and tight["ttft"]["meets"] is False and tight["itl"] is None
    busy = spec_input(targets={"ttft_p95_ms": 300},
                      expected_load={"requests_per_second": 40, "mean_prompt_tokens": 4096, "mean_output_tokens": 256})
    t = plan_for_spec(busy, LLAMA_8B)["targets"]
    assert t["verdict"] == "misses" and "cannot keep up" in t["text"] and t["prefill_utilization"] > 1


def test_no_targets_no_verdict_and_the_cpu_target_is_not_guessed():
    assert plan_for_spec(spec_input(), LLAMA_8B)["targets"] is None
    assert plan_for_spec(local_spec_input(targets={"ttft_p95_ms": 300}), LLAMA_8B)["targets"]["verdict"] == "unknown"
