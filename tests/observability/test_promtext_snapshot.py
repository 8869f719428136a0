"""Parsing real Ray 2.60 scrapes and splitting vLLM series by PD stage, with reset-aware increases."""
import pytest

from observability.promtext import parse_prometheus_api, parse_text
from observability.snapshot import EMPTY, serve_name, snapshot_build, snapshot_increase
from tests.observability.helpers import fixture, set_value


def test_raw_lines_keep_every_label():
    samples = parse_text(fixture("raw-excerpt.prom"))
    buckets = [s for s in samples if s.name == "ray_vllm_nixl_bytes_transferred_bucket"]
    assert len(buckets) == 13
    assert buckets[0].labels["ReplicaId"] == "zi5cs8z8" and buckets[0].labels["model_name"] == "tiny-llama"
    total = next(s for s in samples if s.name == "ray_vllm_nixl_bytes_transferred_sum")
    assert total.value == 737280.0
    healthy = {s.labels["deployment"]: s.labels["replica"] for s in samples
               if s.name == "ray_serve_deployment_replica_healthy"}
    assert healthy == {"OpenAiIngress": "2qdg0lrf", "Prefill:tiny-llama": "h6eptvmm", "Decode:tiny-llama": "zi5cs8z8"}


def test_replica_map_splits_vllm_series_by_stage():
    snap = snapshot_build(parse_text(fixture("pd-after.prom")), "tiny-llama")
    inc = snapshot_increase(EMPTY, snap)
    # 9 requests went through each stage; NIXL metrics exist only on decode, which pulls the KV.
    assert inc.hist[("ttft", "prefill")].count == 9
    assert inc.hist[("ttft", "decode")].count == 9
    assert inc.hist[("kv_bytes", "decode")].sum == 737280.0
    assert ("kv_bytes", "prefill") not in inc.hist
    assert inc.hist[("kv_transfer", "decode")].sum == pytest.approx(72.5)  # 0.0725 s in ms
    assert inc.hist[("serve", "ingress")].count == 9  # 1 /v1/models + 1 completions + 7 chat
    assert inc.counter[("prompt_tokens:external_kv_transfer", "decode")] == 395
    assert inc.counter[("prompt_tokens:local_compute", "prefill")] == 395
    assert inc.gauge[("kv_cache_usage", "decode")] == 0.0


def test_other_models_on_the_same_cluster_are_ignored():
    snap = snapshot_build(parse_text(fixture("pd-after.prom")), "another-model")
    assert snap == {"hist": {}, "counter": {}, "gauge": {}}


def test_increase_between_scrapes_and_reset_awareness():
    before = snapshot_build(parse_text(fixture("pd-before.prom")), "tiny-llama")
    after = snapshot_build(parse_text(fixture("pd-after.prom")), "tiny-llama")
    inc = snapshot_increase(before, after)
    assert inc.hist[("itl", "decode")].count == 247
    # The decode replica restarted: its counts fall, so the later value is all new (not negative).
    restarted = set_value(fixture("pd-after.prom"), "ray_vllm_prompt_tokens_by_source_total", 5.0)
    again = snapshot_increase(after, snapshot_build(parse_text(restarted), "tiny-llama"))
    assert again.counter[("prompt_tokens:external_kv_transfer", "decode")] == 5.0
    # A histogram whose count falls restarts too.
    text = set_value(fixture("pd-before.prom"), "ray_vllm_time_to_first_token_seconds_count", 2.0)
    text = set_value(text, "ray_vllm_time_to_first_token_seconds_bucket", 2.0, 'le="+Inf"')
    text = set_value(text, "ray_vllm_time_to_first_token_seconds_bucket", 2.0, 'le="1.0"')
    inc = snapshot_increase(after, snapshot_build(parse_text(text), "tiny-llama"))
    assert inc.hist[("ttft", "prefill")].count == 2


def test_prometheus_api_answer_gives_the_same_samples():
    text_samples = parse_text(fixture("raw-excerpt.prom"))
    body = {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"__name__": s.name, **s.labels}, "value": [1764427000.0, str(s.value)]} for s in text_samples]}}
    assert parse_prometheus_api(body) == text_samples
    with pytest.raises(ValueError):
        parse_prometheus_api({"status": "error", "error": "bad query"})


def test_serve_names_of_model_ids():
    assert serve_name("meta-llama/Llama-3.1-8B") == "meta-llama--Llama-3_1-8B"


def test_two_teams_serving_one_model_id_on_one_cluster_each_read_only_their_own_application():
    """On a shared Ray cluster team B's application serves the same model id; its series must not count for A."""
    ours = fixture("pd-after.prom")
    theirs = ours.replace('application="default"', 'application="tdm-9-chat"')
    for replica in ("2qdg0lrf", "h6eptvmm", "zi5cs8z8"):  # other replicas, so other ReplicaIds
        theirs = theirs.replace(replica, replica[::-1])
    both = parse_text(ours + theirs)
    alone = snapshot_increase(EMPTY, snapshot_build(parse_text(ours), "tiny-llama", application="default"))
    inc = snapshot_increase(EMPTY, snapshot_build(both, "tiny-llama", application="default"))
    assert inc.counter == alone.counter and inc.counter[("prompt_tokens:external_kv_transfer", "decode")] == 395
    assert inc.hist[("ttft", "decode")].count == 9 and inc.hist[("serve", "ingress")].count == 9
    mixed = snapshot_increase(EMPTY, snapshot_build(both, "tiny-llama"))
    assert mixed.counter[("prompt_tokens:external_kv_transfer", "decode")] == 790  # what A saw before
