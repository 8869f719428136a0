"""The replica arithmetic of a side-by-side rollout: never more than one surge per pool, never a second full set,
never less capacity than the spec's, and the gateway's share follows the replicas that run."""
from dataclasses import replace

import pytest

from deployments.spec import RolloutSpec, spec_load
from tests.workers.conftest import gpu_spec
from workers.rollout_plan import Sizes, effective_weight, next_sizes, surge_of, wanted_replicas


def _spec(replicas: int, *, surge: int = 1, source: str = "s3://models/a"):
    spec = spec_load(gpu_spec(model={"id": "m", "source": source}))
    pools = {stage: replace(spec.pool(stage), replicas_min=replicas, replicas_max=replicas * 2)
             for stage in ("prefill", "decode")}
    return replace(spec, **pools, rollout=RolloutSpec(max_surge=surge))


def _walk(old, new, steps):
    """Every size the plan passes through, a pass at a time, taking each step once its sizes settle."""
    full = wanted_replicas(old)
    sizes = Sizes(old=dict(full), new={s: 0 for s in full})
    seen, weight = [sizes], 0
    for step in (0, *steps):
        for _ in range(50):
            moved = weight == step
            after = next_sizes(sizes, weight=step, old=old, new=new, moved=moved)
            weight = effective_weight(step, after, new=new)
            if after == sizes and moved:
                break
            if after != sizes:
                sizes = after
                seen.append(sizes)
    return seen


@pytest.mark.parametrize("replicas", [1, 2, 4, 7])
def test_a_rollout_never_runs_more_than_one_extra_replica_per_pool_and_never_less_than_the_spec(replicas):
    old, new = _spec(replicas), _spec(replicas, source="s3://models/b")
    seen = _walk(old, new, new.rollout.steps)
    for sizes in seen:
        for pool in ("prefill", "decode"):
            assert sizes.old[pool] + sizes.new[pool] <= replicas + 1, sizes
            assert sizes.old[pool] + sizes.new[pool] >= replicas, sizes  # maxUnavailable 0
            assert sizes.old[pool] >= 1, sizes  # the last old replicas go with their application
    assert seen[-1].new == wanted_replicas(new)
    assert max(surge_of(s, old=old, new=new)["prefill"] for s in seen) == 1


def test_four_replicas_per_pool_move_one_at_a_time_as_a_rolling_update_does():
    old, new = _spec(4), _spec(4, source="s3://models/b")
    pairs = [(s.old["prefill"], s.new["prefill"]) for s in _walk(old, new, (10, 50, 100))]
    assert pairs == [(4, 0), (4, 1), (3, 1), (3, 2), (2, 2), (2, 3), (1, 3), (1, 4)]


def test_a_larger_surge_moves_faster_within_its_bound():
    old, new = _spec(4, surge=2), _spec(4, surge=2, source="s3://models/b")
    seen = _walk(old, new, (100,))
    assert max(s.old["decode"] + s.new["decode"] for s in seen) == 6


def test_the_gateway_share_follows_the_replicas_until_the_step_has_them():
    new = _spec(4, source="s3://models/b")
    assert effective_weight(50, Sizes(old={"prefill": 3, "decode": 3}, new={"prefill": 1, "decode": 1}), new=new) == 25
    assert effective_weight(50, Sizes(old={"prefill": 2, "decode": 2}, new={"prefill": 2, "decode": 2}), new=new) == 50
    assert effective_weight(10, Sizes(old={"prefill": 4, "decode": 4}, new={"prefill": 1, "decode": 1}), new=new) == 10


def test_rolling_back_grows_the_old_generation_back_before_the_new_one_goes():
    old, new = _spec(4), _spec(4, source="s3://models/b")
    sizes = Sizes(old={"prefill": 2, "decode": 2}, new={"prefill": 2, "decode": 2})
    seen = [sizes]
    for _ in range(10):
        sizes = next_sizes(sizes, weight=0, old=old, new=new, moved=True, rolling_back=True)
        seen.append(sizes)
    assert [(s.old["prefill"], s.new["prefill"]) for s in seen[:6]] == [(2, 2), (3, 2), (3, 1), (4, 1), (4, 0),
                                                                          (4, 0)]
    assert all(s.old["prefill"] + s.new["prefill"] <= 5 for s in seen)
