"""Kubernetes-style status conditions, written through one pure helper (as KubeRay's setCondition)."""
from datetime import datetime

CONDITION_TYPES = ("Approved", "NodePoolsReady", "Applied", "ServeRunning", "EndpointReady", "ConformancePassed",
                   "KvTransfer")
# ConformancePassed's and EndpointReady's reason when KV does not move over the EFA the spec asked for
# (observability.fabric): the endpoint stays closed to users (the gateway reads this reason) until it does.
KV_NOT_ON_EFA = "KvNotOnEfa"


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


def condition_get(conditions: list[dict], type: str) -> dict | None:
    return next((c for c in conditions if c.get("type") == type), None)


# Whether the gateway lets users' keys in (stored as Deployment.endpoint_access, which the gateway reads).
OPEN, CHECKING, CLOSED = "open", "checking", "closed"


def endpoint_access(conditions: list[dict]) -> tuple[str, str]:
    """(access, message) for users' keys, from the conditions: `checking` while a deployment's first conformance
    run is pending (a later generation's re-check keeps it open), `closed` while KV does not move over the EFA
    the spec asked for (with EndpointReady's message, which users are shown), else `open`. Tandem's own service
    keys reach it regardless."""
    ready = condition_get(conditions, "EndpointReady") or {}
    if ready.get("reason") == KV_NOT_ON_EFA:
        return CLOSED, ready.get("message") or "KV does not move over the EFA its spec asks for."
    if ready.get("reason") == "ConformancePending" and condition_get(conditions, "ConformancePassed") is None:
        return CHECKING, ""
    return OPEN, ""


def conformance_passed(*, passed: bool, summary: str, pd_health: dict | None) -> dict:
    """ConformancePassed's status, reason and message from a recorded run: the checks decide; an unhealthy PD
    probe adds its findings to the message; KV off the EFA that was asked for fails it whatever the checks say."""
    health = pd_health or {}
    message = summary if health.get("ok") is not False else f"{summary} {' '.join(health.get('messages', []))}"
    fabric = health.get("fabric") or {}
    if fabric.get("ok") is False:
        return {"status": False, "reason": KV_NOT_ON_EFA, "message": " ".join(fabric.get("messages", []))}
    return {"status": passed, "reason": "AllChecksPassed" if passed else "ChecksFailed", "message": message}


def endpoint_ready(conditions: list[dict], *, generation: int, answers: bool, message: str = "") -> dict:
    """EndpointReady's arguments for condition_set: the endpoint answers *and* the conformance suite has checked
    this generation. A failed check still opens it, with a warning (the deployment runs; users are told)."""
    if not answers:
        return {"status": False, "reason": "NotAnswering", "message": message}
    checked = condition_get(conditions, "ConformancePassed")
    if checked is None or checked.get("observed_generation") != generation:
        return {"status": False, "reason": "ConformancePending",
                "message": "Serve answers; Tandem is checking its OpenAI behaviour before users get it."}
    if checked.get("reason") == KV_NOT_ON_EFA:
        return {"status": False, "reason": KV_NOT_ON_EFA,
                "message": f"Serve answers, but it is not open to users: {checked.get('message', '')}"}
    if checked.get("status") == "True":
        return {"status": True, "reason": "Answering", "message": message}
    return {"status": True, "reason": "AnsweringWithWarnings",
            "message": f"Serving, but conformance checks failed: {checked.get('message', '')}"}


def seconds_since_transition(condition: dict, *, now: datetime) -> float:
    """How long `condition` has held its status (from its last_transition_time)."""
    return max(0.0, (now - datetime.fromisoformat(condition["last_transition_time"])).total_seconds())
