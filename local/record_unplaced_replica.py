#!/usr/bin/env python3
"""Record what Ray Serve says of a deployment whose replicas no node can take, for the stand-ins that play Serve.

    $TANDEM_RUNTIME_DIR/venv/bin/python local/record_unplaced_replica.py

Starts a Ray head of its own (local/ray_cluster.py: own state folder, token, temp dir and ports) advertising what a
p4d.24xlarge worker pod of the prefill pool gives Ray (8 GPUs Ray accounts without having them, prefill_pool 8,
accelerator_type:A100), deploys a trivial Serve deployment (no vLLM) whose replica asks for main's p4d bundle
{"GPU": 1, "accelerator_type:A100-40G": 0.001} (STRICT_PACK), waits past Serve's 30 s slow-start warning and saves
the dashboard's `GET /api/serve/applications/` to local/examples/applications-unplaced-replica.json. The cluster is
stopped, with every process of its session, however the recording ends.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "examples" / "applications-unplaced-replica.json"
P4D_PREFILL_NODE = {"prefill_pool": 8, "accelerator_type:A100": 1}
MAIN_P4D_BUNDLE = {"GPU": 1, "accelerator_type:A100-40G": 0.001}
WAIT_S = 180


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _applications(state: dict, token: str) -> str:
    req = urllib.request.Request(f"{state['dashboard_url']}/api/serve/applications/",
                                 headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read().decode()


def _record(state: dict, serve_port: int) -> dict:
    token = Path(state["token_file"]).read_text().strip()
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=state["token_file"])
    import ray
    from ray import serve

    @serve.deployment(placement_group_bundles=[MAIN_P4D_BUNDLE], placement_group_strategy="STRICT_PACK",
                      ray_actor_options={"num_cpus": 0})  # the replica actor must fit the first bundle
    class Unplaced:
        def __call__(self, request) -> str:
            return "never"

    ray.init(address=state["gcs_address"], log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": serve_port})
    started = time.monotonic()
    # Not serve.run: it waits for the application to run, which this one never does.
    serve._run(Unplaced.bind(), name="unplaced", route_prefix="/unplaced", _blocking=False)
    while time.monotonic() - started < WAIT_S:
        body = json.loads(_applications(state, token))
        message = body["applications"].get("unplaced", {}).get("deployments", {}).get("Unplaced", {}).get("message")
        if message and "to be scheduled" in message:
            print(f"Serve's message after {time.monotonic() - started:.0f} s", flush=True)
            return body
        time.sleep(2)
    raise SystemExit(f"no pending-allocation message after {WAIT_S} s")


def main() -> int:
    home = Path(tempfile.mkdtemp(prefix="tdm-unplaced-"))
    env = {**os.environ, "TANDEM_RAY_STATE_DIR": str(home), "TANDEM_RAY_TEMP_DIR": f"/tmp/tdm-unplaced-{os.getpid()}",
           "TANDEM_RAY_NUM_CPUS": "2", "RAY_USAGE_STATS_ENABLED": "0",
           **{f"TANDEM_RAY_{name}_PORT": str(_free_port()) for name in ("DASHBOARD", "METRICS", "GCS", "CLIENT",
                                                                         "AGENT")}}
    script = [sys.executable, str(HERE / "ray_cluster.py")]
    try:
        subprocess.run([*script, "start", "--num-gpus=8", f"--resources={json.dumps(P4D_PREFILL_NODE)}",
                        "--normal-priority"], check=True, env=env, timeout=300)
        state = json.loads((home / "ray-cluster.json").read_text())
        body = _record(state, _free_port())
        OUT.write_text(json.dumps(body, indent=2) + "\n")
        print(f"wrote {OUT}")
        return 0
    finally:
        subprocess.run([*script, "stop"], env=env, timeout=120)
        shutil.rmtree(env["TANDEM_RAY_TEMP_DIR"], ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
