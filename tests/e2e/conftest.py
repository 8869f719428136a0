"""The local prefill/decode stack for end-to-end tests: the real Ray Serve LLM + vLLM (CPU) runtime.

`./tandem test` installs the runtime (cached) and builds the tiny model before pytest runs; these fixtures start
the local Ray cluster once for this package and always stop it.
"""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.support.processes import free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = Path(os.environ.get("TANDEM_RUNTIME_DIR") or Path.home() / ".cache/tandem/pd-runtime")
MODEL = RUNTIME / "models" / "tiny-llama"
# The same tiny model with other random weights and a head of its own (local/build_tiny_model.py --seed
# --untied-head): its greedy answers differ from the first's.
VARIANT = RUNTIME / "models" / "tiny-llama-variant"


@pytest.fixture(scope="package")
def local_ray(tmp_path_factory):
    """A local Ray head shaped like the EKS cluster, started by the suite for every PD test and stopped after them:
    its own state folder, temp dir and ports, so a user's `./tandem up` cluster is never found, taken over or
    stopped. Its state (URLs, token file), and `secret_ref`: the token copied into the secrets directory the test
    settings allow (clusters may name only files inside it)."""
    if not (RUNTIME / "venv" / "bin" / "ray").exists() or not (MODEL / "config.json").exists():
        pytest.fail(f"The local PD runtime is not installed in {RUNTIME}: run `./tandem test`, which installs it "
                    "(local/install_runtime.sh) and builds the tiny model (local/build_tiny_model.py).")
    script = str(ROOT / "local" / "ray_cluster.py")
    home = tmp_path_factory.mktemp("ray-cluster")
    ports = {name: free_port() for name in ("DASHBOARD", "METRICS", "GCS", "CLIENT", "AGENT")}
    env = {**os.environ, "TANDEM_RAY_STATE_DIR": str(home), "TANDEM_SERVE_HTTP_PORT": str(free_port()),
           # short (Unix socket paths) and not a prefix of another cluster's: ray_cluster.py stops what names it
           "TANDEM_RAY_TEMP_DIR": f"/tmp/tdm-suite-{os.getpid()}",
           **{f"TANDEM_RAY_{name}_PORT": str(port) for name, port in ports.items()},
           # Serve tries a replica whose constructor fails 3 times before DEPLOY_FAILED, each try loading vLLM
           # (minutes on 2 cores); one try is enough to see Serve's own failure, and every other test's engines
           # start first time.
           "RAY_SERVE_MAX_PER_REPLICA_RETRY_COUNT": "1"}
    state = {}
    try:
        subprocess.run([sys.executable, script, "start"], check=True, timeout=300, env=env)
        state = json.loads((home / "ray-cluster.json").read_text())
        token = tmp_path_factory.mktemp("cluster-secrets") / "ray-token"
        shutil.copy(state["token_file"], token)
        yield {**state, "secret_ref": f"file:{token}"}
    finally:
        subprocess.run([sys.executable, script, "stop"], timeout=300, env=env)
        # vLLM's engines leave Ray's process group but not the head's session: none may outlive the stop (they
        # kept both cores busy after a stopped cluster).
        deadline = time.monotonic() + 10  # killed ones are gone once reaped
        while (left := session_processes(state.get("pgid"))) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not left, f"processes of the stopped Ray head's session still run: {left}"


def session_processes(session: int | None) -> dict[int, str]:
    """Pid → command line of each process in the session `session` (the Ray head's: it starts its own)."""
    found = {}
    for proc in Path("/proc").iterdir():
        try:
            if session and proc.name.isdigit() and os.getsid(int(proc.name)) == session:
                found[int(proc.name)] = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
        except OSError:
            pass
    return found


def ray_apps(state: dict) -> dict:
    """The Serve applications on the local head, by name."""
    r = httpx.get(f"{state['dashboard_url']}/api/serve/applications/", headers=_auth(state), timeout=30)
    r.raise_for_status()
    return r.json().get("applications") or {}


def _auth(state: dict) -> dict:
    return {"Authorization": f"Bearer {Path(state['token_file']).read_text().strip()}"}


@pytest.fixture(autouse=True)
def no_application_outlives_its_test(request):
    """Every test here deploys its own applications and removes them. One that fails first leaves them on the
    shared head, where their engines would starve the next test's of both cores: shut Serve down after it (the next
    deploy starts Serve again), and wait until the applications are gone."""
    yield
    if "local_ray" not in request.fixturenames:
        return
    state = request.getfixturevalue("local_ray")
    if not ray_apps(state):
        return
    httpx.delete(f"{state['dashboard_url']}/api/serve/applications/", headers=_auth(state),
                 timeout=60).raise_for_status()
    # A head that keeps them fails here, naming them, rather than starving the next test's engines unseen.
    wait_for(lambda: not ray_apps(state), timeout=300, every=2, what="Serve's applications to be gone")


def local_cluster_config(state: dict, **extra) -> dict:
    """A `ray` cluster's config for the local head, its models directory the one allowed model source."""
    return {"dashboard_url": state["dashboard_url"], "serve_url": state["serve_http_url"],
            "metrics_url": state["metrics_url"], "model_sources": {"paths": [str(RUNTIME / "models")]}, **extra}


@pytest.fixture(scope="package")
def tiny_variant():
    """The second tiny model (built once, in seconds, like the first)."""
    subprocess.run([str(RUNTIME / "venv" / "bin" / "python"), str(ROOT / "local" / "build_tiny_model.py"),
                    str(VARIANT), "--seed", "4321", "--untied-head"], check=True, timeout=300)
    return VARIANT
