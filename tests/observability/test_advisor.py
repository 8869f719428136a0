"""The per-stage advisor (a pure function): on recorded scrapes of the local PD target, and on synthetic figures
for each diagnosis, it names the stage, shows its evidence and window, and prices the spec change it
recommends from the catalog."""
import datetime as dt

import pytest

from deployments.spec import spec_parse
from observability.advisor import StageMetrics, advise, stage_metrics_from
from observability.attainment import Attainment, TargetAttainment
from observability.promtext import parse_text
from observability.snapshot import EMPTY, snapshot_build, snapshot_increase
from tests.factories import local_spec_input, spec_input
from tests.observability.helpers import fixture, set_value

NOW = dt.datetime(2026, 12, 1, 12, tzinfo=dt.UTC)
PREFILL_REPLICA = "h6eptvmm"  # the fixture's prefill engine (its Serve replica is Prefill:tiny-llama)


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
                     prefill_p95_ms=80, kv_transfer_p95_ms=20)
    [d] = advise(spec=gpu_spec(), attainment=att(("ttft", 500, 60, 700.0)), metrics=m)
    assert d.kind == "prefill_short"
    rec = d.recommendation
    assert rec.summary == "prefill replicas 2 → 3, nodes 2 → 3"
    assert (rec.gpus_delta, rec.hourly_usd_delta) == (4, pytest.approx(10.493))
    assert rec.needs_approval == ("prefill.nodes", "prefill.replicas_min", "prefill.replicas_max")
    assert "= 500 ms, under the 500 ms target" in rec.expected
    assert rec.spec.prefill.replicas_max == 3 and rec.spec.decode == gpu_spec().decode


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
        assert "80 ms × 2/3 = 53 ms, still over" in d.recommendation.expected
    else:
        assert d.recommendation is None


def test_decode_running_its_full_batch_on_the_local_target_is_short():
    spec = spec_parse(local_spec_input(targets={"itl_p95_ms": 5}))
    m = StageMetrics("1h", 3600, kv_cache_peak={"decode": 0.1}, running_peak={"decode": 8})
    [d] = advise(spec=spec, attainment=att(("itl", 5, 10, 30.0)), metrics=m)
    assert d.kind == "decode_short" and figures(d)["decode running sequences (peak)"] == 8


def test_targets_met_with_low_use_over_a_long_window_give_back_a_replica_and_its_node():
    spec = gpu_spec(decode={"replicas_min": 1, "replicas_max": 2})
    quiet = StageMetrics("6h", 21600, kv_cache_peak={"decode": 0.1, "prefill": 0.5})
    [d] = advise(spec=spec, attainment=att(("ttft", 500, 99, 200.0), ("itl", 50, 100, 20.0), window="6h"),
                 metrics=quiet)
    assert (d.kind, d.stage, d.window) == ("can_shrink", "decode", "6h")
    rec = d.recommendation
    assert rec.summary == "decode replicas 1–2 → 1, nodes 2 → 1"
    assert (rec.gpus_delta, rec.hourly_usd_delta) == (-4, pytest.approx(-10.493))
    assert rec.needs_approval == ("decode.nodes",)
    short = StageMetrics("1h", 3600, kv_cache_peak={"decode": 0.1})
    assert advise(spec=spec, attainment=att(("ttft", 500, 99, 200.0)), metrics=short) == []


def test_nothing_to_say_without_targets_or_requests():
    m = StageMetrics("1h", 3600, kv_cache_peak={"decode": 0.99})
    assert advise(spec=gpu_spec(), attainment=att(), metrics=m) == []
    unmeasured = Attainment("1h", NOW, NOW, 0, (TargetAttainment("itl", 50, 0.95, 0, 0, None),))
    assert advise(spec=gpu_spec(), attainment=unmeasured, metrics=m) == []
