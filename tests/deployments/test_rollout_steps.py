"""Where a rollout stands on each traffic step, for every state it can be in: what the API, the portal and
tandemctl show (deployments.rollout_steps)."""
import pytest

from deployments.models import Rollout
from deployments.rollout_steps import rollout_steps

STEPS = (10, 50, 100)
S = Rollout.State


@pytest.mark.parametrize("state,step,states", [
    (S.STARTING, 0, ["waiting", "waiting", "waiting"]),  # the new generation is coming up: no traffic yet
    (S.CHECKING, 0, ["waiting", "waiting", "waiting"]),
    (S.SHIFTING, 0, ["current", "waiting", "waiting"]),
    (S.SHIFTING, 2, ["done", "done", "current"]),
    (S.DONE, 2, ["done", "done", "done"]),
    (S.ROLLING_BACK, 1, ["done", "stopped", "skipped"]),
    (S.ROLLED_BACK, 1, ["done", "stopped", "skipped"]),
    (S.ABORTED, 0, ["stopped", "skipped", "skipped"]),
])
def test_each_state_of_a_side_by_side_rollout(state, step, states):
    r = Rollout(mode=Rollout.Mode.SIDE_BY_SIDE, state=state, step=step)
    shown = rollout_steps(r, STEPS)
    assert [s.weight for s in shown] == list(STEPS) and [s.state for s in shown] == states


@pytest.mark.parametrize("state", list(S))
def test_a_rollout_in_place_has_no_traffic_steps(state):
    assert rollout_steps(Rollout(mode=Rollout.Mode.IN_PLACE, state=state), STEPS) == []
