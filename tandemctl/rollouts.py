"""`tandemctl rollout`: how an update of a running deployment reaches its users, step by step, and an admin's
pause, resume or abort of it (the API's /deployments/{id}/rollouts/)."""
from tandemctl import errors
from tandemctl.client import Client
from tandemctl.errors import CliError
from tandemctl.output import emit, print_table

# What each action is called, by its flag's destination: (operation, what it did, in words).
ACTIONS = {"pause": ("rollouts.pause", "held at its step"), "resume": ("rollouts.resume", "resumed"),
           "abort": ("rollouts.abort", "aborted: every request goes back to the old generation")}


def rollout_latest(api: Client, d: dict) -> dict:
    """The deployment's rollout in progress, else its last one; no rollout yet is NOT_FOUND."""
    if d.get("rollout"):
        return d["rollout"]
    found = api.call("rollouts.list", id=d["id"], params={"limit": 1})["results"]
    if not found:
        raise CliError(f"Deployment {d['team']}/{d['name']} has had no update rolled out yet.", errors.NOT_FOUND)
    return found[0]


def rollout_act(api: Client, d: dict, action: str, reason: str = "") -> dict:
    """Pause, resume or abort the rollout in progress (team admins); none in progress is CONFLICT."""
    if not d.get("rollout"):
        raise CliError(f"No update of {d['team']}/{d['name']} is rolling out: nothing to {action}.", errors.CONFLICT)
    operation, _ = ACTIONS[action]
    body = {"reason": reason} if action == "abort" else None
    return api.call(operation, body=body, id=d["id"], rollout_id=d["rollout"]["id"])


def _pools(counts: dict) -> str:
    return ", ".join(f"{pool} {n}" for pool, n in counts.items())


def rollout_print(r: dict, fmt: str) -> None:
    """The rollout as the API answers it (json, yaml), or for people: each step with its state."""
    if fmt != "table":
        emit(r, fmt)
        return
    held = " (paused)" if r["paused"] else ""
    print(f"Rollout:     {r['id']}: generation {r['from_generation']} → {r['to_generation']}, "
          f"{r['mode'].replace('_', ' ')}")
    print(f"State:       {r['state']}{held}, {r['weight']}% of requests on generation {r['to_generation']}")
    verdict = r["verdict"]
    print("Verdict:     " + ("the generations can share KV: rolls in place, replica by replica"
                             if verdict["compatible"] else "they cannot share KV: " + "; ".join(verdict["reasons"])))
    if r["steps"]:
        print("Steps:")
        print_table([["STEP", "WEIGHT", "STATE"]] + [[i + 1, f"{s['weight']}%", s["state"]]
                                                      for i, s in enumerate(r["steps"])])
    replicas = r["replicas"]
    print(f"Replicas:    old: {_pools(replicas['old'])}; new: {_pools(replicas['new'])}")
    print(f"Peak surge:  {_pools(r['peak_surge'])}")
    if r["reason"]:
        print(f"Reason:      {r['reason']}")
