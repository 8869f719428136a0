"""The conformance suite against a loopback upstream that breaks each rule once; and a recorded run for a
deployment through it (service key, PD health, the stored result, the reconcile pass it asks for, API)."""
import pytest

import datetime as dt

from django.utils import timezone

from deployments.conditions import condition_set
from deployments.models import ApiKey, Event
from deployments.services.credentials import credential_check
from deployments.services.status import RECONCILE_TASK, deployment_observe
from deployments.spec import spec_parse
from observability.conformance.runner import conformance_run_for_deployment, conformance_runs_prune
from observability.models import ConformanceRun
from observability.conformance.suite import CHECK_NAMES, conformance_run
from tests.factories import ClusterFactory, DeploymentFactory, local_spec_input
from tests.observability.helpers import as_application_of, fixture
from tests.observability.mock_openai import FAULTS, MODEL, MockUpstream
from tests.support.broker import queued


def run(faults=()):
    with MockUpstream(faults) as m:
        return conformance_run(base_url=m.base_url, api_key="sk-test", model=MODEL)


def test_a_conforming_upstream_passes_every_check():
    results = run()
    assert [r.name for r in results] == list(CHECK_NAMES)
    assert [r.name for r in results if not r.passed] == []


# Faults whose breakage necessarily shows in more than one check (the same wrong number or index is reused).
ALSO_FAILS = {"bad_usage_total": {"completions_nonstream", "include_usage"},
              "n_index": {"stream_finish_reason_once"}}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_each_broken_rule_is_caught(fault):
    failed = {r.name: r.evidence for r in run([fault]) if not r.passed}
    assert FAULTS[fault] in failed, f"{fault} went unnoticed"
    assert set(failed) == {FAULTS[fault]} | ALSO_FAILS.get(fault, set())
    assert failed[FAULTS[fault]]  # evidence says what was seen


def test_an_unreachable_endpoint_fails_every_check_with_the_error():
    results = conformance_run(base_url="http://127.0.0.1:9/v1", api_key="k", model=MODEL, timeout=2)
    assert {r.name for r in results} == set(CHECK_NAMES) and not any(r.passed for r in results)
    assert "Connect" in results[0].evidence


@pytest.fixture
def ray_deployment(team):
    def make(upstream: MockUpstream | str):
        """`upstream` serves the metrics (its fixture scrapes become this deployment's), or is a metrics URL."""
        metrics_url = upstream if isinstance(upstream, str) else upstream.metrics_url
        cluster = ClusterFactory(kind="ray", config={"dashboard_url": "http://127.0.0.1:8265",
                                                     "metrics_url": metrics_url})
        d = DeploymentFactory(team=team, cluster=cluster, status="running",
                              spec=spec_parse(local_spec_input(), target_kind="ray").to_dict())
        # As the reconciler leaves it: Serve answers, users wait for this run.
        deployment_observe(deployment_id=d.pk, conditions=condition_set(
            [], type="EndpointReady", status=False, reason="ConformancePending", generation=d.generation,
            now=timezone.now()))
        d.refresh_from_db()
        if not isinstance(upstream, str):
            upstream.metrics_bodies[:] = [as_application_of(b, d) for b in upstream.metrics_bodies]
        return d
    return make


def test_run_for_deployment_records_checks_and_health_and_asks_for_a_reconcile_pass(
        ray_deployment, redis_client, django_capture_on_commit_callbacks):
    with MockUpstream(metrics_bodies=[fixture("pd-before.prom"), fixture("pd-after.prom")]) as m:
        d = ray_deployment(m)
        with django_capture_on_commit_callbacks(execute=True):
            run_ = conformance_run_for_deployment(deployment_id=d.pk, gateway_base_url=m.base_url)
    assert run_.passed and run_.checks.count() == len(CHECK_NAMES) and run_.generation == d.generation
    assert run_.pd_health["verdict"] == "healthy" and run_.pd_health["nixl_bytes"] == 737_280
    # The runner writes no condition: it records, then asks the reconciler (the one writer) for a pass, on the
    # queue a worker consumes, once the run is committed.
    before = d.conditions
    d.refresh_from_db()
    assert d.status == "running" and d.conditions == before
    assert queued(redis_client, task=RECONCILE_TASK) == [[d.pk]]
    # The suite used a minted, deployment-scoped key that no longer works.
    raw = {k.removeprefix("Bearer ") for k in m.seen_keys if k.startswith("Bearer tdm_")}
    assert len(raw) == 1
    key = ApiKey.objects.get(name="tandem-conformance")
    assert key.revoked_at and not key.all_deployments and list(key.deployments.all()) == [d]
    assert credential_check(model=ApiKey, raw=raw.pop()) is None
    assert Event.objects.filter(deployment=d, kind="conformance_passed").exists()


def test_the_runs_key_is_minted_and_recorded_as_every_key_is(ray_deployment):
    """Tandem's own key goes through the key service: the audit trail records it as it records anyone's key
    (name, id, last four, owner, expiry), on the deployment it was for."""
    with MockUpstream(metrics_bodies=[fixture("pd-before.prom"), fixture("pd-after.prom")]) as m:
        d = ray_deployment(m)
        started = timezone.now()
        conformance_run_for_deployment(deployment_id=d.pk, gateway_base_url=m.base_url)
    key = ApiKey.objects.get(name="tandem-conformance")
    assert key.is_service and key.owner is None and key.created_by is None
    assert started + dt.timedelta(minutes=14) < key.expires_at <= timezone.now() + dt.timedelta(minutes=15)
    created = Event.objects.get(kind="api_key_created")
    assert created.deployment == d and created.actor is None and created.message == "Service key for a conformance run."
    assert created.after == {"name": "tandem-conformance", "key_id": key.key_id, "last4": key.last4, "owner": None,
                             "expires_at": key.expires_at.isoformat()}


def test_a_failing_check_leaves_the_deployment_running_with_a_warning(ray_deployment, api, member):
    with MockUpstream(["unknown_model_detail"], metrics_bodies=[fixture("pd-before.prom"),
                                                                fixture("decode-only-after.prom")]) as m:
        d = ray_deployment(m)
        run_ = conformance_run_for_deployment(deployment_id=d.pk, gateway_base_url=m.base_url)
    assert not run_.passed and run_.pd_health["verdict"] == "decode_only"
    d.refresh_from_db()
    assert d.status == "running"
    warning = Event.objects.get(deployment=d, kind="conformance_warning")
    assert "error_unknown_model" in warning.message and "decode-only" in warning.message

    api.force_authenticate(member)
    body = api.get(f"/api/v1/deployments/{d.pk}/conformance/").json()
    assert body["run"]["passed"] is False
    assert {c["name"]: c["passed"] for c in body["run"]["checks"]}["error_unknown_model"] is False
    assert body["run"]["pd_health"]["verdict"] == "decode_only"


def test_an_unreadable_metrics_url_is_not_shown_to_members(ray_deployment, api, member):
    with MockUpstream() as m:
        d = ray_deployment("http://127.0.0.1:9/metrics")
        conformance_run_for_deployment(deployment_id=d.pk, gateway_base_url=m.base_url)
    api.force_authenticate(member)
    health = api.get(f"/api/v1/deployments/{d.pk}/conformance/").json()["run"]["pd_health"]
    assert health["verdict"] == "unknown" and "127.0.0.1:9" not in str(health)
    assert f"[an address on cluster {d.cluster.name}]" in health["messages"][0]


def test_conformance_api_is_for_the_team_only(ray_deployment, api):
    from tests.factories import UserFactory

    d = ray_deployment("http://127.0.0.1:9/metrics")
    api.force_authenticate(UserFactory())
    assert api.get(f"/api/v1/deployments/{d.pk}/conformance/").status_code == 404


def test_old_runs_are_pruned_but_each_deployments_latest_stays(ray_deployment):
    a, b = ray_deployment("http://127.0.0.1:9/metrics"), ray_deployment("http://127.0.0.1:9/metrics")
    now = timezone.now()

    def at(d, days):
        return ConformanceRun.objects.create(deployment=d, started_at=now - dt.timedelta(days=days),
                                             base_url="http://gw/v1", model=MODEL).pk

    old_a, latest_a, recent_b, only_old_b = at(a, 45), at(a, 40), at(b, 2), at(b, 50)
    assert conformance_runs_prune(now=now, keep_days=30) == 2
    assert set(ConformanceRun.objects.values_list("pk", flat=True)) == {latest_a, recent_b}
    assert not {old_a, only_old_b} & set(ConformanceRun.objects.values_list("pk", flat=True))
