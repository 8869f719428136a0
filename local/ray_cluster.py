#!/usr/bin/env python3
"""Start / stop / inspect the local single-node Ray head for the Tandem "local target".

    python3 local/ray_cluster.py start [--dashboard-port 8265] [--metrics-port 8080] [--gcs-port 6380]
                                       [--num-gpus N] [--resources '{"prefill_pool": 8, ...}']
    python3 local/ray_cluster.py status          # JSON on stdout; exit 0 when up, 3 when down
    python3 local/ray_cluster.py stop

Any python3 (stdlib only) can run this file; Ray itself runs from the runtime venv
(${TANDEM_RUNTIME_DIR:-~/.cache/tandem/pd-runtime}/venv, made by local/install_runtime.sh).

Shaped like the EKS cluster: custom resources {"prefill_pool": N, "decode_pool": N} (default N=100; each
stage's placement bundle consumes 1), dashboard (REST API) on 127.0.0.1, a metrics export port whose
/metrics serves ray_vllm_* and ray_serve_* series, and token authentication on. `--num-gpus` and `--resources`
make the head advertise what a GPU node would instead (Ray accounts GPUs it does not have), so Ray's own scheduler
can be tried against a p4d- or p5-shaped node here (tests/deployments/test_placement_ray_cluster.py).

Token: a random token is generated once into ${TANDEM_RUNTIME_DIR}/ray-token (mode 0600) and handed to Ray
with RAY_AUTH_MODE=token + RAY_AUTH_TOKEN_PATH. It is never printed. HTTP clients send
`Authorization: Bearer <token>` to the dashboard (X-Ray-Authorization: Bearer <token> also works).
State (pids, ports, paths) goes to ${TANDEM_RUNTIME_DIR}/ray-cluster.json.

Environment knobs: TANDEM_RUNTIME_DIR, TANDEM_RAY_STATE_DIR (token, state and log; default the runtime dir),
TANDEM_RAY_CLIENT_PORT (10001), TANDEM_RAY_AGENT_PORT (52365), TANDEM_RAY_TEMP_DIR (default /tmp/tandem-ray: Unix socket paths
must stay short), TANDEM_RAY_DASHBOARD_PORT, TANDEM_RAY_METRICS_PORT, TANDEM_RAY_START_TIMEOUT (seconds the
head may take to answer, default 240), TANDEM_RAY_GCS_PORT (default 6380,
because Redis already owns 6379 on these machines), TANDEM_SERVE_HTTP_PORT (only reported: Serve's HTTP
proxy port is set by http_options in the serve config PUT to the dashboard), TANDEM_RAY_NUM_CPUS (logical CPUs,
default two per core: room for two deployments of the tiny model side by side).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

RT = Path(os.environ.get("TANDEM_RUNTIME_DIR") or os.path.expanduser("~/.cache/tandem/pd-runtime"))
VENV = RT / "venv"
RAY_BIN = VENV / "bin" / "ray"
# Where this cluster's token, state and log live: the runtime dir for `./tandem up`'s cluster; the test suite names a
# folder of its own (with its own ports and temp dir), so it never finds, takes over or stops a user's cluster.
STATE_DIR = Path(os.environ.get("TANDEM_RAY_STATE_DIR") or RT)
TOKEN_FILE = STATE_DIR / "ray-token"
STATE_FILE = STATE_DIR / "ray-cluster.json"
LOG_FILE = STATE_DIR / "ray-head.log"
TEMP_DIR = Path(os.environ.get("TANDEM_RAY_TEMP_DIR") or "/tmp/tandem-ray")

# Env for every Ray process (and so inherited by Serve replicas). Per-stage engine settings
# (VLLM_CPU_KVCACHE_SPACE, VLLM_CPU_OMP_THREADS_BIND, ...) live in the serve config's runtime_env.
CLUSTER_ENV = {
    "RAY_AUTH_MODE": "token",
    "RAY_AUTH_TOKEN_PATH": str(TOKEN_FILE),
    "HF_HUB_OFFLINE": "1",           # this machine reaches no model hub; fail fast instead of retrying
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "TOKENIZERS_PARALLELISM": "false",
}


def log(msg: str) -> None:
    print(f"[ray_cluster] {msg}", flush=True)


def ensure_token() -> str:
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    if not TOKEN_FILE.is_file() or not TOKEN_FILE.read_text().strip():
        fd = os.open(TOKEN_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    os.chmod(TOKEN_FILE, 0o600)
    return TOKEN_FILE.read_text().strip()


def ray_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RAY_AUTH_TOKEN", None)          # the file is the one source of truth
    env.pop("RAY_ADDRESS", None)
    env.update(CLUSTER_ENV)
    env["PATH"] = f"{VENV / 'bin'}:{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(VENV)
    return env


def read_state() -> dict | None:
    try:
        return json.loads(STATE_FILE.read_text())
    except (OSError, ValueError):
        return None


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie counts as dead
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def http_get(url: str, token: str | None = None, timeout: float = 3.0) -> tuple[int, str]:
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as e:
        return 0, str(e)


def clean_stale_current_cluster() -> None:
    for d in (TEMP_DIR, Path("/tmp/ray")):
        f = d / "ray_current_cluster"
        if f.exists():
            f.unlink()
            log(f"removed stale {f}")


def lower_priority(pid: int) -> None:
    """Give the Ray session the lowest CPU weight: idle vLLM CPU engines keep polling (largely in sched_yield),
    and on a 2-core machine that starved the control plane (gunicorn timed out importing its URLconf). Ray still
    gets every cycle nobody else wants. With the kernel's autogroups, a session's weight is set here, not by nice."""
    try:
        Path(f"/proc/{pid}/autogroup").write_text("19")
    except OSError:  # no autogroups on this kernel: plain nice values apply, and Ray's workers already use them
        pass


def cmd_start(a: argparse.Namespace) -> int:
    st = read_state()
    if st and pid_alive(st.get("pid")):
        code, _ = http_get(f"http://127.0.0.1:{st['dashboard_port']}/api/version", ensure_token())
        if code == 200:
            log(f"already running (pid {st['pid']}), dashboard http://127.0.0.1:{st['dashboard_port']}")
            return 0
        log("state file names a live pid but the dashboard does not answer; stopping it first")
        cmd_stop(a)
    if not RAY_BIN.exists():
        log(f"no runtime at {VENV}: run local/install_runtime.sh first")
        return 1
    token = ensure_token()
    clean_stale_current_cluster()
    TEMP_DIR.mkdir(parents=True, exist_ok=True)
    resources = json.loads(a.resources) if a.resources else \
        {"prefill_pool": a.pool_units, "decode_pool": a.pool_units}
    cmd = [
        str(RAY_BIN), "start", "--head", "--block", "--disable-usage-stats",
        f"--port={a.gcs_port}",
        "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={a.dashboard_port}",
        f"--metrics-export-port={a.metrics_port}",
        f"--ray-client-server-port={a.client_port}", f"--dashboard-agent-listen-port={a.agent_port}",
        f"--num-cpus={a.num_cpus}",
        f"--resources={json.dumps(resources)}",
        f"--temp-dir={TEMP_DIR}",
    ] + ([f"--num-gpus={a.num_gpus}"] if a.num_gpus is not None else [])
    log(f"starting Ray head: dashboard 127.0.0.1:{a.dashboard_port}, metrics :{a.metrics_port}, "
        f"gcs :{a.gcs_port}, resources {resources}, temp dir {TEMP_DIR}")
    logf = open(LOG_FILE, "ab")
    proc = subprocess.Popen(cmd, env=ray_env(), stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                            start_new_session=True, cwd=str(RT))
    state = {
        "pid": proc.pid, "pgid": proc.pid, "started_at": time.time(),
        "dashboard_url": f"http://127.0.0.1:{a.dashboard_port}", "dashboard_port": a.dashboard_port,
        "metrics_url": f"http://127.0.0.1:{a.metrics_port}/metrics", "metrics_port": a.metrics_port,
        "serve_http_url": f"http://127.0.0.1:{a.serve_port}", "serve_port": a.serve_port,
        "gcs_address": f"127.0.0.1:{a.gcs_port}", "temp_dir": str(TEMP_DIR), "token_file": str(TOKEN_FILE),
        "log_file": str(LOG_FILE), "venv": str(VENV), "resources": resources,
    }
    STATE_FILE.write_text(json.dumps(state, indent=2) + "\n")
    if not a.normal_priority:
        lower_priority(proc.pid)
    t0 = time.monotonic()
    while time.monotonic() - t0 < a.timeout:
        if proc.poll() is not None:
            log(f"ray start exited with {proc.returncode}; see {LOG_FILE}")
            os.system(f"tail -20 {LOG_FILE} >&2")
            cmd_stop(a)
            return 1
        code, _ = http_get(f"{state['dashboard_url']}/api/serve/applications/", token)
        mcode, _ = http_get(state["metrics_url"])
        if code == 200 and mcode == 200:
            log(f"up in {time.monotonic() - t0:.1f}s (pid {proc.pid}); dashboard {state['dashboard_url']}, "
                f"metrics {state['metrics_url']}, token file {TOKEN_FILE} (0600), state {STATE_FILE}")
            return 0
        time.sleep(1)
    log(f"dashboard/metrics not answering after {a.timeout}s; stopping")
    cmd_stop(a)
    return 1


def _ray_session_pids(session: int | None = None) -> list[int]:
    """Pids of processes that belong to our Ray temp dir (GCS, raylet, dashboard, workers) or to the head's
    session (`session`: the head started one of its own). vLLM's engine and worker processes name neither the temp
    dir nor Ray (VLLM::EngineCore, VLLM::Worker) and leave Ray's process group, but stay in the head's session: a
    stop that missed them left them busy on both cores after the cluster was gone."""
    pids = []
    # The temp dir as a whole path (followed by "/", the end of an argument, or nothing): another cluster's
    # /tmp/tandem-ray-other is not ours.
    needle = re.compile(re.escape(str(TEMP_DIR).encode()) + rb"(/|\x00|$)")
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        try:
            if needle.search((p / "cmdline").read_bytes()) or (session and os.getsid(int(p.name)) == session):
                pids.append(int(p.name))
        except OSError:
            pass
    return pids


def cmd_stop(a: argparse.Namespace) -> int:
    """Stop this cluster's processes only: `ray start --block`'s process group, then whatever names its temp dir.
    (`ray stop` would end every Ray process of this user on the machine, another cluster's too.)"""
    st = read_state() or {}
    pgid = st.get("pgid")
    if pgid and pid_alive(st.get("pid")):
        log(f"terminating process group {pgid}")
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        for _ in range(20):
            if not pid_alive(st.get("pid")):
                break
            time.sleep(0.5)
    leftovers = _ray_session_pids(pgid)  # the head started its own session: its pgid is the session's id
    if pgid:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for pid in leftovers:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if leftovers:
        log(f"killed {len(leftovers)} leftover process(es) of {TEMP_DIR}")
    STATE_FILE.unlink(missing_ok=True)
    clean_stale_current_cluster()
    log("stopped")
    return 0


def cmd_status(a: argparse.Namespace) -> int:
    st = read_state()
    out: dict = {"state_file": str(STATE_FILE), "running": False}
    if st:
        out.update(st)
        out["pid_alive"] = pid_alive(st.get("pid"))
        token = TOKEN_FILE.read_text().strip() if TOKEN_FILE.is_file() else None
        code, body = http_get(f"{st['dashboard_url']}/api/serve/applications/", token)
        out["dashboard_http_status"] = code
        if code == 200:
            try:
                apps = json.loads(body).get("applications", {})
                out["serve_applications"] = {k: v.get("status") for k, v in apps.items()}
            except ValueError:
                pass
        out["running"] = bool(out["pid_alive"] and code == 200)
    print(json.dumps(out, indent=2))
    return 0 if out["running"] else 3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["start", "stop", "status"])
    ap.add_argument("--dashboard-port", type=int, default=int(os.environ.get("TANDEM_RAY_DASHBOARD_PORT", 8265)))
    ap.add_argument("--metrics-port", type=int, default=int(os.environ.get("TANDEM_RAY_METRICS_PORT", 8080)))
    ap.add_argument("--gcs-port", type=int, default=int(os.environ.get("TANDEM_RAY_GCS_PORT", 6380)))
    ap.add_argument("--serve-port", type=int, default=int(os.environ.get("TANDEM_SERVE_HTTP_PORT", 8000)))
    ap.add_argument("--client-port", type=int, default=int(os.environ.get("TANDEM_RAY_CLIENT_PORT", 10001)))
    ap.add_argument("--agent-port", type=int, default=int(os.environ.get("TANDEM_RAY_AGENT_PORT", 52365)))
    # Logical CPUs: each engine's placement bundle holds one. Two per core lets two deployments of the tiny model
    # (four engines) share a 2-core machine; each engine still pins its threads to one real core.
    ap.add_argument("--num-cpus", type=int,
                    default=int(os.environ.get("TANDEM_RAY_NUM_CPUS", 2 * (os.cpu_count() or 2))))
    ap.add_argument("--pool-units", type=int, default=100,
                    help="units of prefill_pool / decode_pool custom resource on the head (default 100)")
    ap.add_argument("--num-gpus", type=int, default=None,
                    help="GPUs the head advertises (Ray need not find them; default: those Ray finds)")
    ap.add_argument("--resources", default="",
                    help="the head's custom resources as JSON, instead of --pool-units of each pool's")
    ap.add_argument("--normal-priority", action="store_true",
                    help="keep the session's CPU weight: a head that runs no vLLM engine need not yield, and at the "
                         "lowest weight on a busy machine its raylet missed Ray's 30 s deadline to register")
    ap.add_argument("--timeout", type=float, default=float(os.environ.get("TANDEM_RAY_START_TIMEOUT", 240)))
    a = ap.parse_args()
    return {"start": cmd_start, "stop": cmd_stop, "status": cmd_status}[a.command](a)


if __name__ == "__main__":
    sys.exit(main())
