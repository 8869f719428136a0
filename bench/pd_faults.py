"""A dead prefill or decode replica under streaming load: what users see, and how long until it serves again.

    python -m bench.pd_faults --gateway http://127.0.0.1:18801/v1 --key tdm_... --model tiny-llama \
        --state ~/.cache/tandem/pd-runtime/ray-cluster.json --app tdm-1-tiny-llama [--streams 4] [--out var/pd-faults] \
        [--direct-streams 0] [--kills prefill,decode] [--no-tandem-restart]

Against a running local PD stack (`./tandem up`): `--streams` threads each stream chats through the gateway with
the official openai client, back to back. After a quiet baseline the prefill replica's process (the Serve replica
actor, found through Ray's state API) gets SIGKILL; once the deployment is healthy again, the decode's; then Tandem
restarts the decode as its reconciler does for a stale NIXL peer (RayTarget.restart_stage, through the control plane's
database: DATABASE_URL). Per phase it prints the requests that failed before their first token, the streams cut
after it (and how many of those ended with an OpenAI error event, which the openai client raises as a bare
APIError), any request that went `--hang-after` seconds without a byte, and the seconds until the deployment is
healthy again: Serve shows a new replica RUNNING and a fresh request through the gateway answers, and the gateway's
retries by reason in the phase. `--direct-streams` adds streams straight to Serve's route (no gateway, no retry):
their figures per phase show what the gateway spared its clients. With `--out` it keeps what it saw for fixtures:
the metrics text before, during and after each phase, the replicas' logs, and Serve's error answers to the direct
streams, whole (serve-errors.jsonl).
"""
import argparse
import json
import os
import shutil
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

PROMPT = [{"role": "user", "content": "Count slowly from one to fifty, one number per line."}]


@dataclass
class Outcome:
    started: float
    ended: float
    first_token: float | None
    error: str = ""  # empty: the stream ended normally with [DONE]
    hung: bool = False


@dataclass
class Load:
    """Streams running back to back on `streams` threads until stopped; every request's outcome."""

    client: OpenAI
    model: str
    streams: int
    outcomes: list[Outcome] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _one(self) -> Outcome:
        started, first = time.monotonic(), None
        try:
            for chunk in self.client.chat.completions.create(model=self.model, messages=PROMPT, max_tokens=48,
                                                             stream=True, temperature=0):
                if first is None and chunk.choices and chunk.choices[0].delta.content:
                    first = time.monotonic()
        except (httpx.ReadTimeout, openai.APITimeoutError) as e:
            return Outcome(started, time.monotonic(), first, error=type(e).__name__, hung=True)
        except Exception as e:  # noqa: BLE001 - every failure a user would see is counted, by its class
            return Outcome(started, time.monotonic(), first, error=f"{type(e).__name__}: {str(e)[:400]}")
        return Outcome(started, time.monotonic(), first)

    def _loop(self) -> None:
        while not self.stop.is_set():
            outcome = self._one()
            with self.lock:
                self.outcomes.append(outcome)

    def start(self) -> list[threading.Thread]:
        threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(self.streams)]
        for t in threads:
            t.start()
        return threads


@dataclass
class DirectLoad(Load):
    """Load's streams straight to Serve's route for the deployment (no gateway, so no retry), `client` an
    httpx.Client with that route as its base URL: what a client of Serve itself sees, and, with `out`, every error
    answer's status and whole body as Serve sent it, and every stream that carried an error event, to that event
    (serve-errors.jsonl: the gateway's test fixtures of Serve's errors come from there)."""

    out: Path | None = None

    def _one(self) -> Outcome:
        started, first = time.monotonic(), None
        body = {"model": self.model, "messages": PROMPT, "max_tokens": 48, "stream": True, "temperature": 0}
        try:
            with self.client.stream("POST", "chat/completions", json=body) as r:
                if r.status_code != 200:
                    self._keep(r.status_code, r.read())
                    return Outcome(started, time.monotonic(), None, error=f"HTTP {r.status_code}")
                seen = []
                for line in r.iter_lines():
                    seen.append(line)
                    if first is None and line.startswith("data: {") and '"content":"' in line \
                            and '"content":""' not in line:
                        first = time.monotonic()
                    if line.startswith("data: {") and '"error"' in line:
                        self._keep(r.status_code, "\n".join(seen).encode())
                        return Outcome(started, time.monotonic(), first, error="error event")
        except httpx.TimeoutException as e:
            return Outcome(started, time.monotonic(), first, error=type(e).__name__, hung=True)
        except httpx.HTTPError as e:
            return Outcome(started, time.monotonic(), first, error=type(e).__name__)
        return Outcome(started, time.monotonic(), first)

    def _keep(self, status: int, payload: bytes) -> None:
        if self.out:
            with self.lock, open(self.out / "serve-errors.jsonl", "a") as f:
                f.write(json.dumps({"at": time.time(), "status": status,
                                    "body": payload.decode(errors="replace")}) + "\n")


def gateway_retries(metrics_url: str) -> dict[str, float]:
    """The gateway's retries so far, by reason (tandem_gateway_upstream_retries_total)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(metrics_url, timeout=10).text):
        for sample in family.samples:
            if sample.name == "tandem_gateway_upstream_retries_total":
                reason = sample.labels["reason"]
                out[reason] = out.get(reason, 0) + sample.value
    return out


def _increase(before: dict, after: dict) -> dict:
    return {k: after[k] - before.get(k, 0) for k in sorted(after) if after[k] - before.get(k, 0)}


class Ray:
    """The local head's dashboard: Serve's application status and the replica actors' process ids."""

    def __init__(self, state: dict):
        token = Path(state["token_file"]).read_text().strip()
        self.state = state
        self.http = httpx.Client(base_url=state["dashboard_url"], headers={"Authorization": f"Bearer {token}"},
                                 timeout=30)

    def replica_pids(self, app: str, stage: str) -> set[int]:
        """The ALIVE Serve replica actors of `app`'s prefill or decode deployment."""
        r = self.http.get("/api/v0/actors", params={"limit": 10000, "detail": "true"})
        r.raise_for_status()
        actors = r.json()["data"]["result"]["result"]
        return {a["pid"] for a in actors if a.get("state") == "ALIVE" and f"ServeReplica:{app}:" in
                a.get("class_name", "") and stage.capitalize() in a.get("class_name", "")}

    def app_running(self, app: str) -> bool:
        r = self.http.get("/api/serve/applications/")
        r.raise_for_status()
        a = (r.json().get("applications") or {}).get(app) or {}
        deployments = (a.get("deployments") or {}).values()
        return a.get("status") == "RUNNING" and all(d.get("status") == "HEALTHY" for d in deployments)


def _answers(client: OpenAI, model: str) -> bool:
    try:
        r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
        return bool(r.choices)
    except Exception:  # noqa: BLE001 - not answering yet, whatever the reason
        return False


def tandem_restart(stage: str, deployment_id: int) -> None:
    """Ask Serve to replace the stage's replicas as the reconciler does (workers.targets.ray.RayTarget.restart_stage),
    through the control plane's own code and database (DATABASE_URL)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings.local")
    import django
    django.setup()
    from deployments.models import Deployment
    from workers.targets import target_for
    d = Deployment.objects.select_related("cluster").get(pk=deployment_id)
    step = target_for(d.cluster).restart_stage(d, stage)
    if not step.ready:
        raise SystemExit(step.message)


def kill_and_recover(*, ray: Ray, app: str, stage: str, probe: OpenAI, model: str, timeout: float,
                     out: Path | None = None, restart_deployment: int | None = None) -> dict:
    """SIGKILL the stage's replica process (or, with `restart_deployment`, have Tandem restart it); seconds until
    Serve runs a new one and the gateway answers again."""
    pids = ray.replica_pids(app, stage)
    if len(pids) != 1:
        raise SystemExit(f"expected one ALIVE {stage} replica of {app}, found {sorted(pids)}")
    pid = pids.pop()
    killed = time.monotonic()
    if restart_deployment is None:
        os.kill(pid, signal.SIGKILL)
    else:
        tandem_restart(stage, restart_deployment)
    replaced = serving = None
    saved = False
    while time.monotonic() - killed < timeout:
        if not saved and time.monotonic() - killed > 20:
            save_metrics(out, ray=ray, label=f"during-{stage}{'-restart' if restart_deployment else ''}")
            saved = True
        now_pids = ray.replica_pids(app, stage)
        if replaced is None and now_pids and pid not in now_pids and ray.app_running(app):
            replaced = time.monotonic()
        if replaced is not None and _answers(probe, model):
            serving = time.monotonic()
            break
        time.sleep(1)
    return {"stage": stage, "pid": pid, "killed": killed,
            "replica_back_s": None if replaced is None else round(replaced - killed, 1),
            "healthy_s": None if serving is None else round(serving - killed, 1)}


def summary(outcomes: list[Outcome], *, since: float, until: float) -> dict:
    """What the requests that were in flight or started in [since, until) saw."""
    window = [o for o in outcomes if o.ended >= since and o.started < until]
    before_first = [o for o in window if o.first_token is None]
    after_first = [o for o in window if o.first_token is not None]
    return {
        "requests": len(window),
        "ok": sum(1 for o in window if not o.error),
        "failed_before_first_token": sum(1 for o in before_first if o.error and not o.hung),
        "cut_after_first_token": sum(1 for o in after_first if o.error and not o.hung),
        "cut_with_error_event": sum(1 for o in after_first if o.error.startswith("APIError:")),
        "hung": sum(1 for o in window if o.hung),
        "slowest_s": round(max((o.ended - o.started for o in window), default=0.0), 1),
        "errors": sorted({o.error for o in window if o.error}),
    }


def save_metrics(out: Path | None, *, ray: Ray, label: str) -> None:
    """The metrics text as Tandem's scraper reads it."""
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"metrics-{label}.txt").write_text(httpx.get(ray.state["metrics_url"], timeout=30).text)


def save_evidence(out: Path, *, ray: Ray, label: str) -> None:
    """The metrics text and the Serve replicas' logs after one kill's recovery."""
    save_metrics(out, ray=ray, label=f"after-{label}")
    logs = Path(ray.state["temp_dir"]) / "session_latest" / "logs" / "serve"
    dest = out / f"serve-logs-after-{label}"
    for f in logs.glob("replica_*.log"):
        dest.mkdir(exist_ok=True)
        shutil.copy(f, dest / f.name)
    # The engines' own log lines (vLLM logs to the worker processes' stderr), NIXL's among them.
    with open(out / f"nixl-lines-after-{label}.txt", "w") as nixl:
        for f in sorted(logs.parent.glob("worker-*.err")):
            for line in f.read_text(errors="replace").splitlines():
                if "nixl" in line.lower() or "kv_transfer" in line.lower():
                    nixl.write(f"{f.name}: {line}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gateway", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--state", required=True, help="the local Ray head's ray-cluster.json")
    parser.add_argument("--app", required=True, help="the deployment's Serve application (tdm-<id>-<name>)")
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--baseline", type=float, default=30.0)
    parser.add_argument("--settle", type=float, default=20.0, help="load kept on after each recovery")
    parser.add_argument("--recover-timeout", type=float, default=900.0)
    parser.add_argument("--hang-after", type=float, default=90.0, help="seconds without a byte that count as a hang")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--gateway-metrics", default="http://127.0.0.1:9801/metrics",
                        help="the gateway's metrics, for its retries by reason per phase")
    parser.add_argument("--direct-streams", type=int, default=0,
                        help="streams straight to Serve beside the gateway's (no retry; their errors kept in --out)")
    parser.add_argument("--kills", default="prefill,decode",
                        help="the stages to SIGKILL, one after another, each once it serves again")
    parser.add_argument("--no-tandem-restart", dest="tandem_restart", action="store_false",
                        help="skip the last phase: Tandem restarting the decode, as its reconciler does for a stale "
                             "NIXL peer")
    a = parser.parse_args()
    ray = Ray(json.loads(Path(a.state).read_text()))
    timeout = httpx.Timeout(a.hang_after, connect=10)
    load = Load(OpenAI(base_url=a.gateway, api_key=a.key, max_retries=0, timeout=timeout), a.model, a.streams)
    probe = OpenAI(base_url=a.gateway, api_key=a.key, max_retries=0, timeout=30)
    deployment_id = int(a.app.split("-")[1])  # tdm-<id>-<name>
    direct = DirectLoad(httpx.Client(base_url=f"{ray.state['serve_http_url']}/d/{deployment_id}/v1/", timeout=timeout),
                        a.model, a.direct_streams, out=a.out)
    started = time.monotonic()
    threads = load.start() + direct.start()
    time.sleep(a.baseline)
    save_metrics(a.out, ray=ray, label="baseline")
    report = {"streams": a.streams, "direct_streams": a.direct_streams, "hang_after_s": a.hang_after,
              "baseline": summary(load.outcomes, since=started, until=time.monotonic())}
    stages = a.kills.split(",")
    phases = [(stage if stages.count(stage) == 1 else f"{stage}_{n}", stage, None)
              for n, stage in enumerate(stages, 1)]
    if a.tandem_restart:
        phases.append(("decode_restarted_by_tandem", "decode", deployment_id))
    for label, stage, restart in phases:
        retries = gateway_retries(a.gateway_metrics)
        kill = kill_and_recover(ray=ray, app=a.app, stage=stage, probe=probe, model=a.model,
                                timeout=a.recover_timeout, out=a.out, restart_deployment=restart)
        time.sleep(a.settle)
        killed = kill.pop("killed")
        report[label] = {**kill, **summary(load.outcomes, since=killed, until=time.monotonic()),
                         "gateway_retries": _increase(retries, gateway_retries(a.gateway_metrics))}
        if direct.streams:
            report[label]["straight_to_serve"] = summary(direct.outcomes, since=killed, until=time.monotonic())
        if a.out:
            save_evidence(a.out, ray=ray, label=label)
    load.stop.set()
    direct.stop.set()
    for t in threads:
        t.join(timeout=a.hang_after + 30)
    print(json.dumps(report, indent=2))
    if a.out:
        (a.out / "report.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
