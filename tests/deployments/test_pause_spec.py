"""The spec's optional `pause` section and the clusters' `prices`: what is accepted, what is refused and why."""
import pytest

from deployments.cluster_config import cluster_config_errors
from deployments.spec import SpecError, spec_load, spec_parse
from deployments.spec_diff import changes_needing_approval
from tests.factories import spec_input


def test_absent_means_off_and_is_not_stored_so_older_specs_compare_equal():
    spec = spec_parse(spec_input())
    assert (spec.pause.idle_minutes, spec.pause.wake_on_request) == (None, False)
    assert "pause" not in spec.to_dict() and spec_load(spec.to_dict()) == spec
    on = spec_parse(spec_input(pause={"idle_minutes": 30, "wake_on_request": True}))
    assert on.to_dict()["pause"] == {"idle_minutes": 30, "wake_on_request": True} and spec_load(on.to_dict()) == on
    assert changes_needing_approval(spec, on) == []  # pausing only ever lowers what it costs


@pytest.mark.parametrize(("pause", "field", "words"), [
    ({"idle_minutes": 2}, "pause.idle_minutes", "between 5 and 43200"),
    ({"idle_minutes": "soon"}, "pause.idle_minutes", "whole number of minutes"),
    ({"wake_on_request": "yes"}, "pause.wake_on_request", "true or false"),
    ("always", "pause", "Must be an object"),
])
def test_bad_pause_settings_name_the_field(pause, field, words):
    with pytest.raises(SpecError) as e:
        spec_parse(spec_input(pause=pause))
    assert words in " ".join(e.value.errors[field])


def test_a_cluster_may_set_its_own_prices_per_known_instance_type():
    base = {"dashboard_url": "http://127.0.0.1:8265"}
    assert cluster_config_errors("ray", {**base, "prices": {"p5.48xlarge": 31.5, "cpu": 0}}) == []
    errors = cluster_config_errors("ray", {**base, "prices": {"p9.huge": 1, "g6e.xlarge": -1}})
    assert any("unknown instance type 'p9.huge'" in e for e in errors)
    assert any("g6e.xlarge must be USD per node-hour" in e for e in errors)
    assert cluster_config_errors("eks", {"region": "us-west-2", "cluster_name": "x", "prices": [1],
                                         "subnet_ids": ["subnet-0123456789abcdef0"],
                                         "node_role_arn": "arn:aws:iam::123456789012:role/nodes"}) == [
        "prices: an object of instance type → USD per node-hour, e.g. {\"p5.48xlarge\": 31.5}."]
