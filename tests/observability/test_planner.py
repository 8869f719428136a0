"""The planner against figures computed by hand for Llama-3-8B and Llama-3-70B configs on g6e and p5.

Hand arithmetic (GiB = 2^30 B, bf16 = 2 B):
- 8B: 32 layers, 8 KV heads × 128 → KV/token = 2×32×8×128×2 = 131,072 B. Params (embeddings 128,256×4,096 twice,
  32 × (q 4096² + k,v 4096×1024 each + o 4096² + MLP 3×4096×14,336 + 2 norms) + final norm) = 8,030,261,248
  → 16,060,522,496 B of weights.
- 70B: 80 layers, 8 KV heads × 128 → KV/token = 2×80×8×128×2 = 327,680 B; 70,553,706,496 params → 141,107,412,992 B.
- usable per GPU = GiB × 0.9: L40S 48 → 46,385,646,796.8 B; H100 80 → 77,309,411,328 B.
"""
import json

import pytest

from deployments.model_sources import SourceRoots
from deployments.spec import SpecError
from observability.planner import estimate_params, plan_for_spec
from tests.factories import local_spec_input, spec_input

LLAMA_8B = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "intermediate_size": 14336, "vocab_size": 128256, "torch_dtype": "bfloat16"}
LLAMA_70B = {"num_hidden_layers": 80, "hidden_size": 8192, "num_attention_heads": 64, "num_key_value_heads": 8,
             "head_dim": 128, "intermediate_size": 28672, "vocab_size": 128256, "torch_dtype": "bfloat16"}
G6E = {"instance_type": "g6e.12xlarge", "nodes": 1, "gpus_per_node": 4, "tensor_parallel_size": 4}
P5 = {"instance_type": "p5.48xlarge", "nodes": 1, "gpus_per_node": 8, "tensor_parallel_size": 8}


def test_params_from_config_match_the_published_counts():
    assert estimate_params(LLAMA_8B) == 8_030_261_248
    assert estimate_params(LLAMA_70B) == 70_553_706_496


def test_8b_on_g6e():
    p = plan_for_spec(spec_input(), LLAMA_8B)  # 2 req/s, 1,024 prompt, 256 output, max_model_len 8,192
    assert p["kv_bytes_per_token"] == 131_072
    pool = p["pools"]["decode"]
    assert pool["weights_bytes_per_gpu"] == 4_015_130_624  # 16,060,522,496 / 4
    # (46,385,646,796.8 − 4,015,130,624) × 4 / 131,072 = 1,293,045.5
    assert pool["kv_tokens_per_replica"] == 1_293_045
    assert pool["max_seqs_at_max_len"] == 157  # 1,293,045 / 8,192
    assert p["kv_bytes_per_request"] == 134_217_728  # 64 blocks × 16 × 131,072
    assert p["bandwidth"] == {"needed_gbps": 2.1475, "link_gbps": 100, "efa": True, "utilization": 0.0215}
    assert p["hourly_usd"] == 20.986  # 2 × 10.493
    # 2 req/s × 256 × 30 ms = 15.36 in flight × 1,280 = 19,661 tokens ≤ one node's 1,293,045
    assert p["single_node"]["kv_tokens_in_flight"] == 19_661
    assert p["verdict"] == "single_node_enough"
    assert any("KV per token = 2 (K and V) × 32 layers × 8 KV heads × 128" in line for line in p["arithmetic"])


def test_8b_on_p5():
    p = plan_for_spec(spec_input(prefill=P5, decode=P5), LLAMA_8B)
    pool = p["pools"]["prefill"]
    assert pool["weights_bytes_per_gpu"] == 2_007_565_312
    assert pool["kv_tokens_per_replica"] == 4_596_059  # (77,309,411,328 − 2,007,565,312) × 8 / 131,072
    assert pool["max_seqs_at_max_len"] == 561
    assert p["bandwidth"]["link_gbps"] == 3200 and p["bandwidth"]["utilization"] == pytest.approx(2.1475 / 3200,
                                                                                                   abs=1e-4)
    assert p["hourly_usd"] == 110.08
    assert p["verdict"] == "single_node_enough"


def test_70b_on_g6e_fits_but_is_throughput_and_link_bound():
    load = {"requests_per_second": 10, "mean_prompt_tokens": 2048, "mean_output_tokens": 512}
    p = plan_for_spec(spec_input(prefill=G6E, decode=G6E, expected_load=load), LLAMA_70B)
    assert p["kv_bytes_per_token"] == 327_680
    pool = p["pools"]["decode"]
    assert pool["weights_bytes_per_gpu"] == 35_276_853_248  # 141,107,412,992 / 4
    assert pool["kv_tokens_per_replica"] == 135_605  # (46,385,646,796.8 − 35,276,853,248) × 4 / 327,680
    assert pool["max_seqs_at_max_len"] == 16
    assert p["kv_bytes_per_request"] == 671_088_640  # 2,048 × 327,680
    assert p["bandwidth"]["needed_gbps"] == pytest.approx(53.6871, abs=1e-4)  # × 10 req/s × 8 bits
    # 10 × 512 × 0.03 = 153.6 in flight × 2,560 = 393,216 tokens > 135,605 on one node
    assert p["single_node"]["kv_tokens_in_flight"] == 393_216
    assert p["verdict"] == "pd_pays"
    assert any("54% of the 100 Gbit/s link" in w for w in p["warnings"])


def test_70b_on_g6e_at_tp2_does_not_fit():
    pool = dict(G6E, tensor_parallel_size=2)
    p = plan_for_spec(spec_input(prefill=pool, decode=pool), LLAMA_70B)
    assert p["pools"]["prefill"]["weights_bytes_per_gpu"] == 70_553_706_496  # 141 GB / 2 > 46.4 GB usable
    assert p["pools"]["prefill"]["fits"] is False
    assert p["verdict"] == "does_not_fit"


def test_70b_on_p5():
    load = {"requests_per_second": 30, "mean_prompt_tokens": 4000, "mean_output_tokens": 500}
    p = plan_for_spec(spec_input(prefill=P5, decode=P5, expected_load=load), LLAMA_70B)
    pool = p["pools"]["decode"]
    assert pool["weights_bytes_per_gpu"] == 17_638_426_624
    assert pool["kv_tokens_per_replica"] == 1_456_811  # (77,309,411,328 − 17,638,426,624) × 8 / 327,680
    assert pool["max_seqs_at_max_len"] == 177
    assert p["kv_bytes_per_request"] == 1_310_720_000  # 250 blocks × 16 × 327,680
    assert p["bandwidth"]["needed_gbps"] == pytest.approx(314.5728)  # 9.8% of 3,200
    assert p["single_node"]["kv_tokens_in_flight"] == 2_025_000  # 30 × 500 × 0.03 × 4,500 > 1,456,811
    assert p["verdict"] == "pd_pays" and p["warnings"] == []
    assert p["hourly_usd"] == 110.08


def test_no_efa_is_named():
    one = {"instance_type": "g6e.xlarge", "nodes": 1, "gpus_per_node": 1, "tensor_parallel_size": 1}
    p = plan_for_spec(spec_input(prefill=one, decode=one), LLAMA_8B)
    assert p["bandwidth"]["efa"] is False and p["bandwidth"]["link_gbps"] == 20
    assert p["pools"]["decode"]["kv_tokens_per_replica"] == 231_362
    assert any("No EFA" in w for w in p["warnings"])


@pytest.mark.parametrize(("prompt_tokens", "nixl_bytes"), [
    (20, 131_072), (130, 262_144), (260, 393_216), (390, 524_288), (520, 655_360)])
def test_tiny_model_matches_what_nixl_moved_on_the_cpu_engine(tmp_path, prompt_tokens, nixl_bytes):
    """What NIXL's own transfer telemetry (totalBytes) said per request on the local target, read in the decode
    engine: vLLM's CPU build uses 128-token blocks, 2 layer regions of 65,536 B per block. (Ray's exported
    `_sum` is a bucket midpoint, so it cannot give these figures; see test_pd_health's bucket check.)"""
    (tmp_path / "config.json").write_text(json.dumps({
        "num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 2,
        "head_dim": 64, "intermediate_size": 256, "vocab_size": 512, "torch_dtype": "bfloat16"}))
    spec = local_spec_input(model={"id": "tiny-llama", "source": str(tmp_path)},
                            engine={"max_model_len": 1024, "dtype": "bfloat16"},
                            expected_load={"requests_per_second": 1, "mean_prompt_tokens": prompt_tokens,
                                           "mean_output_tokens": 32})
    p = plan_for_spec(spec, None, source_roots=SourceRoots(paths=(str(tmp_path),)))
    assert p["model"]["facts_from"] == f"{tmp_path}/config.json"
    assert p["kv_bytes_per_token"] == 1024 and p["kv_block_tokens"] == 128
    assert p["kv_bytes_per_request"] == nixl_bytes
    assert p["bandwidth"]["link_gbps"] == 0 and p["hourly_usd"] == 0


def test_missing_facts_and_bad_spec_are_field_errors():
    with pytest.raises(SpecError) as e:
        plan_for_spec(spec_input(), None)  # an s3:// source cannot be read from here
    assert "model_facts" in e.value.errors
    with pytest.raises(SpecError) as e:
        plan_for_spec(spec_input(prefill={"instance_type": "nope"}), LLAMA_8B)
    assert "prefill.instance_type" in e.value.errors
