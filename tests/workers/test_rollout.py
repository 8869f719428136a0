"""Side-by-side rollouts driven by real reconcile passes against the stand-in Serve REST API (the `ray` target's
dashboard over real HTTP, tests/support/ray_dashboard.py): the new generation comes up beside the old with one
extra replica per pool, is checked, takes the spec's steps of traffic judged by the gateway's request records,
and ends serving alone, or rolls back and leaves the old generation serving."""

import time

import pytest
from django.utils import timezone

from deployments.lifecycle import Status
from deployments.models import Cluster, Deployment, Membership, Rollout
from deployments.services import actions
from deployments.serve_config import ray_nixl_ports
from deployments.services.rollouts import rollout_abort, rollout_active
from deployments.spec import spec_parse
from observability.models import ConformanceRun
from tests.factories import MODEL_SOURCES, ClusterFactory, DeploymentFactory, MembershipFactory, TeamFactory, local_spec_input
from tests.support.processes import wait_for
from tests.support.ray_dashboard import TEST_TOKEN as RAY_TOKEN
from usage.models import RequestRecord
from workers.pipeline import reconcile_pass

OLD, NEW = "s3://models/tiny-a", "s3://models/tiny-b"
FAST = {"step_seconds": 5}


@pytest.fixture
def running(db, dashboard, monkeypatch, settings, redis_client):
    """A deployment serving generation 1 on the stand-in Serve, its conformance run passed."""
    settings.TANDEM_ROLLOUT_DRAIN_SECONDS = 0
    monkeypatch.setenv("TANDEM_CLUSTER_TEST_RAY_TOKEN", RAY_TOKEN)
    cluster = ClusterFactory(name="local", kind=Cluster.Kind.RAY, secret_ref="env:TANDEM_CLUSTER_TEST_RAY_TOKEN",
                             config={"dashboard_url": dashboard.url, "serve_url": dashboard.url,
                                     "model_sources": MODEL_SOURCES})
    spec = spec_parse(local_spec_input(model={"id": "tiny", "source": OLD}, rollout=FAST), target_kind="ray")
    team = TeamFactory(slug="ml")
    d = DeploymentFactory(team=team, cluster=cluster, name="tiny", spec=spec.to_dict(), status=Status.APPROVED)
    wait_for(lambda: reconcile_pass(d.pk) is None and _row(d).status == Status.RUNNING, timeout=20, what="running")
    ConformanceRun.objects.create(deployment=d, generation=1, passed=True, started_at=timezone.now(),
                                  base_url="http://gw/v1", model="tiny")
    reconcile_pass(d.pk)
    return _row(d)


def _row(d) -> Deployment:
    return Deployment.objects.get(pk=d.pk)


def _admin(d):
    return MembershipFactory(team=d.team, role=Membership.Role.ADMIN).user


def _update(d, **changes) -> Deployment:
    """Its requester proposes the change, an admin approves it: the deployment is updating at generation 2."""
    actions.deployment_update(actor=d.requested_by, deployment=d, spec=local_spec_input(**changes))
    d = _row(d)
    if d.proposed_spec is not None:
        actions.deployment_approve(actor=_admin(d), deployment=d, generation=d.generation,
                                   proposed_hash=d.proposed_spec_hash)
    return _row(d)


def _apps(dashboard, d) -> dict[str, dict]:
    """This deployment's applications on Serve, by name, with each pool's replicas (min = max while rolling)."""
    out = {}
    for name, app in dashboard.details()["applications"].items():
        if name.startswith(f"tdm-{d.pk}-") and app["status"] != "DELETING":
            args = app["deployed_app_config"]["args"]
            out[name] = {stage: args[f"{stage}_config"]["deployment_config"]["autoscaling_config"]["min_replicas"]
                         for stage in ("prefill", "decode")}
    return out


def _nixl_ports(dashboard, name: str) -> list[int]:
    """The NIXL side-channel ports an application's engines bind."""
    args = dashboard.details()["applications"][name]["deployed_app_config"]["args"]
    return _port_spans(args[f"{stage}_config"]["experimental_configs"]["NIXL_SIDE_CHANNEL_PORT_BASE"]
                       for stage in ("prefill", "decode"))


def _port_spans(bases) -> list[int]:
    """Each stage's base port and the 50 after it (half of a stage's block)."""
    return [port for base in bases for port in range(base, base + 50)]


def _traffic(d, generation: int, *, n: int = 8, ttft_ms: float = 40.0, status: int = 200):
    """What the gateway records for requests a generation served now."""
    now = timezone.now()
    RequestRecord.objects.bulk_create(RequestRecord(
        request_id=f"req-{d.pk}-{generation}-{time.monotonic_ns()}-{i}", deployment_id=d.pk, generation=generation,
        created_at=now, endpoint="chat.completions", stream=True, status_code=status, ttft_ms=ttft_ms, e2e_ms=200.0)
        for i in range(n))


def _passes_until(d, what: str, check, *, timeout: float = 30, dashboard=None, seen=None):
    """Reconcile passes until `check(row, rollout)`; records the applications seen after each pass."""
    def one():
        reconcile_pass(d.pk)
        if dashboard is not None and seen is not None:
            seen.append(_apps(dashboard, d))
        row = _row(d)
        return check(row, row.rollouts.first())
    try:
        wait_for(one, timeout=timeout, every=0.1, what=what)
    except AssertionError:
        r = _row(d).rollouts.first()
        print("rollout at timeout:", _row(d).status, r.state, r.weight, r.step, r.replicas, r.steps_log, r.reason,
              list(_row(d).events.values_list("kind", "message"))[-8:])
        raise
    return _row(d)


def test_new_weights_come_up_beside_the_old_take_each_step_and_end_serving_alone(running, dashboard):
    d = _update(running, model={"id": "tiny", "source": NEW}, rollout=FAST)
    r = rollout_active(d)
    assert (d.status, d.generation, r.mode) == (Status.UPDATING, 2, Rollout.Mode.SIDE_BY_SIDE)
    assert r.verdict["compatible"] is False
    assert any("model.source changed" in reason for reason in r.verdict["reasons"])

    seen = []
    d = _passes_until(d, "the new generation to be checked", lambda row, r: r.state == "checking",
                      dashboard=dashboard, seen=seen)
    assert _apps(dashboard, d) == {f"tdm-{d.pk}-tiny": {"prefill": 1, "decode": 1},
                                   f"tdm-{d.pk}-tiny-g2": {"prefill": 1, "decode": 1}}
    assert d.next_endpoint_url == f"{dashboard.url}/d/{d.pk}/g2" and d.next_weight == 0
    # The two generations' engines may share a node: each binds its own NIXL ports.
    old_ports, new_ports = (_nixl_ports(dashboard, name) for name in (f"tdm-{d.pk}-tiny", f"tdm-{d.pk}-tiny-g2"))
    assert not set(old_ports) & set(new_ports), (old_ports, new_ports)
    assert d.endpoint_url == f"{dashboard.url}/d/{d.pk}" and d.endpoint_generation == 1

    ConformanceRun.objects.create(deployment=d, generation=2, passed=True, started_at=timezone.now(),
                                  base_url="http://gw/v1", model="tiny")
    for weight in (10, 50, 100):
        d = _passes_until(d, f"{weight}%", lambda row, r, w=weight: row.next_weight == w or row.status == "running",
                          dashboard=dashboard, seen=seen)
        assert d.next_weight == weight and d.status == Status.UPDATING
        _traffic(d, 1)
        _traffic(d, 2)
    d = _passes_until(d, "done", lambda row, r: row.status == "running", dashboard=dashboard, seen=seen,
                      timeout=40)

    r = d.rollouts.first()
    assert (r.state, r.weight, r.peak_surge) == ("done", 100, {"prefill": 1, "decode": 1})
    assert [e["weight"] for e in r.steps_log] == [10, 50, 100] and all(e["ok"] for e in r.steps_log)
    assert (d.endpoint_url, d.endpoint_generation, d.app_generation) == (f"{dashboard.url}/d/{d.pk}/g2", 2, 2)
    assert (d.next_endpoint_url, d.next_generation, d.next_weight) == ("", None, 0)
    wait_for(lambda: list(_apps(dashboard, d)) == [f"tdm-{d.pk}-tiny-g2"], timeout=5, what="the old app gone")
    assert _nixl_ports(dashboard, f"tdm-{d.pk}-tiny-g2") == new_ports  # it keeps its ports once it serves alone
    # Never a second full set: at most one replica per pool beyond the spec's, after every pass.
    assert max(sum(app["prefill"] for app in apps.values()) for apps in seen) == 2
    assert max(sum(app["decode"] for app in apps.values()) for apps in seen) == 2
    steps = list(d.events.filter(kind="rollout_step").order_by("created_at", "id").values_list("after__weight", flat=True))
    assert steps == [0, 10, 50, 100]
    assert d.events.filter(kind="rollout_done").count() == 1
    # A later pass sees what the row says serve: nothing drifted, nothing re-applied.
    applied = d.events.filter(kind="applied").count()
    reconcile_pass(d.pk)
    assert (_row(d).status, d.events.filter(kind="applied").count()) == (Status.RUNNING, applied)


def _checked(d, *, passed=True):
    ConformanceRun.objects.create(deployment=d, generation=2, passed=passed, started_at=timezone.now(),
                                  base_url="http://gw/v1", model="tiny", summary="5/6 checks passed; failed: "
                                  "stream_shape." if not passed else "6/6 checks passed.")


def _rolled_back(d, dashboard) -> Deployment:
    d = _passes_until(d, "rolled back", lambda row, r: row.status == "running", timeout=40)
    r = d.rollouts.first()
    assert r.state == "rolled_back"
    assert _apps(dashboard, d) == {f"tdm-{d.pk}-tiny": {"prefill": 1, "decode": 1}}
    assert (d.endpoint_url, d.endpoint_generation) == (f"{dashboard.url}/d/{d.pk}", 1)
    assert (d.next_endpoint_url, d.next_generation, d.next_weight) == ("", None, 0)
    assert d.spec_typed.model_source == OLD and d.generation == 3  # the old spec again, generations count up
    assert d.conditions and next(c for c in d.conditions if c["type"] == "EndpointReady")["status"] == "True"
    return d


def test_a_new_generation_that_fails_its_conformance_run_rolls_back_before_any_user_reaches_it(running, dashboard):
    d = _update(running, model={"id": "tiny", "source": NEW}, rollout=FAST)
    d = _passes_until(d, "checking", lambda row, r: r.state == "checking")
    _checked(d, passed=False)
    d = _rolled_back(d, dashboard)
    event = d.events.get(kind="rollout_rolled_back")
    assert "failed its conformance run: 5/6 checks passed; failed: stream_shape." in event.message
    assert not d.rollouts.first().steps_log  # no step was taken: no user request went to it


def test_a_new_generation_slower_than_the_spec_allows_rolls_back_with_the_evidence(running, dashboard):
    d = _update(running, model={"id": "tiny", "source": NEW}, rollout={**FAST, "max_ttft_ratio": 1.5})
    d = _passes_until(d, "checking", lambda row, r: r.state == "checking")
    _checked(d)
    d = _passes_until(d, "10%", lambda row, r: row.next_weight == 10)
    _traffic(d, 1, ttft_ms=40.0)
    _traffic(d, 2, ttft_ms=130.0)
    d = _rolled_back(d, dashboard)
    r = d.rollouts.first()
    [entry] = r.steps_log
    assert (entry["weight"], entry["ok"]) == (10, False)
    assert (entry["old"]["ttft_p50_ms"], entry["new"]["ttft_p50_ms"]) == (40.0, 130.0)
    assert "median time to first token 130 ms against 40 ms (allowed ×1.5)" in r.reason


def test_an_admin_aborts_a_rollout_and_every_request_goes_back(running, dashboard):
    d = _update(running, model={"id": "tiny", "source": NEW}, rollout=FAST)
    d = _passes_until(d, "checking", lambda row, r: r.state == "checking")
    _checked(d)
    d = _passes_until(d, "10%", lambda row, r: row.next_weight == 10)
    rollout_abort(actor=_admin(d), rollout=rollout_active(d), reason="wrong tokenizer")
    reconcile_pass(d.pk)
    assert _row(d).next_weight == 0  # at once, before the new application goes
    d = _rolled_back(d, dashboard)
    assert "Aborted by" in d.rollouts.first().reason and "wrong tokenizer" in d.rollouts.first().reason


def test_a_change_that_leaves_the_kv_layout_alone_rolls_in_place(running, dashboard):
    d = _update(running, model={"id": "tiny", "source": OLD}, engine={"max_model_len": 256, "dtype": "bfloat16"},
                rollout=FAST)
    r = rollout_active(d)
    assert r.mode == Rollout.Mode.IN_PLACE and r.verdict == {"compatible": True, "reasons": []}
    d = _passes_until(d, "running", lambda row, r: row.status == "running")
    assert d.rollouts.first().state == "done"
    assert list(_apps(dashboard, d)) == [f"tdm-{d.pk}-tiny"]


def test_an_update_while_one_rolls_out_is_refused_naming_it(running, dashboard):
    d = _update(running, model={"id": "tiny", "source": NEW}, rollout=FAST)
    from deployments.errors import Conflict
    with pytest.raises(Conflict, match="Generation 2 is still rolling out"):
        _update(d, model={"id": "tiny", "source": OLD}, engine={"max_model_len": 256, "dtype": "bfloat16"},
                rollout=FAST)


def test_pausing_during_a_rollout_ends_it_and_removes_both_generations(running, dashboard):
    d = _update(running, model={"id": "tiny", "source": NEW}, rollout=FAST)
    d = _passes_until(d, "checking", lambda row, r: r.state == "checking")
    assert len(_apps(dashboard, d)) == 2
    from deployments.services.pause import deployment_pause
    deployment_pause(actor=_admin(d), deployment=d)
    d = _passes_until(d, "paused", lambda row, r: row.status == "paused", timeout=20)
    assert d.rollouts.first().state == "aborted"
    assert _apps(dashboard, d) == {}



def test_a_second_rollout_binds_the_half_of_the_ports_the_first_one_freed(running, dashboard):
    """Generation 2 takes the other half of the deployment's NIXL ports from generation 1 and keeps it once it
    serves alone; generation 3, beside it, takes the first half back. Halves follow the serving application, not
    the generations' numbers (0 and 2 have one parity: the local stack's engines failed to bind on that)."""
    d = _update(running, model={"id": "tiny", "source": NEW}, rollout={**FAST, "steps": [100]})
    d = _passes_until(d, "checking", lambda row, r: r.state == "checking")
    _checked(d)
    d = _passes_until(d, "done", lambda row, r: row.status == "running", timeout=40)
    assert list(_apps(dashboard, d)) == [f"tdm-{d.pk}-tiny-g2"]

    d = _update(d, model={"id": "tiny", "source": OLD}, rollout=FAST)
    d = _passes_until(d, "checking", lambda row, r: r.state == "checking")
    assert sorted(_apps(dashboard, d)) == [f"tdm-{d.pk}-tiny-g2", f"tdm-{d.pk}-tiny-g3"]
    serving, new = (set(_nixl_ports(dashboard, f"tdm-{d.pk}-tiny-{g}")) for g in ("g2", "g3"))
    assert not serving & new
    assert new == set(_port_spans(ray_nixl_ports(deployment_id=d.pk).values()))  # the first generation's half
