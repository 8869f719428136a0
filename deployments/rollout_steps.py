"""Where a rollout stands on each of its traffic steps, as the API, the portal and tandemctl show it.

`Rollout.step` is the index, in `Rollout.step_weights` (the spec's steps as it began), of the step the rollout is
on: the steps before it were reached and judged, the one at it takes `Rollout.weight` percent of requests now (while the
rollout shifts) or is where it stopped (rolled back or aborted).
"""
from dataclasses import dataclass

from deployments.models import Rollout


class StepState:
    DONE = "done"  # reached and judged
    CURRENT = "current"  # traffic is on this step now
    WAITING = "waiting"  # not reached yet
    STOPPED = "stopped"  # the rollout was rolled back or aborted on this step
    SKIPPED = "skipped"  # never reached: the rollout ended before it

    choices = (DONE, CURRENT, WAITING, STOPPED, SKIPPED)


@dataclass(frozen=True)
class Step:
    weight: int  # the new generation's share of requests at this step, in percent
    state: str


def rollout_steps(rollout: Rollout, steps=None) -> list[Step]:
    """Each step of `steps` with its state; none for a rollout in place (replica by replica, no traffic steps)."""
    if rollout.mode == Rollout.Mode.IN_PLACE:
        return []
    steps = rollout.step_weights if steps is None else steps
    s = Rollout.State
    if rollout.state == s.DONE:
        return [Step(w, StepState.DONE) for w in steps]
    if rollout.state in (s.STARTING, s.CHECKING):
        return [Step(w, StepState.WAITING) for w in steps]
    on, after = ((StepState.CURRENT, StepState.WAITING) if rollout.state == s.SHIFTING else
                 (StepState.STOPPED, StepState.SKIPPED))
    return [Step(w, StepState.DONE if i < rollout.step else on if i == rollout.step else after)
            for i, w in enumerate(steps)]
