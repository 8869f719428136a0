"""The PD health probe on scrapes with and without KV transfer."""
import pytest

from observability.pd_health import kv_reads, pd_health
from observability.promtext import parse_text
from observability.snapshot import snapshot_build
from tests.observability.helpers import fixture, set_value


def snap(text: str) -> dict:
    return snapshot_build(parse_text(text), "tiny-llama")


BEFORE = fixture("pd-before.prom")
AFTER = fixture("pd-after.prom")


def test_kv_from_prefill_is_healthy_with_measured_throughput():
    h = pd_health(snap(BEFORE), snap(AFTER), instance_type="cpu")
    assert h["verdict"] == "healthy" and h["ok"] is True
    assert h["external_kv_tokens"] == 395 and h["nixl_transfers"] == 9 and h["nixl_bytes"] == 737_280
    assert h["mean_transfer_bytes"] == 81_920
    assert h["throughput_gbps"] == pytest.approx(737_280 * 8 / 0.0725 / 1e9, abs=1e-4)
    assert "KV came from prefill" in h["messages"][0]


def test_decode_only_is_named():
    h = pd_health(snap(BEFORE), snap(fixture("decode-only-after.prom")), instance_type="g6e.12xlarge")
    assert h["verdict"] == "decode_only" and h["ok"] is False
    assert h["decode_recomputed_tokens"] == 395 and h["nixl_bytes"] == 0
    assert "decode-only" in h["messages"][0]


def test_no_traffic_between_scrapes():
    h = pd_health(snap(AFTER), snap(AFTER), instance_type="cpu")
    assert h["verdict"] == "no_traffic"


def with_failed_reads(text: str, n: int) -> str:
    """A scrape whose decode replica (zi5cs8z8 in the recorded scrapes) counted `n` failed NIXL reads."""
    return text + ('# TYPE ray_vllm_nixl_num_failed_transfers counter\n'
                   'ray_vllm_nixl_num_failed_transfers_total{ReplicaId="zi5cs8z8",engine="0",'
                   f'model_name="tiny-llama"}} {float(n)}\n')


def test_failed_transfers_are_named():
    h = pd_health(snap(BEFORE), snap(with_failed_reads(AFTER, 2)), instance_type="cpu")
    assert h["verdict"] == "transfer_failures" and h["failed_transfers"] == 2


def _big_slow_transfers() -> str:
    """9 transfers of 64 MiB taking 50 ms each: 10.7 Gbit/s."""
    text = set_value(AFTER, "ray_vllm_nixl_bytes_transferred_sum", 9 * 64 * 1024 * 1024)
    return set_value(text, "ray_vllm_nixl_xfer_time_seconds_sum", 9 * 0.05)


def test_efa_instance_at_tcp_speed_names_the_likely_cause():
    h = pd_health(snap(BEFORE), snap(_big_slow_transfers()), instance_type="p5.48xlarge")
    assert h["verdict"] == "slow_link"
    assert h["throughput_gbps"] == pytest.approx(10.7374, abs=1e-3)
    assert "LIBFABRIC" in h["messages"][0] and "vpc.amazonaws.com/efa" in h["messages"][0]


def test_small_transfers_are_not_judged_against_the_link():
    h = pd_health(snap(BEFORE), snap(AFTER), instance_type="p5.48xlarge")
    assert h["verdict"] == "healthy"
    assert any("too small to judge" in m for m in h["messages"])


def test_without_efa_slow_is_expected():
    h = pd_health(snap(BEFORE), snap(_big_slow_transfers()), instance_type="g6e.xlarge")
    assert h["verdict"] == "healthy"


def test_kv_reads_say_whether_the_decode_got_its_kv_between_two_scrapes():
    assert kv_reads(snap(BEFORE), snap(AFTER)) == {"state": "moving", "failed": 0.0, "transfers": 9}
    # Reads failed and none completed: what a decode holding a dead prefill's NIXL peer shows.
    assert kv_reads(snap(AFTER), snap(with_failed_reads(AFTER, 3))) == {"state": "failing", "failed": 3.0,
                                                                        "transfers": 0}
    assert kv_reads(snap(BEFORE), snap(with_failed_reads(AFTER, 3)))["state"] == "mixed"
    assert kv_reads(snap(AFTER), snap(AFTER))["state"] == "quiet"


def test_after_a_prefill_restart_the_decode_reads_from_the_new_prefill_on_vllm_0_32():
    """Recorded on the local PD stack (fixtures/cut_restart.py): between 20 s after SIGKILL of the prefill and the
    new prefill serving, the decode read KV 25 times and no read failed (vLLM replaced the stale NIXL peer)."""
    def real(name):
        return snapshot_build(parse_text(fixture(name)), "tiny-llama", application="tdm-1-tiny-llama")
    assert kv_reads(real("prefill-restart-before.prom"), real("prefill-restart-after.prom")) == {
        "state": "moving", "failed": 0.0, "transfers": 25}
