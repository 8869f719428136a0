"""Ray's own scheduler on a p4d-shaped node: a real local Ray head (Ray 2.60, the runtime venv) that advertises what a
p4d.24xlarge worker pod of the prefill pool gives Ray (8 GPUs, which Ray accounts without having them, its pool
resource and Ray's accelerator label for the node's GPU), started and stopped as local/ray_cluster.py isolates the
suite's clusters: its own state folder, token, temp dir and ports, and every process of its session gone at the end.

The bundles main's serve config made Ray Serve LLM ask for (accelerator_type:A100-40G) stay pending there; the bundles
Tandem's serve config makes it ask for now are placed."""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deployments.catalog import INSTANCE_TYPES
from deployments.manifests import manifests_build
from deployments.spec import spec_load, spec_parse
from deployments.yamlio import yaml_load
from tests.factories import RUNTIME_IMAGE, spec_input
from tests.support import ray_rules
from tests.support.processes import free_port
from tests.support.ray_oracle import runtime_python

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_SCRIPT = ROOT / "local" / "ray_cluster.py"
PROBE = ROOT / "tests" / "support" / "ray_pg_probe.py"
# 35-45 s in all on these 2 busy cores (the head and its dashboard start in 19-27 s and stop in 12 s): not well under
# a minute, so it runs with the local PD stack's tests, which run Ray already, not in the quick run.
pytestmark = [pytest.mark.pd, pytest.mark.timeout(900)]


def _p4d_prefill() -> tuple[dict, dict]:
    """The prefill stage's config and worker group Tandem renders for a p4d.24xlarge pool of 8 GPUs, from the spec as
    stored and loaded back the way a driver renders it (spec_load checks nothing), so that Ray's scheduler, not
    Tandem's own check, judges the bundles."""
    stored = spec_parse(spec_input(), target_kind="eks").to_dict()
    pool = {"instance_type": "p4d.24xlarge", "nodes": 1, "gpus_per_node": 8, "tensor_parallel_size": 8,
            "replicas_min": 1, "replicas_max": 1}
    spec = spec_load({**stored, "prefill": pool, "decode": pool})
    rs = manifests_build(name="llama", namespace="tdm-team", team_slug="team", spec=spec, target_kind="eks",
                         image=RUNTIME_IMAGE)[-1]
    args = yaml_load(rs["spec"]["serveConfigV2"])["applications"][0]["args"]
    [group] = [g for g in rs["spec"]["rayClusterConfig"]["workerGroupSpecs"] if g["groupName"] == "prefill"]
    return args["prefill_config"], group


def _session_processes(session: int | None) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if session and proc.name.isdigit() and os.getsid(int(proc.name)) == session:
                found.append(int(proc.name))
        except OSError:
            pass
    return found


@pytest.fixture
def p4d_head(tmp_path):
    """A Ray head advertising a p4d prefill pod's GPUs and custom resources (its CPUs and memory are this machine's:
    the bundles ask for one CPU), always stopped, its whole session gone, even when the test fails."""
    _, group = _p4d_prefill()
    pod = ray_rules.pod_resources(group, gpu_name=INSTANCE_TYPES["p4d.24xlarge"].gpu_product)
    custom = {k: v for k, v in pod.items() if k not in ("CPU", "GPU", "memory")}
    ports = {name: free_port() for name in ("DASHBOARD", "METRICS", "GCS", "CLIENT", "AGENT")}
    env = {**os.environ, "TANDEM_RAY_STATE_DIR": str(tmp_path), "TANDEM_SERVE_HTTP_PORT": str(free_port()),
           # short (Unix socket paths) and no prefix of another cluster's: ray_cluster.py stops what names it
           "TANDEM_RAY_TEMP_DIR": f"/tmp/tdm-place-{os.getpid()}", "TANDEM_RAY_NUM_CPUS": "2",
           **{f"TANDEM_RAY_{name}_PORT": str(port) for name, port in ports.items()}}
    state = {}
    try:
        subprocess.run([sys.executable, str(CLUSTER_SCRIPT), "start", f"--num-gpus={int(pod['GPU'])}",
                        f"--resources={json.dumps(custom)}", "--normal-priority"], check=True, timeout=300, env=env)
        state = json.loads((tmp_path / "ray-cluster.json").read_text())
        yield {**state, "advertises": {"GPU": pod["GPU"], **custom}}
    finally:
        subprocess.run([sys.executable, str(CLUSTER_SCRIPT), "stop"], timeout=120, env=env)
        deadline = time.monotonic() + 10
        while (left := _session_processes(state.get("pgid"))) and time.monotonic() < deadline:
            time.sleep(0.5)
        shutil.rmtree(env["TANDEM_RAY_TEMP_DIR"], ignore_errors=True)  # Ray's session files and logs
        assert not left, f"processes of the stopped Ray head's session still run: {left}"


def _probe(head: dict, groups: dict, tmp_path: Path) -> dict:
    """Ray's state API on each placement group once it is placed or found infeasible."""
    request, answer = tmp_path / "groups.json", tmp_path / "placed.json"
    request.write_text(json.dumps({"groups": groups, "wait_s": 60}))
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": head["token_file"],
           "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_AUTH_TOKEN", None)
    subprocess.run([runtime_python(), str(PROBE), head["gcs_address"], str(request), str(answer)], check=True,
                   timeout=180, env=env)
    return json.loads(answer.read_text())


def test_rays_scheduler_places_tandems_p4d_bundles_and_leaves_mains_pending(p4d_head, tmp_path):
    assert p4d_head["advertises"] == {"GPU": 8, "prefill_pool": 8, "accelerator_type:A100": 1}
    stage, _ = _p4d_prefill()
    # What main's serve config wrote for the same pool: Ray's A100-40G type (its RAY_ACCELERATOR table).
    main_stage = {**stage, "accelerator_type": "A100-40G"}
    groups = {}
    for name, config in (("tandem", stage), ("main", main_stage)):
        bundles, strategy = ray_rules.replica_bundles(config)
        groups[name] = {"bundles": bundles, "strategy": strategy}
    placed = _probe(p4d_head, groups, tmp_path)
    assert placed["tandem"]["state"] == "CREATED", placed
    assert placed["main"]["state"] == "PENDING", placed
    assert placed["main"]["scheduling_state"] in ("INFEASIBLE", "PENDING"), placed
    # The stand-ins' scheduler agrees with Ray's on the same node (its 2 CPUs: TANDEM_RAY_NUM_CPUS).
    node = {"CPU": 2, **p4d_head["advertises"]}
    for name, group in groups.items():
        assert (ray_rules.place(group["bundles"], group["strategy"], [node]) is not None) == \
            (placed[name]["state"] == "CREATED"), name
