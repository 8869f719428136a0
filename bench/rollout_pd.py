"""Rollouts on the real local PD stack under constant streaming load through the gateway: new weights roll out
side by side with zero failed requests and no request served by mixed generations; a new generation that fails
its conformance run, and one slower than the spec allows, each roll back with zero failed requests.

    ./tandem test bench/rollout_pd.py -m pd -s          # or, with the suite's environment set up by hand:
    .venv/bin/python -m pytest -p no:cacheprovider -m pd -s bench/rollout_pd.py

Not part of the suite (it takes 20-30 minutes on 2 cores: every generation loads vLLM twice). It prints one row
per rollout: requests, failed, duration, peak extra replicas per pool, the generations that answered, and the
traffic steps in the events; bench/README.md records a run.
"""
import subprocess
import threading
import time
from collections import Counter

import httpx
import pytest
from openai import OpenAI

from deployments.models import Cluster, Deployment, Membership
from deployments.services import actions
from deployments.services.api_keys import api_key_create
from tests.conftest import redis_client  # noqa: F401 - a fixture
from tests.e2e.conftest import (MODEL, ROOT, RUNTIME, _auth, local_cluster_config, local_ray,  # noqa: F401 - fixtures
                                no_application_outlives_its_test, tiny_variant)
from tests.factories import MembershipFactory, TeamFactory, local_spec_input
from tests.support.processes import Worker, start_gateway, stop_at_end, wait_for, worker_environment  # noqa: F401
from usage.tasks import drain_request_records

pytestmark = [pytest.mark.pd, pytest.mark.e2e, pytest.mark.timeout(3600)]
CLIENTS = 4  # concurrent streams, constantly
ROLLOUT = {"steps": [10, 50, 100], "step_seconds": 30}
PROMPT = [{"role": "user", "content": "Write one sentence about the sea."}]


class Load:
    """CLIENTS threads streaming chats through the gateway back to back; each request's outcome and the generation
    its response names (`x-tandem-generation`)."""

    def __init__(self, base_url: str, key: str):
        self.client = OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=180)
        self.results: list[dict] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(CLIENTS)]

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=240)

    def _run(self):
        while not self.stop.is_set():
            started = time.monotonic()
            out = {"started": started, "generation": None, "error": None, "text": ""}
            try:
                raw = self.client.chat.completions.with_raw_response.create(
                    model="tiny-llama", messages=PROMPT, max_tokens=24, temperature=0, stream=True)
                out["generation"] = raw.headers.get("x-tandem-generation")
                for chunk in raw.parse():
                    if chunk.choices and chunk.choices[0].delta.content:
                        out["text"] += chunk.choices[0].delta.content
            except Exception as e:  # noqa: BLE001 - every failure a user would see counts
                out["error"] = f"{type(e).__name__}: {e}"[:300]
            out["ended"] = time.monotonic()
            self.results.append(out)

    def since(self, t: float) -> list[dict]:
        return [r for r in self.results if r["started"] >= t]


class Background:
    """A loop on a thread of its own for the length of a `with` block (`_run` watches `self.stop`)."""

    def __init__(self):
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=30)

    def _run(self):
        raise NotImplementedError


class Drain(Background):
    """What beat does every 5 s in production: the gateway's request records into PostgreSQL, where the rollout's
    judge reads them (here every second)."""

    def _run(self):
        while not self.stop.wait(1.0):
            drain_request_records()


class Replicas(Background):
    """The most Prefill and Decode replicas of the deployment's applications that Serve ran at once (polled)."""

    def __init__(self, state: dict, pk: int):
        super().__init__()
        self.state, self.pk = state, pk
        self.peak = {"prefill": 0, "decode": 0}

    def _run(self):
        http = httpx.Client(timeout=30, headers=_auth(self.state))
        while not self.stop.is_set():
            apps = http.get(f"{self.state['dashboard_url']}/api/serve/applications/").json().get("applications") or {}
            now = {"prefill": 0, "decode": 0}
            for name, app in apps.items():
                if not name.startswith(f"tdm-{self.pk}-"):
                    continue
                for dep, details in (app.get("deployments") or {}).items():
                    pool = "prefill" if dep.startswith("Prefill") else "decode" if dep.startswith("Decode") else None
                    if pool:
                        now[pool] += sum(1 for r in details.get("replicas") or []
                                         if r.get("state") in ("RUNNING", "STARTING", "PENDING_MIGRATION"))
            self.peak = {p: max(self.peak[p], now[p]) for p in now}
            time.sleep(0.5)


def _update(d: Deployment, admin, source: str) -> Deployment:
    spec = local_spec_input(model={"id": "tiny-llama", "source": source},
                            engine={"max_model_len": 1024, "dtype": "bfloat16"}, rollout=ROLLOUT)
    actions.deployment_update(actor=d.requested_by, deployment=d, spec=spec)
    d = Deployment.objects.get(pk=d.pk)
    actions.deployment_approve(actor=admin, deployment=d, generation=d.generation, proposed_hash=d.proposed_spec_hash)
    return Deployment.objects.get(pk=d.pk)


def _roll(state, d, admin, load: Load, source: str, name: str) -> dict:
    """One update through its rollout to the end, under the load; the row of figures."""
    started = time.monotonic()
    with Replicas(state, d.pk) as replicas:
        d = _update(d, admin, source)
        wait_for(lambda: Deployment.objects.get(pk=d.pk).status == "running", timeout=1500, every=2,
                 what=f"the {name} rollout to end")
        time.sleep(3)  # requests started before the end finish
    d = Deployment.objects.get(pk=d.pk)
    r = d.rollouts.first()
    results = [x for x in load.since(started) if x["ended"] <= time.monotonic()]
    steps = list(d.events.filter(kind="rollout_step", created_at__gte=r.created_at).order_by("created_at", "id")
                 .values_list("after__weight", flat=True))
    return {"rollout": name, "state": r.state, "requests": len(results),
            "failed": sum(1 for x in results if x["error"]), "errors": Counter(x["error"] for x in results
                                                                               if x["error"]).most_common(3),
            "seconds": round(time.monotonic() - started), "peak_replicas": replicas.peak,
            "peak_surge": r.peak_surge, "generations": dict(Counter(x["generation"] for x in results)),
            "unnamed": sum(1 for x in results if not x["error"] and not x["generation"]),
            "steps": steps, "reason": r.reason, "from": r.from_generation, "to": r.to_generation,
            "results": results, "deployment": d}


def test_rollouts_under_streaming_load(transactional_db, redis_client, local_ray, tiny_variant, tmp_path,  # noqa: F811
                                       stop_at_end):
    models = RUNTIME / "models"
    subprocess.run([str(RUNTIME / "venv" / "bin" / "python"), str(ROOT / "bench" / "rollout_models.py"), str(MODEL),
                    str(models)], check=True, timeout=600)
    team = TeamFactory(slug="ml", gpu_quota=0)
    member = MembershipFactory(team=team, role=Membership.Role.MEMBER).user
    admin = MembershipFactory(team=team, role=Membership.Role.ADMIN).user
    cluster = Cluster.objects.create(name="local", kind=Cluster.Kind.RAY, secret_ref=local_ray["secret_ref"],
                                     config=local_cluster_config(local_ray))
    gateway = stop_at_end(start_gateway(tmp_path))
    stop_at_end(Worker(worker_environment(tmp_path, TANDEM_GATEWAY_BASE_URL=f"{gateway.base_url}/v1",
                                          TANDEM_TASK_TIME_LIMIT="300", TANDEM_RECONCILE_REQUEUE_SECONDS="1")).start())
    spec = local_spec_input(model={"id": "tiny-llama", "source": str(MODEL)},
                            engine={"max_model_len": 1024, "dtype": "bfloat16"}, rollout=ROLLOUT)
    d = actions.deployment_request(actor=member, team=team, cluster=cluster, name="tiny", spec=spec)
    actions.deployment_approve(actor=admin, deployment=d, generation=d.generation)
    wait_for(lambda: Deployment.objects.get(pk=d.pk).endpoint_access == "open"
             and Deployment.objects.get(pk=d.pk).status == "running", timeout=1200, every=2, what="gen 1 open")
    d = Deployment.objects.get(pk=d.pk)
    _, secret = api_key_create(actor=member, team=team, name="bench", all_deployments=False, deployments=[d])
    rows = []
    with Drain(), Load(f"{gateway.base_url}/v1", secret) as load:
        wait_for(lambda: len(load.results) >= 10, timeout=120, what="the load to run")
        rows.append(_roll(local_ray, d, admin, load, str(tiny_variant), "new weights"))
        d = rows[-1]["deployment"]
        rows.append(_roll(local_ray, d, admin, load, str(models / "tiny-llama-nochat"), "fails conformance"))
        d = rows[-1]["deployment"]
        rows.append(_roll(local_ray, d, admin, load, str(models / "tiny-llama-slow"), "slower"))
    print(f"\nrollouts on the local PD stack, {CLIENTS} concurrent streams through the gateway, steps 10/50/100, "
          f"{ROLLOUT['step_seconds']} s a step:")
    for row in rows:
        print(f"  {row['rollout']:18} {row['state']:12} gen {row['from']}→{row['to']}  requests {row['requests']:4}  "
              f"failed {row['failed']}  {row['seconds']:4} s  peak replicas {row['peak_replicas']}  "
              f"peak surge {row['peak_surge']}  answered by {row['generations']}  steps {row['steps']}")
        print(f"  {'':18} {row['reason']}")
        if row["errors"]:
            print(f"  {'':18} errors: {row['errors']}")
    weights, nochat, slow = rows
    assert (weights["state"], nochat["state"], slow["state"]) == ("done", "rolled_back", "rolled_back")
    for row in rows:
        assert row["failed"] == 0, row["errors"]
        assert row["unnamed"] == 0  # every answer names the one generation that served it
        assert row["peak_surge"] == {"prefill": 1, "decode": 1} or row["rollout"] == "fails conformance"
        assert max(row["peak_replicas"].values()) <= 2
    assert weights["steps"] == [0, 10, 50, 100]
    assert set(weights["generations"]) == {"1", "2"}
    # Once done, only generation 2 answers; a rolled-back one leaves the old generation serving every request.
    for row, serving in ((weights, "2"), (nochat, "2"), (slow, "2")):
        tail = [x for x in row["results"] if x["started"] > row["results"][-1]["started"] - 2]
        assert {x["generation"] for x in tail} == {serving}, (row["rollout"], tail)
