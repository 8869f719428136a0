"""Which fabric KV moves over, from the NIXL backends the engines' logs name and the measured transfer rate.

The log lines are NIXL's own, as its agent prints them when it creates a backend or skips one whose plugin did not
load (ai-dynamo/nixl src/api/python/_api.py, `create_backend` and `nixl_agent.__init__`); the surrounding lines are
what a Ray worker's log holds around them. No recording of an EFA run exists here (no EFA machine): see the report.
"""
import pytest

from deployments.spec import SpecError, spec_load, spec_parse
from deployments.serve_config import serve_config_build
from observability.fabric import kv_fabric, nixl_backends
from tests.factories import spec_input

UCX_ONLY = ("(ServeReplica:t1:Prefill:llama pid=412) INFO nixl_connector.py: Initializing NIXL wrapper\n"
            "Backend UCX was instantiated\nInitialized NIXL agent: 0f6c7c56-5f0e-4a36-9d0e-7a1de3c1c9a2\n")
LIBFABRIC = "Backend LIBFABRIC was instantiated\nInitialized NIXL agent: 7b0c\n"
LIBFABRIC_MISSING = ("Skipping backend registration LIBFABRIC due to the missing plugin.\n"
                     "Initialized NIXL agent: 2d1e\n")
HEALTHY = {"verdict": "healthy", "ok": True, "messages": [], "throughput_gbps": 812.5}


def _spec(itype="p5.48xlarge", gpus=8, **engine):
    pool = {"instance_type": itype, "nodes": 1, "gpus_per_node": gpus, "tensor_parallel_size": gpus}
    return spec_parse(spec_input(prefill=pool, decode=pool, engine={"max_model_len": 8192, **engine}),
                      target_kind="eks")


def test_the_backends_an_engine_instantiated_or_skipped():
    assert nixl_backends(UCX_ONLY) == {"instantiated": ["UCX"], "missing": []}
    assert nixl_backends(LIBFABRIC_MISSING + UCX_ONLY) == {"instantiated": ["UCX"], "missing": ["LIBFABRIC"]}


def test_efa_confirmed_when_both_stages_run_libfabric():
    verdict = kv_fabric(spec=_spec(), logs={"prefill": LIBFABRIC, "decode": LIBFABRIC}, health=HEALTHY)
    assert verdict["ok"] is True and "at about 812.5 Gbit/s" in verdict["messages"][0]


@pytest.mark.parametrize("logs, health, says", [
    ({"prefill": UCX_ONLY, "decode": LIBFABRIC}, HEALTHY, "prefill: NIXL instantiated UCX, not LIBFABRIC: KV moves "
                                                         "over TCP"),
    ({"prefill": LIBFABRIC, "decode": LIBFABRIC_MISSING}, HEALTHY, "decode: NIXL's LIBFABRIC backend failed to load"),
    (None, {"verdict": "slow_link", "messages": ["KV moved at 9.4 Gbit/s on p5.48xlarge, whose EFA link gives 3200 "
                                                 "Gbit/s: TCP speed."]}, "KV moved at 9.4 Gbit/s"),
])
def test_kv_off_efa_on_efa_types_fails_saying_why_and_the_fix(logs, health, says):
    verdict = kv_fabric(spec=_spec(), logs=logs, health=health)
    assert verdict["ok"] is False and says in verdict["messages"][0]
    assert "engine.kv_transport: tcp" in verdict["messages"][0]


def test_no_evidence_either_way_is_unconfirmed_not_passed():
    assert kv_fabric(spec=_spec(), logs=None, health={"verdict": "no_traffic", "messages": []})["ok"] is None


def test_a_spec_that_opts_in_to_tcp_is_not_held_to_efa_and_asks_nixl_for_its_default():
    spec = _spec(kv_transport="tcp")
    assert kv_fabric(spec=spec, logs={"prefill": UCX_ONLY, "decode": UCX_ONLY}, health=HEALTHY)["ok"] is True
    app = serve_config_build(app_name="llama", spec=spec, target_kind="eks")["applications"][0]["args"]
    assert "kv_connector_extra_config" not in app["prefill_config"]["engine_kwargs"]["kv_transfer_config"]
    efa = serve_config_build(app_name="llama", spec=_spec(), target_kind="eks")["applications"][0]["args"]
    assert efa["prefill_config"]["engine_kwargs"]["kv_transfer_config"]["kv_connector_extra_config"] == \
        {"backends": ["LIBFABRIC"]}


def test_instance_types_without_efa_are_not_held_to_it():
    assert kv_fabric(spec=_spec("g6e.xlarge", gpus=1), logs=None, health=HEALTHY)["asked"] == "tcp"


def test_kv_transport_is_stored_only_when_it_is_not_the_default_and_checked():
    assert "kv_transport" not in _spec().to_dict()["engine"]
    assert spec_load(_spec(kv_transport="tcp").to_dict()).engine.kv_transport == "tcp"
    with pytest.raises(SpecError) as e:
        _spec(kv_transport="rdma")
    assert e.value.errors["engine.kv_transport"] == ["Must be one of efa, tcp; got 'rdma'."]
