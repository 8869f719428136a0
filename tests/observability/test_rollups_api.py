"""Scrapes and gateway timings into per-minute rollups, the latency API's contract, retention; the plan API."""
import datetime as dt

import httpx
import pytest
from django.utils import timezone

from observability.models import ScrapeState, StageRollup, ThroughputRollup, ValueRollup
from observability.rollups import gateway_rollup, rollups_prune
from observability.scraper import scrape_deployment
from tests.factories import ClusterFactory, DeploymentFactory, UserFactory
from tests.observability.helpers import as_application_of, fixture
from tests.observability.mock_openai import MockUpstream
from tests.observability.test_planner import LLAMA_8B
from tests.factories import spec_input
from usage.models import RequestRecord


def _deployment(team, upstream: MockUpstream | str):
    """A running deployment on a `ray` cluster scraped at `upstream` (whose fixture scrapes become its own)."""
    metrics_url = upstream if isinstance(upstream, str) else upstream.metrics_url
    cluster = ClusterFactory(kind="ray", config={"dashboard_url": "http://127.0.0.1:8265", "metrics_url": metrics_url})
    from deployments.spec import spec_parse
    from tests.factories import local_spec_input

    d = DeploymentFactory(team=team, cluster=cluster, status="running",
                          spec=spec_parse(local_spec_input(), target_kind="ray").to_dict())
    if not isinstance(upstream, str):
        upstream.metrics_bodies[:] = [as_application_of(b, d) for b in upstream.metrics_bodies]
    return d


def _scrape_twice(d, now):
    with httpx.Client() as client:
        first = scrape_deployment(deployment_id=d.pk, client=client, now=now - dt.timedelta(seconds=30))
        second = scrape_deployment(deployment_id=d.pk, client=client, now=now)
    return first, second


def test_first_scrape_sets_the_baseline_and_the_next_adds_the_increase(team):
    now = timezone.now()
    with MockUpstream(metrics_bodies=[fixture("pd-before.prom"), fixture("pd-after.prom")]) as m:
        d = _deployment(team, m)
        first, second = _scrape_twice(d, now)
    assert first["ok"] and first["rows"] == 0
    assert second["ok"] and second["rows"] > 0
    minute = now.replace(second=0, microsecond=0)
    ttft = StageRollup.objects.get(deployment=d, minute=minute, stage="ttft", pool="prefill")
    assert ttft.count == 9 and ttft.source == "engine" and len(ttft.counts) == len(ttft.bounds) + 1
    assert ValueRollup.objects.get(deployment=d, minute=minute, name="prompt_tokens:external_kv_transfer",
                                   pool="decode").value == 395
    # A third scrape in the same minute with nothing new adds nothing.
    with MockUpstream(metrics_bodies=[as_application_of(fixture("pd-after.prom"), d)]) as m2:
        d.cluster.config["metrics_url"] = m2.metrics_url
        d.cluster.save()
        with httpx.Client() as client:
            scrape_deployment(deployment_id=d.pk, client=client, now=now)
    assert StageRollup.objects.get(pk=ttft.pk).count == 9


def test_a_failed_scrape_is_recorded_not_raised(team):
    d = _deployment(team, "http://127.0.0.1:9/metrics")
    with httpx.Client(timeout=2) as client:
        out = scrape_deployment(deployment_id=d.pk, client=client, now=timezone.now())
    assert not out["ok"] and "metrics" in ScrapeState.objects.get(deployment=d).last_error


def _record(d, i, at, **kw):
    fields = dict(request_id=f"r{d.pk}-{i}", deployment=d, created_at=at, endpoint="chat.completions", stream=True,
                  status_code=200, prompt_tokens=10, completion_tokens=20, ttft_ms=100 + i, e2e_ms=600 + i,
                  mean_itl_ms=25)
    fields.update(kw)
    return RequestRecord.objects.create(**fields)


def test_latency_api_contract(team, member, api):
    now = timezone.now()
    with MockUpstream(metrics_bodies=[fixture("pd-before.prom"), fixture("pd-after.prom")]) as m:
        d = _deployment(team, m)
        _scrape_twice(d, now)
    for i in range(4):
        _record(d, i, now - dt.timedelta(seconds=5))
    _record(d, 9, now - dt.timedelta(seconds=5), status_code=502, ttft_ms=None, e2e_ms=5)  # counted, not timed
    gateway_rollup(since=now - dt.timedelta(minutes=10), until=now + dt.timedelta(minutes=1))
    gateway_rollup(since=now - dt.timedelta(minutes=10), until=now + dt.timedelta(minutes=1))  # idempotent

    api.force_authenticate(member)
    body = api.get(f"/api/v1/deployments/{d.pk}/latency/?window=15m").json()
    assert body["window"] == "15m" and body["bucket_seconds"] == 60
    assert [(s["stage"], s["source"]) for s in body["stages"]] == [
        ("queue", "engine"), ("prefill", "engine"), ("ttft", "engine"), ("kv_transfer", "engine"),
        ("decode", "engine"), ("itl", "engine"), ("e2e", "engine"), ("ttft", "gateway"), ("itl", "gateway"),
        ("e2e", "gateway")]
    for s in body["stages"]:
        assert s["unit"] == "ms" and len(s["points"]) == 15
        assert set(s["points"][0]) == {"t", "count", "p50", "p95", "p99"}
        dt.datetime.fromisoformat(s["points"][0]["t"])
    stage = {(s["stage"], s["source"]): [p for p in s["points"] if p["count"]] for s in body["stages"]}
    # Percentiles are read from the buckets as Prometheus's histogram_quantile does (linear inside the bucket
    # holding the rank), so the inputs fix them. Prefill's TTFT in pd-after.prom (replica h6eptvmm): 4 requests
    # up to 40 ms, 3 in (40, 60], 1 in (60, 80], 1 in (100, 250]. p50, rank 4.5: 40 + 20 * 0.5/3; p95, rank
    # 8.55: 100 + 150 * 0.55; p99, rank 8.91: 100 + 150 * 0.91.
    [ttft] = stage[("ttft", "engine")]
    assert ttft["count"] == 9
    assert (ttft["p50"], ttft["p95"], ttft["p99"]) == pytest.approx((40 + 20 * 0.5 / 3, 182.5, 236.5), abs=0.05)
    # The gateway's 100-103 ms: 100 in (75, 100], the other three in (100, 150]. p50, rank 2: 100 + 50 * 1/3;
    # p95, rank 3.8: 100 + 50 * 2.8/3; p99, rank 3.96: 100 + 50 * 2.96/3.
    [gw] = stage[("ttft", "gateway")]
    assert gw["count"] == 4
    assert (gw["p50"], gw["p95"], gw["p99"]) == pytest.approx(
        (100 + 50 / 3, 100 + 50 * 2.8 / 3, 100 + 50 * 2.96 / 3), abs=0.05)
    assert stage[("itl", "engine")][0]["count"] == 247
    empty = next(p for s in body["stages"] for p in s["points"] if not p["count"])
    assert empty["p50"] is None
    [tp] = [p for p in body["throughput"] if p["requests"]]
    assert tp == {"t": tp["t"], "requests": 5, "prompt_tokens": 50, "completion_tokens": 100}
    assert len(body["throughput"]) == 15

    for window, points in (("1h", 60), ("6h", 72), ("24h", 96)):
        assert len(api.get(f"/api/v1/deployments/{d.pk}/latency/?window={window}").json()["throughput"]) == points
    assert api.get(f"/api/v1/deployments/{d.pk}/latency/?window=2d").status_code == 400
    api.force_authenticate(UserFactory())
    assert api.get(f"/api/v1/deployments/{d.pk}/latency/?window=1h").status_code == 404


def test_retention_deletes_old_minutes_only(team):
    d = DeploymentFactory(team=team)
    now = timezone.now()
    for age in (1, 20):
        minute = (now - dt.timedelta(days=age)).replace(second=0, microsecond=0)
        StageRollup.objects.create(deployment=d, minute=minute, stage="ttft", source="engine", pool="prefill")
        ThroughputRollup.objects.create(deployment=d, minute=minute, requests=1)
    assert rollups_prune(now=now, keep_days=14) == 2
    assert StageRollup.objects.count() == 1 and ThroughputRollup.objects.count() == 1


def test_plan_api(member, api):
    api.force_authenticate(member)
    r = api.post("/api/v1/plans/", {"spec": spec_input(), "model_facts": LLAMA_8B}, format="json")
    assert r.status_code == 200 and r.json()["kv_bytes_per_request"] == 134_217_728
    assert r.json()["arithmetic"]
    r = api.post("/api/v1/plans/", {"spec": spec_input()}, format="json")
    assert r.status_code == 400 and "model_facts" in r.json()["errors"]
    api.force_authenticate(None)
    assert api.post("/api/v1/plans/", {"spec": spec_input()}, format="json").status_code in (401, 403)


def test_a_plan_for_a_cluster_costs_at_that_cluster_s_own_prices(member, team, cluster, api):
    cluster.config = {**cluster.config, "prices": {"g6e.12xlarge": 8.0}}  # the cluster's reserved price
    cluster.save()
    api.force_authenticate(member)
    body = {"spec": spec_input(), "model_facts": LLAMA_8B}
    assert api.post("/api/v1/plans/", body, format="json").json()["hourly_usd"] == 20.986  # no cluster: on-demand
    p = api.post("/api/v1/plans/", {**body, "team": team.slug, "cluster": cluster.name}, format="json").json()
    assert (p["hourly_usd"], p["pools"]["prefill"]["hourly_usd"]) == (16.0, 8.0)
