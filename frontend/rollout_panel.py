"""What the deployment page shows of its rollouts: the one in progress and the last finished one, each step with
its state, replicas old and new per pool, peak surge and each judged step's evidence."""
import json

from deployments import selectors
from deployments.models import Rollout
from deployments.permissions import deployment_may_decide
from deployments.rollout_steps import rollout_steps
from deployments.spec import STAGES


def _view(r: Rollout) -> dict:
    """What the panel shows of one rollout: its steps' states, replicas old/new per pool, and each logged step's
    evidence as its fields."""
    return {
        "r": r, "steps": rollout_steps(r),
        "pools": [{"name": stage, "old": r.replicas.get("old", {}).get(stage, 0),
                   "new": r.replicas.get("new", {}).get(stage, 0), "peak_surge": r.peak_surge.get(stage, 0)}
                  for stage in STAGES],
        "log": [[(key, value if isinstance(value, str) else json.dumps(value)) for key, value in entry.items()]
                for entry in r.steps_log],
    }


def rollouts_context(*, user, deployment) -> dict:
    """The rollout in progress and the last finished one (either may be None), and whether this user may pause,
    resume or abort (the services' own rule)."""
    d = deployment
    active = selectors.rollout_active_of(d)
    last = selectors.rollouts_of(d).exclude(state__in=Rollout.ACTIVE).first()
    return {"rollout": _view(active) if active else None, "last_rollout": _view(last) if last else None,
            "can_steer": active is not None and deployment_may_decide(user=user, deployment=d)}
