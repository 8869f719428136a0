"""The spec's rollout section (spec.rollout) is read as strictly as the rest: steps that rise to 100, each setting
within its bounds and of its type, no unknown key; and a spec that keeps the defaults stores no rollout section,
so specs stored before the section existed compare equal to the same spec read today."""
import pytest

from deployments.spec import RolloutSpec, SpecError, spec_load, spec_parse, spec_request_shape
from tests.factories import spec_input


def refused(rollout) -> dict:
    with pytest.raises(SpecError) as e:
        spec_parse(spec_input(rollout=rollout))
    return e.value.errors


@pytest.mark.parametrize("steps", [[10, 50, 100], [100], [1, 2, 3, 4, 5, 6, 7, 8, 9, 100], [25, 100]])
def test_steps_that_rise_and_end_at_100_are_taken_as_given(steps):
    assert spec_parse(spec_input(rollout={"steps": steps})).rollout.steps == tuple(steps)


@pytest.mark.parametrize("steps", [
    [50, 10, 100],  # falls
    [10, 10, 100],  # stands still
    [10, 50],  # never reaches 100
    [0, 100],  # a step that moves nothing
    [10, 150],  # past 100
])
def test_steps_that_do_not_rise_to_100_are_refused_naming_them(steps):
    assert refused({"steps": steps}) == {
        "rollout.steps": [f"Must rise step by step, each 1-100, and end at 100; got {steps}."]}


@pytest.mark.parametrize("steps,count", [([], 0), ([*range(1, 11), 100], 11)])
def test_no_steps_or_more_than_ten_are_refused(steps, count):
    assert refused({"steps": steps}) == {"rollout.steps": [f"Give 1 to 10 steps, got {count}."]}


@pytest.mark.parametrize("steps", ["10,50,100", 100, [10.0, 100], [True, 100], ["10", "100"], {"10": 100}])
def test_steps_that_are_not_a_list_of_whole_numbers_are_refused(steps):
    assert refused({"steps": steps}) == {"rollout.steps": [f"Must be a list of whole percentages, got {steps!r}."]}


@pytest.mark.parametrize("name,low,high", [("max_surge", 1, 16), ("step_seconds", 5, 3600)])
def test_whole_number_settings_are_refused_outside_their_bounds_and_as_other_types(name, low, high):
    assert spec_parse(spec_input(rollout={name: low})).rollout == RolloutSpec(**{name: low})
    assert spec_parse(spec_input(rollout={name: high})).rollout == RolloutSpec(**{name: high})
    for value in (low - 1, high + 1):
        assert refused({name: value}) == {f"rollout.{name}": [f"Must be between {low} and {high}, got {value}."]}
    for value in ("2", 2.5, True):
        assert list(refused({name: value})) == [f"rollout.{name}"]


@pytest.mark.parametrize("name,low,high", [("max_ttft_ratio", 1.0, 100.0), ("max_error_rate_increase", 0.0, 1.0),
                                           ("max_attainment_drop", 0.0, 1.0)])
def test_thresholds_are_refused_outside_their_bounds_and_as_other_types(name, low, high):
    assert spec_parse(spec_input(rollout={name: high})).rollout == RolloutSpec(**{name: high})
    for value in (low - 0.5, high + 0.5):
        assert refused({name: value}) == {f"rollout.{name}": [f"Must be between {low} and {high}, got {value}."]}
    for value in ("1.5", None, [1.5]):
        assert list(refused({name: value})) == [f"rollout.{name}"]


@pytest.mark.parametrize("rollout,path,message", [
    ({"step": [10, 100]}, "rollout.step", "unknown field; did you mean steps?"),
    ({"surge": 2}, "rollout.surge", "unknown field; did you mean max_surge?"),
    ({"max_surge": 1, "auto_rollback": False}, "rollout.auto_rollback", "unknown field"),
])
def test_an_unknown_key_in_the_rollout_section_is_refused_naming_its_path(rollout, path, message):
    assert refused(rollout) == {path: [message]}


@pytest.mark.parametrize("value", [[], 0, "", False, [10, 100]])
def test_a_rollout_section_that_is_not_an_object_is_refused(value):
    assert refused(value) == {"rollout": ["Must be an object."]}


@pytest.mark.parametrize("rollout", [None, {}, {"steps": [10, 50, 100], "max_surge": 1}])
def test_the_default_rollout_is_not_stored_so_a_spec_stored_without_it_compares_equal(rollout):
    before = spec_parse(spec_input())  # as a spec stored before spec.rollout existed
    spec = spec_parse(spec_input(rollout=rollout))
    assert "rollout" not in spec.to_dict()
    assert spec == before and spec.to_dict() == before.to_dict()


def test_a_rollout_of_its_own_is_stored_and_reads_back_the_same():
    spec = spec_parse(spec_input(rollout={"steps": [5, 25, 100], "max_surge": 2, "max_ttft_ratio": 1.2}))
    stored = spec.to_dict()
    assert stored["rollout"]["steps"] == [5, 25, 100]  # a JSON list, as the column stores it
    assert spec_load(stored) == spec and spec_load(stored).rollout.steps == (5, 25, 100)
    assert spec_parse(spec_request_shape(spec)) == spec
