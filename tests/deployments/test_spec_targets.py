"""Latency targets in the spec: optional (absent reads and stores as before), checked with field-level messages,
and free to change on a running deployment (they change what is judged, not what runs)."""
import json

import pytest

from deployments.spec import SpecError, TargetsSpec, spec_load, spec_parse
from deployments.spec_diff import changes_needing_approval, spec_changes
from tests.factories import spec_input


def test_no_targets_stores_no_key_and_targets_round_trip():
    plain = spec_parse(spec_input())
    assert plain.targets is None and "targets" not in plain.to_dict()
    typed = spec_parse(spec_input(targets={"ttft_p95_ms": 300, "itl_p95_ms": 40}))
    assert typed.targets == TargetsSpec(ttft_p95_ms=300.0, itl_p95_ms=40.0, share=0.95)
    assert spec_load(json.loads(json.dumps(typed.to_dict()))) == typed


@pytest.mark.parametrize(("targets", "path", "says"), [
    ({"ttft_p95_ms": 0.5}, "targets.ttft_p95_ms", "between 1 and 600000"),
    ({"itl_p95_ms": "fast"}, "targets.itl_p95_ms", "number of milliseconds"),
    ({"ttft_p95_ms": 200, "share": 1.5}, "targets.share", "between 0.5 and 1.0"),
    ({"share": 0.9}, "targets", "Give ttft_p95_ms or itl_p95_ms"),
    ("tight", "targets", "Must be an object"),
])
def test_bad_targets_name_the_field(targets, path, says):
    with pytest.raises(SpecError) as e:
        spec_parse(spec_input(targets=targets))
    assert says in " ".join(e.value.errors[path])


def test_setting_or_changing_targets_on_a_running_deployment_needs_no_approval():
    old = spec_parse(spec_input())
    new = spec_parse(spec_input(targets={"ttft_p95_ms": 250}))
    assert changes_needing_approval(old, new) == []
    assert [(c.field, c.old, c.new) for c in spec_changes(old, new)][0] == ("targets.ttft_p95_ms", None, 250.0)
    both = spec_parse(spec_input(targets={"ttft_p95_ms": 250}, prefill={
        "instance_type": "g6e.12xlarge", "nodes": 2, "gpus_per_node": 4, "tensor_parallel_size": 4}))
    assert changes_needing_approval(new, both) == ["prefill.nodes"]
