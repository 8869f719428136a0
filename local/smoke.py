#!/usr/bin/env python3
"""End-to-end smoke test of the local PD target over plain HTTP (httpx), like the control plane does.

    $TANDEM_RUNTIME_DIR/venv/bin/python local/smoke.py [--bad model|engine|schema|architecture ...] [--save-examples]

Needs a running head (local/ray_cluster.py start) and the tiny model (local/build_tiny_model.py).
Steps: PUT local/pd_serve_config.json to the dashboard (Authorization: Bearer <token from the token file>),
poll GET /api/serve/applications/ until RUNNING, one chat completion and one streamed completion with
stream_options.include_usage to Serve's HTTP port, scrape the metrics port and assert KV really moved over
NIXL (decode's prompt tokens from external_kv_transfer > 0, NIXL bytes > 0), DELETE the application and
confirm none are left. With --bad KIND it then PUTs a broken variant (model: a model path that does not
exist; engine: max_model_len beyond the model; schema: an LLMConfig that fails validation; architecture: a
model whose config.json names an architecture vLLM does not have) and times
DEPLOY_FAILED. With --save-examples it writes local/examples/*.json and *.prom.
Exit status 0 only when every assertion held.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import re
import sys
import threading
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
RT = Path(os.environ.get("TANDEM_RUNTIME_DIR") or os.path.expanduser("~/.cache/tandem/pd-runtime"))
EXAMPLES = HERE / "examples"
T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[smoke {time.monotonic() - T0:6.1f}s] {msg}", flush=True)


class MemSampler(threading.Thread):
    """Samples system memory in use (MemTotal - MemAvailable) to report the peak."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak = 0
        self.baseline = self.used()
        self._stop = threading.Event()

    @staticmethod
    def used() -> int:
        info = {}
        for line in Path("/proc/meminfo").read_text().splitlines():
            k, v = line.split(":", 1)
            info[k] = int(v.split()[0]) * 1024
        return info["MemTotal"] - info["MemAvailable"]

    def run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.used())
            time.sleep(0.5)

    def stop(self) -> None:
        self._stop.set()


def unsupported_model(model: Path) -> Path:
    """A copy of `model` whose config.json names an architecture vLLM does not know: its config reads (so a
    control plane's preflight passes), and vLLM refuses it when it builds the engine config."""
    import shutil

    copy_dir = model.parent / f"{model.name}-unsupported"
    shutil.rmtree(copy_dir, ignore_errors=True)
    shutil.copytree(model, copy_dir)
    config = json.loads((copy_dir / "config.json").read_text())
    config["architectures"] = ["TandemUnsupportedForCausalLM"]
    (copy_dir / "config.json").write_text(json.dumps(config, indent=2))
    return copy_dir


def redact(obj, token: str):
    text = json.dumps(obj, indent=2, sort_keys=True)
    if token:
        text = text.replace(token, "<REDACTED>")
    return text + "\n"


def parse_metrics(text: str) -> list[tuple[str, dict, float]]:
    out = []
    pat = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+([^\s]+)')
    lab = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = pat.match(line)
        if not m:
            continue
        try:
            val = float(m.group(4))
        except ValueError:
            continue
        out.append((m.group(1), dict(lab.findall(m.group(3) or "")), val))
    return out


def metric_sum(samples, name: str, **labels) -> float:
    total = 0.0
    for n, lbl, v in samples:
        if n != name:
            continue
        ok = True
        for k, want in labels.items():
            got = lbl.get(k, "")
            if callable(want):
                ok = ok and want(got)
            else:
                ok = ok and got == want
        if ok:
            total += v
    return total


SERVE_FAMILIES_KEPT = (
    "ray_serve_deployment_processing_latency_ms", "ray_serve_deployment_request_counter",
    "ray_serve_deployment_error_counter", "ray_serve_num_http_requests", "ray_serve_http_request_latency_ms",
    "ray_serve_num_http_error_requests", "ray_serve_replica_processing_queries", "ray_serve_deployment_status",
    "ray_serve_deployment_replica_healthy", "ray_serve_num_ongoing_requests_at_replicas",
    "ray_serve_deployment_queued_queries", "ray_serve_num_ongoing_http_requests",
)


# Histograms whose buckets are kept, in priority order, while the file stays under the size limit.
KEY_HISTOGRAMS = (
    "ray_vllm_time_to_first_token_seconds", "ray_vllm_inter_token_latency_seconds",
    "ray_vllm_nixl_xfer_time_seconds", "ray_vllm_nixl_bytes_transferred", "ray_vllm_e2e_request_latency_seconds",
    "ray_vllm_request_queue_time_seconds", "ray_vllm_request_prefill_time_seconds",
    "ray_vllm_request_decode_time_seconds", "ray_serve_deployment_processing_latency_ms")


def filtered_scrape(text: str, replica_ids: set[str], limit: int = 100_000) -> str:
    """ray_vllm_* and the ray_serve_* families a control plane reads, under `limit` bytes.

    Series of replicas that are gone (Ray keeps exporting them) are left out: only `replica_ids`."""
    def wanted(line: str) -> bool:
        name = re.sub(r"^# (HELP|TYPE) ", "", line).split("{")[0].split(" ")[0]
        if not (name.startswith("ray_vllm_") or name.startswith(SERVE_FAMILIES_KEPT)):
            return False
        m = re.search(r'ReplicaId="([^"]*)"', line)
        return m is None or m.group(1).split("#")[-1] in replica_ids
    keep = [l for l in text.splitlines() if wanted(l)]
    body = "\n".join(keep) + "\n"
    if len(body.encode()) > limit:  # no buckets, then add back those of KEY_HISTOGRAMS while they fit
        base = [l for l in keep if "_bucket{" not in l]
        size = sum(len(l) + 1 for l in base)
        allowed = set()
        for fam in KEY_HISTOGRAMS:
            extra = sum(len(l) + 1 for l in keep if l.startswith(fam + "_bucket{"))
            if size + extra < limit:
                allowed.add(fam + "_bucket{")
                size += extra
        keep = [l for l in keep if "_bucket{" not in l or l.startswith(tuple(allowed))]
        body = "\n".join(keep) + "\n"
    return body


def wait_status(client: httpx.Client, dash: str, app: str, want: set[str], timeout: float,
                seen: list | None = None) -> tuple[str, dict, float]:
    t0 = time.monotonic()
    last = None
    body: dict = {}
    while True:
        r = client.get(f"{dash}/api/serve/applications/")
        r.raise_for_status()
        body = r.json()
        a = body.get("applications", {}).get(app)
        status = a["status"] if a else "ABSENT"
        deps = {k: v.get("status") for k, v in (a or {}).get("deployments", {}).items()}
        if (status, deps) != last:
            log(f"  {app}: {status} {deps} (+{time.monotonic() - t0:.1f}s)")
            last = (status, deps)
            if seen is not None:
                seen.append((round(time.monotonic() - t0, 1), status, deps))
        if status in want:
            return status, body, time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"{app} still {status} after {timeout}s: {json.dumps(a)[:2000]}")
        time.sleep(2)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=str(HERE / "pd_serve_config.json"))
    ap.add_argument("--model-path", default=str(RT / "models" / "tiny-llama"))
    ap.add_argument("--state", default=str(RT / "ray-cluster.json"))
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--bad", action="append", default=[], choices=["model", "engine", "schema", "architecture"],
                    help="after the good run, PUT a broken variant and time DEPLOY_FAILED (repeatable)")
    ap.add_argument("--save-examples", action="store_true")
    ap.add_argument("--requests", type=int, default=3, help="extra streamed requests for latency numbers")
    a = ap.parse_args()

    st = json.loads(Path(a.state).read_text())
    dash, metrics_url = st["dashboard_url"], st["metrics_url"]
    token = Path(st["token_file"]).read_text().strip()
    auth = {"Authorization": f"Bearer {token}"}
    cfg = json.loads(Path(a.config).read_text())
    for stage in ("prefill_config", "decode_config"):
        cfg["applications"][0]["args"][stage]["model_loading_config"]["model_source"] = a.model_path
    app = cfg["applications"][0]["name"]
    model_id = cfg["applications"][0]["args"]["decode_config"]["model_loading_config"]["model_id"]
    # The application answers under its own route prefix (a shared cluster holds one per deployment).
    prefix = cfg["applications"][0].get("route_prefix", "/").rstrip("/")
    serve = f"http://{cfg['http_options']['host']}:{cfg['http_options']['port']}{prefix}"
    mem = MemSampler()
    mem.start()
    results: dict = {"baseline_mem_used_gib": round(mem.baseline / 2**30, 2)}
    failures: list[str] = []

    dc = httpx.Client(timeout=30, headers=auth)
    # Token checks against the dashboard REST API.
    r = httpx.get(f"{dash}/api/serve/applications/", timeout=10)
    log(f"dashboard without token -> {r.status_code} {r.text[:80]!r}")
    r = httpx.get(f"{dash}/api/serve/applications/", timeout=10, headers={"Authorization": "Bearer wrong"})
    log(f"dashboard with a wrong token -> {r.status_code} {r.text[:80]!r}")
    r = httpx.get(f"{dash}/api/serve/applications/", timeout=10, headers={"X-Ray-Authorization": f"Bearer {token}"})
    log(f"dashboard with X-Ray-Authorization -> {r.status_code}")
    r = dc.get(f"{dash}/api/serve/applications/")
    log(f"dashboard with Authorization: Bearer -> {r.status_code}")
    r.raise_for_status()
    if a.save_examples:
        EXAMPLES.mkdir(exist_ok=True)
        (EXAMPLES / "applications-empty.json").write_text(redact(r.json(), token))

    try:
        log(f"PUT {dash}/api/serve/applications/ ({app}, model {a.model_path})")
        t_put = time.monotonic()
        r = dc.put(f"{dash}/api/serve/applications/", json=cfg)
        log(f"  -> {r.status_code} {r.text[:200]!r}")
        r.raise_for_status()
        seen: list = []
        status, body, waited = wait_status(dc, dash, app, {"RUNNING", "DEPLOY_FAILED", "UNHEALTHY"},
                                           a.timeout, seen)
        results["seconds_to_running"] = round(time.monotonic() - t_put, 1)
        results["status_transitions"] = seen
        if status != "RUNNING":
            log(json.dumps(body, indent=2)[:4000])
            raise RuntimeError(f"application ended {status}")
        log(f"RUNNING after {results['seconds_to_running']}s")
        if a.save_examples:
            (EXAMPLES / "applications-running.json").write_text(redact(body, token))

        r = dc.get(f"{dash}/api/v0/placement_groups", params={"detail": "true", "limit": 100})
        if r.status_code == 200:
            pgs = r.json().get("data", {}).get("result", {}).get("result", [])
            for pg in pgs:
                if pg.get("state") == "CREATED":
                    log(f"placement group {pg.get('name') or pg.get('placement_group_id')}: "
                        f"{[b.get('unit_resources') for b in pg.get('bundles', [])]}")
            results["placement_groups"] = [[b.get("unit_resources") for b in pg.get("bundles", [])]
                                           for pg in pgs if pg.get("state") == "CREATED"]
        r = dc.get(f"{dash}/api/cluster_status")
        if r.status_code == 200:
            usage = r.json().get("data", {}).get("clusterStatus", {}).get("loadMetricsReport", {}).get("usage", {})
            log(f"cluster resource usage (used, total): { {k: v for k, v in usage.items() if 'pool' in k or k == 'CPU'} }")

        sc = httpx.Client(timeout=120)  # Serve's HTTP port: no Ray token needed (checked below)
        r = sc.get(f"{serve}/v1/models")
        log(f"GET {serve}/v1/models without any token -> {r.status_code} {[m['id'] for m in r.json().get('data', [])]}")

        before = parse_metrics(httpx.get(metrics_url, timeout=30).text)

        # 1) one chat completion
        t = time.monotonic()
        r = sc.post(f"{serve}/v1/chat/completions", json={
            "model": model_id, "messages": [{"role": "user", "content": "Hello! Say something about KV caches."}],
            "max_tokens": 16, "temperature": 0})
        chat_s = time.monotonic() - t
        r.raise_for_status()
        cj = r.json()
        log(f"chat completion {r.status_code} in {chat_s:.2f}s, usage {cj.get('usage')}, "
            f"text {cj['choices'][0]['message']['content'][:60]!r}")
        results["chat_e2e_s"] = round(chat_s, 3)
        results["chat_usage"] = cj.get("usage")

        # 2) streamed completions with include_usage
        prompt = ("the prefill stage computes the KV cache for the whole prompt and NIXL moves those blocks to "
                  "the decode stage, which then generates the reply token by token. ") * 2
        ttfts, e2es, usages = [], [], []
        for i in range(1 + max(0, a.requests)):
            t = time.monotonic()
            ttft = None
            usage = None
            chunks = 0
            text = ""
            done = False
            with sc.stream("POST", f"{serve}/v1/completions", json={
                    "model": model_id, "prompt": f"Request {i} of {time.time():.6f}: " + prompt, "max_tokens": 32, "temperature": 0,
                    "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}) as resp:
                resp.raise_for_status()
                for line in resp.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[6:]
                    if data == "[DONE]":
                        done = True
                        break
                    j = json.loads(data)
                    if j.get("choices") and j["choices"][0].get("text"):
                        if ttft is None:
                            ttft = time.monotonic() - t
                        chunks += 1
                        text += j["choices"][0]["text"]
                    if j.get("usage"):
                        usage = j["usage"]
            e2e = time.monotonic() - t
            if not done or usage is None or ttft is None:
                failures.append(f"stream {i}: done={done} usage={usage} ttft={ttft}")
            ttfts.append(ttft or 0.0)
            e2es.append(e2e)
            usages.append(usage)
            log(f"stream #{i}: TTFT {ttft if ttft is None else round(ttft, 3)}s, e2e {e2e:.3f}s, "
                f"{chunks} chunks, usage {usage}, [DONE]={done}")
        results["stream_ttft_s"] = [round(x, 3) for x in ttfts]
        results["stream_e2e_s"] = [round(x, 3) for x in e2es]
        results["stream_usage"] = usages[0]

        # Map Serve replica ids (the ReplicaId label of ray_vllm_*) to their deployment.
        apps = dc.get(f"{dash}/api/serve/applications/").json()["applications"][app]["deployments"]
        replica_dep = {rep["replica_id"]: dn for dn, d in apps.items() for rep in d.get("replicas", [])}
        decode_ids = {rid for rid, dn in replica_dep.items() if dn.startswith("Decode:")}

        def kv_numbers(samples):
            ext = sum(v for n, lbl, v in samples if n == "ray_vllm_prompt_tokens_by_source_total"
                      and lbl.get("source") == "external_kv_transfer"
                      and lbl.get("ReplicaId", "").split("#")[-1] in decode_ids)
            return (ext, metric_sum(samples, "ray_vllm_nixl_bytes_transferred_sum"),
                    metric_sum(samples, "ray_vllm_nixl_bytes_transferred_count"))

        ext_b, nixl_b, cnt_b = kv_numbers(before)
        prompt_tokens = [cj["usage"]["prompt_tokens"]] + [u["prompt_tokens"] for u in usages if u]
        n_req = len(prompt_tokens)
        expected_bytes = sum(-(-pt // 16) * 16 * 1024 for pt in prompt_tokens)
        t = time.monotonic()
        while True:  # Ray re-exports engine metrics every few seconds: wait until every request shows
            text = httpx.get(metrics_url, timeout=30).text
            after = parse_metrics(text)
            ext_a, nixl_a, cnt_a = kv_numbers(after)
            if (ext_a - ext_b >= sum(prompt_tokens) and cnt_a - cnt_b >= n_req) or time.monotonic() - t > 60:
                break
            time.sleep(2)
        log(f"metrics caught up after {time.monotonic() - t:.1f}s")
        by_source = {}
        for n, lbl, v in after:
            if n == "ray_vllm_prompt_tokens_by_source_total":
                rid = lbl.get("ReplicaId", "?").split("#")[-1]
                key = f"{replica_dep.get(rid, rid)}/{lbl.get('source')}"
                by_source[key] = by_source.get(key, 0) + v
        log(f"prompt_tokens_by_source_total: {by_source}")
        ext_kv, nixl_sum, nixl_cnt = ext_a - ext_b, nixl_a - nixl_b, cnt_a - cnt_b
        results["requests"] = n_req
        results["prompt_tokens"] = prompt_tokens
        results["decode_external_kv_transfer_tokens"] = ext_kv
        results["nixl_bytes"] = nixl_sum
        results["nixl_transfers"] = nixl_cnt
        results["nixl_bytes_per_request"] = round(nixl_sum / n_req, 1)
        results["nixl_bytes_expected_whole_blocks"] = expected_bytes
        log(f"decode prompt tokens from external_kv_transfer: {ext_kv:.0f} (prompts {prompt_tokens}, "
            f"sum {sum(prompt_tokens)}); NIXL {nixl_sum:.0f} bytes in {nixl_cnt:.0f} transfers for {n_req} "
            f"requests = {nixl_sum / n_req:.0f} bytes/request; whole 16-token blocks x 1,024 B/token "
            f"(2 K/V x 2 layers x 2 KV heads x 64 x 2 B) would be {expected_bytes} bytes in all")
        buckets = [(lbl.get("le"), v) for n, lbl, v in after if n == "ray_vllm_nixl_bytes_transferred_bucket"
                   and lbl.get("ReplicaId", "").split("#")[-1] in decode_ids]
        log(f"  decode's NIXL bytes-per-transfer histogram (le, cumulative count): {buckets}")
        for pt in prompt_tokens[:2]:
            log(f"  a {pt}-token prompt = {-(-pt // 16)} blocks = {-(-pt // 16) * 16 * 1024} bytes")
        if not ext_kv > 0:
            failures.append("decode's ray_vllm_prompt_tokens_by_source_total{source=external_kv_transfer} is 0")
        if not nixl_sum > 0:
            failures.append("ray_vllm_nixl_bytes_transferred_sum is 0")
        if a.save_examples:
            (RT / "last-scrape.prom").write_text(text)  # the whole scrape, outside the repo
            (EXAMPLES / "metrics-after-requests.prom").write_text(filtered_scrape(text, set(replica_dep)))
            log(f"saved metrics scrape ({(EXAMPLES / 'metrics-after-requests.prom').stat().st_size} bytes)")
    finally:
        results["peak_mem_used_gib"] = round(mem.peak / 2**30, 2)
        log(f"DELETE {dash}/api/serve/applications/")
        r = dc.delete(f"{dash}/api/serve/applications/")
        log(f"  -> {r.status_code} {r.text[:200]!r}")
        t = time.monotonic()
        while time.monotonic() - t < 120:
            body = dc.get(f"{dash}/api/serve/applications/").json()
            if not body.get("applications"):
                break
            time.sleep(2)
        left = body.get("applications") or {}
        log(f"applications left after DELETE: {list(left)} ({time.monotonic() - t:.1f}s)")
        results["seconds_to_delete"] = round(time.monotonic() - t, 1)
        if a.save_examples:
            (EXAMPLES / "applications-after-delete.json").write_text(redact(body, token))
        if left:
            failures.append(f"applications left after DELETE: {list(left)}")

    for kind in a.bad:
        bad = copy.deepcopy(cfg)
        args = bad["applications"][0]["args"]
        if kind == "model":  # a model source that does not exist
            what = str(RT / "models" / "does-not-exist")
            for stage in ("prefill_config", "decode_config"):
                args[stage]["model_loading_config"]["model_source"] = what
        elif kind == "engine":  # an engine setting vLLM refuses (longer than the model's 2,048 positions)
            what = "engine_kwargs.max_model_len=65536"
            for stage in ("prefill_config", "decode_config"):
                args[stage]["engine_kwargs"]["max_model_len"] = 65536
        elif kind == "architecture":  # a model whose config.json names an architecture vLLM does not have
            what = str(unsupported_model(Path(a.model_path)))
            for stage in ("prefill_config", "decode_config"):
                args[stage]["model_loading_config"]["model_source"] = what
        elif kind == "schema":  # an LLMConfig that fails validation when the app is built
            what = "placement_group_config with both bundles and bundle_per_worker"
            for stage in ("prefill_config", "decode_config"):
                args[stage]["placement_group_config"]["bundle_per_worker"] = {"CPU": 1}
        else:
            raise SystemExit(f"unknown --bad kind {kind}")
        log(f"bad {kind} check: PUT with {what}")
        t_put = time.monotonic()
        r = dc.put(f"{dash}/api/serve/applications/", json=bad)
        log(f"  -> {r.status_code} {r.text[:300]!r}")
        try:
            status, body, _ = wait_status(dc, dash, app, {"RUNNING", "DEPLOY_FAILED", "UNHEALTHY"}, a.timeout)
            secs = round(time.monotonic() - t_put, 1)
            results[f"bad_{kind}"] = {"status": status, "seconds": secs}
            aa = body["applications"][app]
            log(f"bad {kind}: {status} after {secs}s; app message: {aa.get('message', '')[-1500:]!r}")
            for dn, d in aa.get("deployments", {}).items():
                log(f"  deployment {dn}: {d.get('status')} {d.get('status_trigger')} "
                    f"...{d.get('message', '')[-400:]!r}")
            if a.save_examples:
                name = "applications-deploy-failed.json" if kind == "model" else f"applications-deploy-failed-{kind}.json"
                (EXAMPLES / name).write_text(redact(body, token))
            if status != "DEPLOY_FAILED":
                failures.append(f"bad {kind} ended {status}, expected DEPLOY_FAILED")
        finally:
            dc.delete(f"{dash}/api/serve/applications/")
            t = time.monotonic()
            while time.monotonic() - t < 120 and dc.get(f"{dash}/api/serve/applications/").json().get("applications"):
                time.sleep(2)
            log(f"bad {kind} app deleted ({time.monotonic() - t:.1f}s)")

    mem.stop()
    results["peak_mem_used_gib"] = round(max(mem.peak, 0) / 2**30, 2)
    print(json.dumps(results, indent=2))
    if failures:
        for f in failures:
            log(f"FAIL: {f}")
        return 1
    log("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
