"""The arithmetic of a side-by-side rollout: how many replicas each generation runs per pool, and what share of
requests the new one takes. Pure functions; workers.rollout applies what they say.

The rule is a rolling update's with maxUnavailable 0: the new generation grows while the pool has room under
its cap (the larger of the two specs' replicas, plus `max_surge`), and the old gives a replica back only to make
that room, or once the traffic it serves has moved. One replica per pool per pass, so every move is observed
before the next.
"""
import math
from dataclasses import dataclass

from deployments.spec import STAGES, DeploymentSpec


@dataclass(frozen=True)
class Sizes:
    """Replicas per pool of the old and the new generation."""

    old: dict[str, int]
    new: dict[str, int]

    def as_dict(self) -> dict:
        return {"old": dict(self.old), "new": dict(self.new)}


def wanted_replicas(spec: DeploymentSpec) -> dict[str, int]:
    """The replicas a generation runs when it serves everything alone: its spec's minimum per pool (what was
    approved and is paid for; autoscaling above it resumes once the rollout is done)."""
    return {stage: spec.pool(stage).replicas_min for stage in STAGES}


def caps(old: DeploymentSpec, new: DeploymentSpec) -> dict[str, int]:
    """The most replicas per pool while both generations run: never a second full set."""
    a, b = wanted_replicas(old), wanted_replicas(new)
    return {stage: max(a[stage], b[stage]) + new.rollout.max_surge for stage in STAGES}


def new_target(weight: int, *, full: int, surge: int) -> int:
    """The new generation's replicas at `weight` percent: its share of `full`, and from the start at least the
    surge (it comes up beside the old before any traffic)."""
    return min(full, max(min(surge, full), math.ceil(weight * full / 100)))


def old_target(weight: int, *, full: int) -> int:
    """The old generation's replicas at `weight` percent to the new: its share, at least one until all moved."""
    return 0 if weight >= 100 else max(1, math.ceil((100 - weight) * full / 100))


def next_sizes(now: Sizes, *, weight: int, old: DeploymentSpec, new: DeploymentSpec, moved: bool,
               rolling_back: bool = False) -> Sizes:
    """One move per pool towards the sizes `weight` asks for. `moved`: the gateway already sends `weight` to the
    new generation (the old gives replicas back beyond making room only then). Rolling back, the new generation
    goes and the old grows back to its full size, again within the cap."""
    full_old, full_new, cap = wanted_replicas(old), wanted_replicas(new), caps(old, new)
    out_old, out_new = dict(now.old), dict(now.new)
    for stage in STAGES:
        o, n = out_old[stage], out_new[stage]
        if rolling_back:
            want_o, want_n = full_old[stage], 0
        else:
            want_n = new_target(weight, full=full_new[stage], surge=new.rollout.max_surge)
            want_o = old_target(weight, full=full_old[stage])
        if n < want_n and o + n < cap[stage]:
            n += 1
        elif o < want_o and o + n < cap[stage]:
            o += 1
        elif n < want_n and o > want_o:
            o -= 1  # room for the new one: total capacity stays at the old full size
        elif n > want_n:
            n -= 1
        elif o > max(want_o, 1) and moved:
            o -= 1  # the last old replicas go with their application, once the final step is judged
        out_old[stage], out_new[stage] = o, n
    return Sizes(old=out_old, new=out_new)


def effective_weight(step_weight: int, sizes: Sizes, *, new: DeploymentSpec) -> int:
    """The share the gateway sends the new generation now: the step's, once the new generation has the replicas
    the step asks for; until then no more than its share of the replicas running (each replica's load stays as
    it was)."""
    full_new = wanted_replicas(new)
    if all(sizes.new[s] >= new_target(step_weight, full=full_new[s], surge=new.rollout.max_surge) for s in STAGES):
        return step_weight
    share = min(100 * sizes.new[s] // max(1, sizes.new[s] + sizes.old[s]) for s in STAGES)
    return min(step_weight, share)


def surge_of(sizes: Sizes, *, old: DeploymentSpec, new: DeploymentSpec) -> dict[str, int]:
    """Replicas per pool beyond the larger of the two generations' full sizes."""
    a, b = wanted_replicas(old), wanted_replicas(new)
    return {s: max(0, sizes.old[s] + sizes.new[s] - max(a[s], b[s])) for s in STAGES}
