"""Placement groups on a running Ray cluster, as Ray's own scheduler handles them: a driver run by the runtime venv's
python (Ray 2.60), connecting with the cluster's token (RAY_AUTH_MODE / RAY_AUTH_TOKEN_PATH in its environment).

    <runtime>/venv/bin/python tests/support/ray_pg_probe.py GCS_ADDRESS REQUEST.json ANSWER.json

REQUEST: {"groups": {name: {"bundles": [...], "strategy": "STRICT_PACK"}}, "wait_s": seconds}.
ANSWER: {name: {"state": "CREATED" | "PENDING" | ..., "scheduling_state": Ray's scheduling state}} as Ray's state
API reads them once every group is placed or found infeasible, or `wait_s` has passed.
"""
import json
import sys
import time


def main(address: str, request_path: str, answer_path: str) -> None:
    with open(request_path) as f:
        request = json.load(f)
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.state import get_placement_group

    ray.init(address=address, log_to_driver=False, logging_level="ERROR")
    groups = {name: placement_group(g["bundles"], strategy=g["strategy"], name=name)
              for name, g in request["groups"].items()}
    deadline = time.monotonic() + request["wait_s"]
    while True:
        seen = {}
        for name, group in groups.items():
            state = get_placement_group(group.id.hex())
            stats = state.stats or {} if state else {}
            seen[name] = {"state": state.state if state else None, "scheduling_state": stats.get("scheduling_state")}
        settled = all(s["state"] == "CREATED" or s["scheduling_state"] == "INFEASIBLE" for s in seen.values())
        if settled or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    with open(answer_path, "w") as f:
        json.dump(seen, f)
    ray.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:4])
