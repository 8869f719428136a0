"""Kubernetes-style status conditions, written through one pure helper (as KubeRay's setCondition)."""
from datetime import datetime

CONDITION_TYPES = ("Approved", "NodePoolsReady", "Applied", "ServeRunning", "EndpointReady", "ConformancePassed")


def condition_set(conditions: list[dict], *, type: str, status: bool, reason: str, message: str = "",
                  generation: int, now: datetime) -> list[dict]:
    """Return conditions with `type` set; last_transition_time moves only when the status flips."""
    new = {"type": type, "status": "True" if status else "False", "reason": reason, "message": message[:2000],
           "observed_generation": generation}
    out, found = [], False
    for c in conditions:
        if c.get("type") != type:
            out.append(c)
            continue
        found = True
        same_status = c.get("status") == new["status"]
        new["last_transition_time"] = c.get("last_transition_time") if same_status else now.isoformat()
        out.append(new)
    if not found:
        new["last_transition_time"] = now.isoformat()
        out.append(new)
    return out


def condition_true(conditions: list[dict], type: str) -> bool:
    return any(c.get("type") == type and c.get("status") == "True" for c in conditions)
