"""The per-stage advisor (a pure function): on recorded scrapes of the local PD target, and on synthetic figures
for each diagnosis, it names the stage, shows its evidence and window, prices the spec change it recommends from
the catalog, and says what the change is expected to give with the performance model's figures and ranges."""
import datetime as dt
import math

import pytest

from deployments.cost import ON_DEMAND
from deployments.spec import spec_parse
from observability.advisor import StageMetrics, advise as _advise, stage_metrics_from
from observability.advisor_expected import ModelBasis
from observability.model_facts import model_facts_parse
from observability.performance_model import decode_step_seconds, expected_range, prefill_seconds, profile_for
from observability.attainment import Attainment, TargetAttainment
from observability.promtext import parse_text
from observability.snapshot import EMPTY, snapshot_build, snapshot_increase
from tests.factories import local_spec_input, spec_input
from tests.observability.helpers import fixture, set_value
from tests.observability.test_planner import LLAMA_8B

NOW = dt.datetime(2026, 12, 1, 12, tzinfo=dt.UTC)
PREFILL_REPLICA = "h6eptvmm"  # the fixture's prefill engine (its Serve replica is Prefill:tiny-llama)
LLAMA = ModelBasis(model_facts_parse(LLAMA_8B))  # what a readable config.json gives the advisor
L40S = profile_for("L40S")  # g6e's GPU: the H200 profile scaled, not measured
HOUR_AT_2K = {"requests": 36_000, "prompt_tokens": 36_000 * 2048, "output_tokens": 36_000 * 256}  # 10 req/s


def advise(*, spec, attainment, metrics, model=LLAMA):
    return _advise(spec=spec, attainment=attainment, metrics=metrics, model=model, prices=ON_DEMAND)


def p95_wait_ms(rate: float, service_ms: float) -> float:
    """M/M/1's p95 wait written out here, as a person checking the advisor's line would."""
    s = service_ms / 1000
    return math.log(rate * s / 0.05) / (1 / s - rate) * 1000


def att(*targets, window="1h") -> Attainment:
    """Attainment with (measure, target ms, met of 100, observed p95 ms) per target, 95% required."""
    return Attainment(window, NOW - dt.timedelta(hours=1), NOW, 100, tuple(
        TargetAttainment(m, target, 0.95, 100, met, p95) for m, target, met, p95 in targets))


def recorded(after_text: str) -> StageMetrics:
    """The fixture's two real scrapes (9 requests through the local PD stack) as the window's second half."""
    before = snapshot_build(parse_text(fixture("pd-before.prom")), "tiny-llama")
    after = snapshot_build(parse_text(after_text), "tiny-llama")
    return stage_metrics_from(snapshot_increase(EMPTY, EMPTY), snapshot_increase(before, after), window="1h",
                              seconds=3600)


def gpu_spec(prefill=None, decode=None, instance="g6e.12xlarge", targets=None):
    pool = {"instance_type": instance, "nodes": 2, "gpus_per_node": 4, "tensor_parallel_size": 4,
            "replicas_min": 2, "replicas_max": 2}
    return spec_parse(spec_input(prefill={**pool, **(prefill or {})}, decode={**pool, **(decode or {})},
                                 targets=targets or {"ttft_p95_ms": 500, "itl_p95_ms": 50}))


def figures(d) -> dict:
    return {e.name: e.value for e in d.evidence}


def test_recorded_scrapes_with_a_tight_ttft_target_name_prefill_compute_with_its_figures():
    spec = spec_parse(local_spec_input(targets={"ttft_p95_ms": 1}))
    [d] = advise(spec=spec, attainment=att(("ttft", 1, 0, 450.0)), metrics=recorded(fixture("pd-after.prom")))
    assert (d.kind, d.stage, d.window, d.recommendation) == ("prefill_compute", "prefill", "1h", None)
    f = figures(d)
    assert f["prefill p95"] == pytest.approx(285, abs=1) and f["KV transfer p95"] == pytest.approx(38.75)
    assert f["TTFT p95 at the gateway"] == 450 and f["requests meeting it"] == 0
    assert "each request's own prefill" in d.message


def test_recorded_scrapes_with_requests_waiting_in_prefill_say_prefill_is_short():
    waiting = set_value(fixture("pd-after.prom"), "ray_vllm_num_requests_waiting", 3, PREFILL_REPLICA)
    spec = spec_parse(local_spec_input(targets={"ttft_p95_ms": 1}, prefill={
        "instance_type": "cpu", "nodes": 1, "gpus_per_node": 0, "tensor_parallel_size": 1, "replicas_min": 1,
        "replicas_max": 2}))
    [d] = advise(spec=spec, attainment=att(("ttft", 1, 0, 450.0)), metrics=recorded(waiting))
    assert d.kind == "prefill_short" and figures(d)["requests waiting in prefill (peak)"] == 3
    rec = d.recommendation
    assert rec.summary == "prefill replicas 1–2 → 2" and rec.needs_approval == () and rec.gpus_delta == 0


def test_a_growing_prefill_queue_recommends_a_priced_replica_that_needs_approval_beyond_the_bounds():
    m = StageMetrics("1h", 3600, queue_p95_ms=600, queue_p95_ms_early=50, queue_p95_ms_late=600,
                     prefill_p95_ms=80, kv_transfer_p95_ms=20, **HOUR_AT_2K)
    [d] = advise(spec=gpu_spec(), attainment=att(("ttft", 500, 60, 700.0)), metrics=m)
    assert d.kind == "prefill_short"
    rec = d.recommendation
    assert rec.summary == "prefill replicas 2 → 3, nodes 2 → 3"
    assert (rec.gpus_delta, rec.hourly_usd_delta) == (4, pytest.approx(10.493))
    assert rec.needs_approval == ("prefill.nodes", "prefill.replicas_min", "prefill.replicas_max")
    assert rec.spec.prefill.replicas_max == 3 and rec.spec.decode == gpu_spec().decode
    # Today's queue gives way to the model's: 10 req/s over 3 replicas, each prefill of 2,048 tokens on an L40S at
    # TP 4 as the scaled profile gives it, with the range its fit's error gives.
    prefill_ms = prefill_seconds(LLAMA.facts, "L40S", 2048, 4) * 1000
    after = 700 - 600 + p95_wait_ms(10 / 3, prefill_ms)
    low, high = (700 - 600 + p95_wait_ms(10 / 3, b * 1000) for b in expected_range(prefill_ms / 1000,
                                                                                     L40S.prefill_error))
    p = rec.prediction
    assert (p["measure"], p["target_ms"], p["meets"]) == ("ttft_p95", 500, after <= 500)
    assert p["expected_ms"] == pytest.approx(after, abs=0.05) and after > 100  # the wait counts
    assert p["range_ms"] == [pytest.approx(low, abs=0.05), pytest.approx(high, abs=0.05)] and low < after < high
    assert p["profile"]["kind"] == "scaled, not measured" and p["fleet"] is None
    assert rec.expected.startswith(f"expected TTFT p95 ≈ 700.0 ms − queue 600.0 ms + p95 wait at 3 replicas "
                                   f"{after - 100:,.1f} ms = {after:,.1f} ms (range {low:,.1f} ms–{high:,.1f} ms)")
    assert f"prefill {prefill_ms:,.1f} ms" in rec.expected and "(L40S, scaled, not measured profile)" in rec.expected


def test_a_replica_more_that_still_cannot_keep_up_says_how_many_would():
    m = StageMetrics("1h", 3600, queue_p95_ms=600, queue_p95_ms_early=50, queue_p95_ms_late=600,
                     requests=36_000 * 10, prompt_tokens=36_000 * 10 * 8192, output_tokens=0)  # 100 req/s of 8k
    [d] = advise(spec=gpu_spec(), attainment=att(("ttft", 500, 60, 700.0)), metrics=m)
    prefill_s = prefill_seconds(LLAMA.facts, "L40S", 8192, 4)
    needed = math.floor(100 * prefill_s) + 1
    assert needed > 3 and d.recommendation.prediction["keeps_up_from_replicas"] == needed
    assert d.recommendation.prediction["meets"] is False
    assert "prefill still falls behind at 3 replicas" in d.recommendation.expected


def test_room_under_the_approved_ceiling_is_used_first_without_new_nodes():
    m = StageMetrics("15m", 900, queue_p95_ms=300, queue_p95_ms_early=100, queue_p95_ms_late=300)
    spec = gpu_spec(prefill={"replicas_min": 1, "replicas_max": 2})
    [d] = advise(spec=spec, attainment=att(("ttft", 500, 60, 700.0)), metrics=m)
    rec = d.recommendation
    assert rec.changes == (("prefill.replicas_min", 1, 2),)
    assert rec.needs_approval == () and rec.gpus_delta == 0 and rec.hourly_usd_delta == 0


@pytest.mark.parametrize(("instance", "says"), [
    ("g6e.12xlarge", "LIBFABRIC"),
    ("g6e.xlarge", "no EFA on this path"),
])
def test_kv_transfer_taking_much_of_ttft_names_the_link(instance, says):
    spec = gpu_spec(prefill={"gpus_per_node": 1, "tensor_parallel_size": 1},
                    decode={"gpus_per_node": 1, "tensor_parallel_size": 1}, instance=instance)
    m = StageMetrics("1h", 3600, queue_p95_ms=5, queue_p95_ms_early=5, queue_p95_ms_late=5, kv_transfer_p95_ms=300)
    [d] = advise(spec=spec, attainment=att(("ttft", 500, 60, 700.0)), metrics=m)
    assert d.kind == "link" and d.stage == "kv_transfer" and says in d.message and d.recommendation is None
    assert "43%" in d.message


@pytest.mark.parametrize(("metrics", "kind"), [
    (StageMetrics("1h", 3600, kv_cache_peak={"decode": 0.93}, running_peak={"decode": 40}), "decode_short"),
    (StageMetrics("1h", 3600, waiting_peak={"decode": 2}), "decode_short"),
    (StageMetrics("1h", 3600, kv_cache_peak={"decode": 0.2}, running_peak={"decode": 3}), "decode_compute"),
])
def test_a_missed_itl_target_blames_a_full_decode_or_its_per_token_time(metrics, kind):
    [d] = advise(spec=gpu_spec(), attainment=att(("itl", 50, 70, 80.0)), metrics=metrics)
    assert d.kind == kind and d.stage == "decode"
    if kind == "decode_short":
        assert d.recommendation.summary == "decode replicas 2 → 3, nodes 2 → 3"
    else:
        assert d.recommendation is None


def test_a_full_decode_expects_one_model_step_at_the_batch_a_replica_more_leaves():
    m = StageMetrics("1h", 3600, kv_cache_peak={"decode": 0.93}, running_peak={"decode": 120}, **HOUR_AT_2K)
    [d] = advise(spec=gpu_spec(), attainment=att(("itl", 50, 70, 80.0)), metrics=m)
    # 120 running at peak over 3 replicas: 40 sequences each holding the 2,048-token prompt and half the 256 output.
    step_ms = decode_step_seconds(LLAMA.facts, "L40S", 40, 2048 + 128, 4) * 1000
    low, high = (b * 1000 for b in expected_range(step_ms / 1000, L40S.decode_error))
    p = d.recommendation.prediction
    assert p["measure"] == "itl_p95" and p["expected_ms"] == pytest.approx(step_ms, abs=0.05)
    assert p["range_ms"] == [pytest.approx(low, abs=0.05), pytest.approx(high, abs=0.05)]
    assert p["meets"] is (step_ms <= 50) and p["profile"]["gpu"] == "L40S"
    assert (f"= 40.0 sequences per replica of 2,176 tokens (mean prompt + half the output, the window's 36,000 "
            f"requests) at TP 4: {step_ms:,.1f} ms (range {low:,.1f} ms–{high:,.1f} ms)") in d.recommendation.expected
    today_ms = decode_step_seconds(LLAMA.facts, "L40S", 60, 2048 + 128, 4) * 1000
    assert f"at today's 60.0 per replica the model gives {today_ms:,.1f} ms, against 80.0 ms measured" \
        in d.recommendation.expected


def test_a_compute_bound_stage_gets_the_models_figure_at_twice_the_tensor_parallel_size():
    spec = gpu_spec(prefill={"tensor_parallel_size": 2}, decode={"tensor_parallel_size": 4})
    m = StageMetrics("1h", 3600, kv_cache_peak={"decode": 0.2}, running_peak={"decode": 6}, kv_transfer_p95_ms=5,
                     **HOUR_AT_2K)
    pre, dec = advise(spec=spec, attainment=att(("ttft", 20, 10, 100.0), ("itl", 5, 10, 30.0)), metrics=m)
    assert (pre.kind, dec.kind) == ("prefill_compute", "decode_compute")
    assert pre.prediction["at_tp"] == {
        str(tp): {"expected_ms": round(prefill_seconds(LLAMA.facts, "L40S", 2048, tp) * 1000, 1),
                  "range_ms": [round(b * 1000, 1) for b in expected_range(
                      prefill_seconds(LLAMA.facts, "L40S", 2048, tp), L40S.prefill_error)]} for tp in (2, 4)}
    # Decode at TP 4 already has every GPU of a g6e.12xlarge: no TP 8 figure.
    step = decode_step_seconds(LLAMA.facts, "L40S", 3, 2048 + 128, 4)
    assert dec.prediction["at_tp"] == {"4": {"expected_ms": round(step * 1000, 1), "range_ms": [
        round(b * 1000, 1) for b in expected_range(step, L40S.decode_error)]}}
    assert pre.expected.startswith("Expected prefill of 2,048 tokens (the window's 36,000 requests): the model gives")


def test_decode_running_its_full_batch_on_the_local_target_is_short():
    spec = spec_parse(local_spec_input(targets={"itl_p95_ms": 5}))
    m = StageMetrics("1h", 3600, kv_cache_peak={"decode": 0.1}, running_peak={"decode": 8})
    [d] = advise(spec=spec, attainment=att(("itl", 5, 10, 30.0)), metrics=m)
    assert d.kind == "decode_short" and figures(d)["decode running sequences (peak)"] == 8
    # The model has no figures for CPUs: it says so rather than guess.
    assert d.recommendation.prediction == {"unavailable": "cpu has no GPU the performance model has figures for "
                                                          "(it models GPUs only)"}
    assert d.recommendation.expected.startswith("expected ITL: unavailable, because cpu has no GPU")


def test_without_the_models_facts_every_expected_figure_is_unavailable_with_the_reason():
    why = "its weights are on S3 (s3://models/llama-3-8b), and Tandem reads a model's config.json only from a path"
    none = ModelBasis(None, why)
    grow = StageMetrics("1h", 3600, queue_p95_ms=600, queue_p95_ms_early=50, queue_p95_ms_late=600, **HOUR_AT_2K)
    compute = StageMetrics("1h", 3600, kv_cache_peak={"decode": 0.2}, kv_transfer_p95_ms=5, **HOUR_AT_2K)
    [short] = advise(spec=gpu_spec(), attainment=att(("ttft", 500, 60, 700.0)), metrics=grow, model=none)
    [pre, dec] = advise(spec=gpu_spec(), attainment=att(("ttft", 20, 10, 100.0), ("itl", 5, 10, 30.0)),
                        metrics=compute, model=none)
    assert short.recommendation.prediction == pre.prediction == dec.prediction == {"unavailable": why}
    assert short.recommendation.expected == f"expected TTFT: unavailable, because {why}"
    assert (pre.expected, dec.expected) == (f"Expected prefill: unavailable, because {why}",
                                            f"Expected decode step: unavailable, because {why}")


def test_targets_met_with_low_use_over_a_long_window_give_back_a_replica_and_its_node():
    spec = gpu_spec(decode={"replicas_min": 1, "replicas_max": 2})
    quiet = StageMetrics("6h", 21600, kv_cache_peak={"decode": 0.1, "prefill": 0.5}, running_peak={"decode": 6},
                         **HOUR_AT_2K)
    [d] = advise(spec=spec, attainment=att(("ttft", 500, 99, 200.0), ("itl", 50, 100, 20.0), window="6h"),
                 metrics=quiet)
    assert (d.kind, d.stage, d.window) == ("can_shrink", "decode", "6h")
    rec = d.recommendation
    assert rec.summary == "decode replicas 1–2 → 1, nodes 2 → 1"
    # The peak's 6 sequences on the one replica left: ITL stays under its 50 ms target by the model.
    step_ms = decode_step_seconds(LLAMA.facts, "L40S", 6, 2048 + 128, 4) * 1000
    assert rec.prediction["expected_ms"] == pytest.approx(step_ms, abs=0.05) and rec.prediction["meets"] is True
    assert rec.expected.startswith("expected: decode KV cache peak ≈ 10% × 2/1 = 20%; expected ITL p95 ≈ one decode "
                                   "step at 6 running (the window's peak) / 1 replica = 6.0 sequences per replica")
    assert (rec.gpus_delta, rec.hourly_usd_delta) == (-4, pytest.approx(-10.493))
    assert rec.needs_approval == ("decode.nodes",)
    short = StageMetrics("1h", 3600, kv_cache_peak={"decode": 0.1})
    assert advise(spec=spec, attainment=att(("ttft", 500, 99, 200.0)), metrics=short) == []


def test_nothing_to_say_without_targets_or_requests():
    m = StageMetrics("1h", 3600, kv_cache_peak={"decode": 0.99})
    assert advise(spec=gpu_spec(), attainment=att(), metrics=m) == []
    unmeasured = Attainment("1h", NOW, NOW, 0, (TargetAttainment("itl", 50, 0.95, 0, 0, None),))
    assert advise(spec=gpu_spec(), attainment=unmeasured, metrics=m) == []
