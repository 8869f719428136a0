"""A decode whose KV reads from prefill all fail (as when it keeps a restarted prefill's NIXL peer) is restarted by
the reconciler, once, and the deployment says what happened and how long recovery took. Passes run in-process on
the `ray` target against the stand-in Ray dashboard over real HTTP; the scraper reads metrics from a real local PD
stack's scrape (tests/observability/fixtures) over real HTTP."""
import json

import httpx
import pytest
from django.utils import timezone

from deployments.conditions import condition_get
from deployments.event_kinds import EventKind
from deployments.lifecycle import Status
from deployments.models import Cluster, Deployment, Event
from deployments.spec import spec_parse
from observability.models import ScrapeState
from observability.scraper import scrape_deployment
from tests.factories import ClusterFactory, DeploymentFactory, TeamFactory, local_spec_input
from tests.observability.helpers import as_application_of, fixture
from tests.observability.mock_openai import MockUpstream
from tests.observability.test_pd_health import with_failed_reads
from tests.support.processes import wait_for
from tests.support.ray_dashboard import TEST_TOKEN as RAY_TOKEN
from workers.pipeline import reconcile_pass
from workers.targets.ray import RESTART_ENV



@pytest.fixture
def metrics():
    with MockUpstream() as upstream:
        yield upstream


@pytest.fixture
def serving(db, redis_client, dashboard, metrics, monkeypatch, tmp_path) -> Deployment:
    """A deployment of the tiny model that serves on the stand-in Ray cluster, its metrics at `metrics`."""
    monkeypatch.setenv("TANDEM_CLUSTER_TEST_RAY_TOKEN", RAY_TOKEN)
    model = tmp_path / "models" / "tiny-llama"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 2048}))
    cluster = ClusterFactory(name="local", kind=Cluster.Kind.RAY, secret_ref="env:TANDEM_CLUSTER_TEST_RAY_TOKEN",
                             config={"dashboard_url": dashboard.url, "serve_url": dashboard.url,
                                     "metrics_url": metrics.metrics_url,
                                     "model_sources": {"paths": [str(tmp_path / "models")]}})
    spec = spec_parse(local_spec_input(model={"id": "tiny-llama", "source": str(model)}), target_kind="ray").to_dict()
    d = DeploymentFactory(team=TeamFactory(slug="ml"), cluster=cluster, name="tiny", spec=spec,
                          status=Status.APPROVED)
    wait_for(lambda: reconcile_pass(d.pk) is None and _row(d).status == Status.RUNNING, timeout=30, what="running")
    return _row(d)


def _row(d) -> Deployment:
    return Deployment.objects.get(pk=d.pk)


def _scrape(d, metrics, text: str) -> ScrapeState:
    metrics.metrics_bodies[:] = [as_application_of(text, d)]
    with httpx.Client(timeout=10) as client:
        assert scrape_deployment(deployment_id=d.pk, client=client, now=timezone.now())["ok"]
    return ScrapeState.objects.get(deployment=d)


def _decode_env(dashboard, d) -> dict:
    app = dashboard.details()["applications"][f"tdm-{d.pk}-tiny"]["deployed_app_config"]
    return {stage: app["args"][f"{stage}_config"].get("runtime_env", {}).get("env_vars", {})
            for stage in ("prefill", "decode")}


def _kv(d) -> dict:
    return condition_get(_row(d).conditions, "KvTransfer") or {}


def _settle(d) -> None:
    wait_for(lambda: reconcile_pass(d.pk) is None and condition_get(_row(d).conditions, "ServeRunning")["status"]
             == "True", timeout=30, what="Serve running again")


def test_a_decode_whose_reads_all_fail_is_restarted_once_and_its_recovery_is_timed(
        serving, dashboard, metrics, django_capture_on_commit_callbacks):
    d = serving
    reconcile_pass(d.pk)
    assert _kv(d)["status"] == "True" and _kv(d)["reason"] == "NoFailedReads"

    before = fixture("pd-before.prom")  # the recorded scrape with its counts at zero
    _scrape(d, metrics, before)
    with django_capture_on_commit_callbacks() as asked:
        state = _scrape(d, metrics, with_failed_reads(before, 3))
    assert state.kv_failing_since is not None and state.kv_reads["state"] == "failing"
    assert len(asked) == 1  # the scraper asked for a pass, which acts now rather than at the next resync

    reconcile_pass(d.pk)
    env = _decode_env(dashboard, d)
    assert RESTART_ENV in env["decode"] and RESTART_ENV not in env["prefill"]
    assert _kv(d)["status"] == "False" and _kv(d)["reason"] == "DecodeRestarted"
    restarted = Event.objects.get(deployment=d, kind=EventKind.DECODE_RESTARTED)
    assert "Every KV read of the decode from prefill has failed" in restarted.message and "(3 in" in restarted.message
    assert f"replacing the replicas of tdm-{d.pk}-tiny to restart its decode" in restarted.message

    # Serve rolls the decode (DEPLOYING, then RUNNING): the deployment keeps serving, and says when Serve is back.
    _settle(d)
    assert _row(d).status == Status.RUNNING
    assert Event.objects.filter(deployment=d, kind=EventKind.SERVE_RECOVERED).count() == 1
    # Still failing in the same spell: no second restart.
    stamp = _decode_env(dashboard, d)["decode"][RESTART_ENV]
    reconcile_pass(d.pk)
    assert _decode_env(dashboard, d)["decode"][RESTART_ENV] == stamp
    assert Event.objects.filter(deployment=d, kind=EventKind.DECODE_RESTARTED).count() == 1

    # The new decode reads KV again (the recorded scrape's 9 transfers, no new failure).
    with django_capture_on_commit_callbacks() as asked:
        state = _scrape(d, metrics, with_failed_reads(fixture("pd-after.prom"), 3))
    assert state.kv_failing_since is None and state.kv_reads["state"] == "moving" and len(asked) == 1
    reconcile_pass(d.pk)
    assert _kv(d)["status"] == "True" and _kv(d)["reason"] == "Recovered"
    recovered = Event.objects.get(deployment=d, kind=EventKind.KV_RECOVERED)
    assert recovered.duration_ms is not None and "s after its reads were seen failing" in recovered.message


def test_reads_that_fail_beside_reads_that_succeed_restart_nothing(serving, dashboard, metrics):
    d = serving
    _scrape(d, metrics, fixture("pd-before.prom"))
    state = _scrape(d, metrics, with_failed_reads(fixture("pd-after.prom"), 1))
    assert state.kv_reads["state"] == "mixed" and state.kv_failing_since is None
    reconcile_pass(d.pk)
    assert RESTART_ENV not in _decode_env(dashboard, d)["decode"]
    assert _kv(d)["status"] == "True"


def test_a_prefill_restart_that_vllm_recovers_from_by_itself_restarts_nothing(serving, dashboard, metrics):
    """The scrapes recorded around a real SIGKILL of the prefill (tests/observability/fixtures/cut_restart.py)."""
    d = serving
    for name in ("prefill-restart-before.prom", "prefill-restart-after.prom"):
        state = _scrape(d, metrics, fixture(name).replace("tdm-1-tiny-llama", f"tdm-{d.pk}-tiny"))
    assert state.kv_reads == {"state": "moving", "failed": 0.0, "transfers": 25}
    reconcile_pass(d.pk)
    assert RESTART_ENV not in _decode_env(dashboard, d)["decode"]
    assert _kv(d)["reason"] == "NoFailedReads"
